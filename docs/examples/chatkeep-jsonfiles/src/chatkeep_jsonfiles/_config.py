"""Parsing ``jsonfiles://`` URLs and options."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlsplit

from pydantic import Field

from chatkeep.core import StoreConfigurationError
from chatkeep.core.backend import Flag, StoreSettings

__all__ = ["JsonFilesSettings", "JsonFilesURLError", "parse_url"]


class JsonFilesURLError(StoreConfigurationError):
    """A ``jsonfiles://`` URL or one of its options is malformed."""


class JsonFilesSettings(StoreSettings):
    """The options of a JSON-files store, in the URL query or as keywords (``max_message_bytes`` is the base's).

    No ``ttl``: files do not expire by themselves (``TTLStoreSettings`` is the base of stores whose engine does).
    """

    store_name = "jsonfiles://"
    store_error = JsonFilesURLError

    fsync: Flag = Field(True, description="flush every write to the disk before it is acknowledged")


def parse_url(url: str, **options: Any) -> tuple[str, JsonFilesSettings]:
    """Read ``jsonfiles:///ABSOLUTE/DIR`` or ``jsonfiles://RELATIVE/DIR``, with ``?fsync=false&max_message_bytes=N``.

    Returns the store's folder, an absolute path (a relative one is resolved against the current directory now,
    so a later ``chdir`` does not move the store), and the options. Keyword options override the query; ``None``
    means "not given".

    Raises:
        JsonFilesURLError: the scheme is not ``jsonfiles``, no folder is named, or an option is unknown or malformed.
    """
    parts = urlsplit(url)
    if parts.scheme.lower() != "jsonfiles" or not url[len(parts.scheme) :].startswith("://"):
        raise JsonFilesURLError(f"{url!r} is not a jsonfiles URL; write jsonfiles:///path/to/dir")
    if parts.fragment:
        raise JsonFilesURLError(f"{url!r} has a fragment (#...); percent-encode a # in the folder's name as %23")
    folder = unquote(parts.netloc + parts.path)
    if not folder:
        raise JsonFilesURLError(f"{url!r} names no folder; write jsonfiles:///path/to/dir or jsonfiles://relative/dir")
    return os.path.abspath(folder), JsonFilesSettings.parse(parts.query, options, url=url)
