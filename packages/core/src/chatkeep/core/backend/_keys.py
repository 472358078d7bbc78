"""Hashed keys: ids an engine cannot take as they are (length limits, collations, paths) as fixed-size digests."""

from __future__ import annotations

import hashlib

__all__ = ["hashed_key", "length_prefixed"]


def length_prefixed(*parts: str) -> bytes:
    """The parts' UTF-8 bytes, each after its length (4 bytes, big-endian): ``("a:b", "c")`` and ``("a", "b:c")``
    give different bytes, whatever characters the ids hold. Lone surrogates are kept (``surrogatepass``)."""
    out = bytearray()
    for part in parts:
        raw = part.encode("utf-8", "surrogatepass")
        out += len(raw).to_bytes(4, "big") + raw
    return bytes(out)


def hashed_key(*parts: str, domain: bytes = b"") -> bytes:
    """The SHA-256 of ``domain`` then the :func:`length_prefixed` parts: one key per distinct tuple of ids.

    ``domain`` keeps keys of different kinds apart (``b"tenant\\x00"``, ``b"session\\x00"``) when they share a space.
    """
    return hashlib.sha256(domain + length_prefixed(*parts)).digest()
