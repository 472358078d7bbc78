"""Parsing ``memory://`` URLs and options."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from pydantic import Field

from chatkeep.core import StoreConfigurationError
from chatkeep.core.backend import NonEmptyText, TTLStoreSettings

__all__ = ["DEFAULT_NAMESPACE", "MemorySettings", "MemoryURLError", "parse_url"]

DEFAULT_NAMESPACE = "default"


class MemoryURLError(StoreConfigurationError):
    """A ``memory://`` URL or one of its options is malformed."""


class MemorySettings(TTLStoreSettings):
    """What a ``memory://`` URL and its options select (``max_message_bytes`` and ``ttl`` come with the base).

    ``ttl`` is the seconds an idle session lives (``None``: forever).
    """

    store_name = "memory://"
    store_error = MemoryURLError

    namespace: NonEmptyText = Field(
        DEFAULT_NAMESPACE, description="stores opened on one namespace in a process share their data"
    )


def parse_url(url: str | None, **options: Any) -> MemorySettings:
    """Read ``memory://[NAME][?ttl=SECONDS&max_message_bytes=N]`` (or the bare name ``memory``) and options.

    Keyword options (``namespace``, ``ttl``, ``max_message_bytes``) override the URL; ``None`` means "not given".

    Raises:
        MemoryURLError: the scheme is not ``memory``, or an option is unknown or malformed.
    """
    if url is None or url.lower() == "memory":  # no URL, or the backend's name as open_store("memory") passes it
        url = "memory://"
    parts = urlsplit(url)
    if parts.scheme.lower() != "memory" or not url[len(parts.scheme) :].startswith("://"):
        raise MemoryURLError(f"{url!r} is not a memory URL; write memory:// or memory://NAME")
    if parts.fragment:
        raise MemoryURLError(f"{url!r} has a fragment (#...); remove it")
    settings = MemorySettings.parse(parts.query, options, url=url)
    named = unquote(parts.netloc + parts.path).strip("/")
    if named and "namespace" not in settings.model_fields_set:  # the namespace option wins over the URL's name
        settings = settings.model_copy(update={"namespace": named})
    return settings
