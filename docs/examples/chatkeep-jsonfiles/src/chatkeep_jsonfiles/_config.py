"""Parsing ``jsonfiles://`` URLs and options."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from chatkeep.core import StoreConfigurationError
from chatkeep.core.backend import MAX_MESSAGE_BYTES, OptionSet, StoreOption, boolean

__all__ = ["OPTIONS", "JsonFilesConfig", "JsonFilesURLError", "parse_url"]


class JsonFilesURLError(StoreConfigurationError):
    """A ``jsonfiles://`` URL or one of its options is malformed."""


FSYNC = StoreOption("fsync", boolean, True, "flush every write to the disk before it is acknowledged")
#: The options of a JSON-files store, in the URL query or as keywords. No ``TTL``: files do not expire by themselves.
OPTIONS = OptionSet("jsonfiles://", [MAX_MESSAGE_BYTES, FSYNC], error=JsonFilesURLError)


@dataclass(frozen=True)
class JsonFilesConfig:
    """What a ``jsonfiles://`` URL and its options select.

    Attributes:
        root: the store's folder, an absolute path.
        fsync: whether every write is flushed to the disk before it is acknowledged.
        max_message_bytes: the largest message record accepted, in UTF-8 bytes.
    """

    root: str
    fsync: bool
    max_message_bytes: int


def parse_url(url: str, **options: Any) -> JsonFilesConfig:
    """Read ``jsonfiles:///ABSOLUTE/DIR`` or ``jsonfiles://RELATIVE/DIR``, with ``?fsync=false&max_message_bytes=N``.

    A relative folder is resolved against the current directory now, so a later ``chdir`` does not move the store.
    Keyword options (``fsync``, ``max_message_bytes``) override the query; ``None`` means "not given".

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
    parsed = OPTIONS.parse(parts.query, options, url=url)
    return JsonFilesConfig(os.path.abspath(folder), parsed["fsync"], parsed["max_message_bytes"])
