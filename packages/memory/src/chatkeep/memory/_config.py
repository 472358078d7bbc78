"""Parsing ``memory://`` URLs and options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from chatkeep.core import StoreConfigurationError
from chatkeep.core.backend import MAX_MESSAGE_BYTES, TTL, OptionSet, StoreOption, text

__all__ = ["DEFAULT_NAMESPACE", "OPTIONS", "MemoryConfig", "MemoryURLError", "parse_url"]

DEFAULT_NAMESPACE = "default"


class MemoryURLError(StoreConfigurationError):
    """A ``memory://`` URL or one of its options is malformed."""


NAMESPACE = StoreOption("namespace", text, None, "stores opened on one namespace in a process share their data")
#: The options of a memory store (URL query or keywords).
OPTIONS = OptionSet("memory://", [NAMESPACE, TTL, MAX_MESSAGE_BYTES], error=MemoryURLError)


@dataclass(frozen=True)
class MemoryConfig:
    """What a ``memory://`` URL and its options select.

    Attributes:
        namespace: stores opened with the same namespace in one process share their data.
        ttl: seconds an idle session lives (``None``: forever).
        max_message_bytes: the largest message record accepted, in UTF-8 bytes.
    """

    namespace: str
    ttl: float | None
    max_message_bytes: int


def parse_url(url: str | None, **options: Any) -> MemoryConfig:
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
    parsed = OPTIONS.parse(parts.query, options, url=url)
    namespace = parsed["namespace"] or unquote(parts.netloc + parts.path).strip("/") or DEFAULT_NAMESPACE
    return MemoryConfig(namespace=namespace, ttl=parsed["ttl"], max_message_bytes=parsed["max_message_bytes"])
