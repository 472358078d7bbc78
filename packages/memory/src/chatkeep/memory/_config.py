"""Parsing ``memory://`` URLs and options."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from chatkeep.core import DEFAULT_MAX_MESSAGE_BYTES, StoreConfigurationError

__all__ = ["DEFAULT_NAMESPACE", "MemoryConfig", "MemoryURLError", "parse_url"]

DEFAULT_NAMESPACE = "default"
_OPTIONS = ("ttl", "max_message_bytes")


class MemoryURLError(StoreConfigurationError):
    """A ``memory://`` URL or one of its options is malformed."""


@dataclass(frozen=True)
class MemoryConfig:
    """What a ``memory://`` URL and its options select.

    Attributes:
        namespace: stores opened with the same namespace in one process share their data.
        ttl: seconds an idle session lives (``None``: forever).
        max_message_bytes: the largest message record accepted, in UTF-8 bytes.
    """

    namespace: str = DEFAULT_NAMESPACE
    ttl: float | timedelta | None = None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES


def parse_url(url: str, **options: Any) -> MemoryConfig:
    """Read ``memory://[NAME][?ttl=SECONDS&max_message_bytes=N]`` (or the bare name ``memory``).

    Keyword options override the query; ``None`` means "not given".

    Raises:
        MemoryURLError: the scheme is not ``memory``, a query option is unknown or not a number.
        TypeError: an unknown keyword option.
    """
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"memory:// stores take no option {', '.join(unknown)}; the options are {', '.join(_OPTIONS)}")
    if url.lower() == "memory":  # the backend's name, as open_store("memory") passes it
        url = "memory://"
    parts = urlsplit(url)
    if parts.scheme.lower() != "memory" or not url[len(parts.scheme) :].startswith("://"):
        raise MemoryURLError(f"{url!r} is not a memory URL; write memory:// or memory://NAME")
    if parts.fragment:
        raise MemoryURLError(f"{url!r} has a fragment (#...); remove it")
    namespace = unquote(parts.netloc + parts.path).strip("/") or DEFAULT_NAMESPACE
    query: dict[str, Any] = {}
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise MemoryURLError(f"the query of {url!r} is malformed; write ?ttl=SECONDS&max_message_bytes=N") from None
    for name, value in pairs:
        if name not in _OPTIONS:
            raise MemoryURLError(f"memory:// URLs take no query option {name!r}; the options are {', '.join(_OPTIONS)}")
        query[name] = _number(name, value)
    query.update({name: value for name, value in options.items() if value is not None})
    max_bytes = query.get("max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise MemoryURLError(
            f"the memory store option max_message_bytes must be a positive whole number of bytes, got {max_bytes!r}"
        )
    return MemoryConfig(namespace=namespace, ttl=query.get("ttl"), max_message_bytes=max_bytes)


def _number(name: str, text: str) -> float | int:
    try:
        return int(text) if name == "max_message_bytes" else float(text)
    except ValueError:
        kind = "a whole number of bytes" if name == "max_message_bytes" else "a number of seconds"
        raise MemoryURLError(f"the memory:// option {name}={text!r} must be {kind}") from None
