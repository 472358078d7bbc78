"""The ``list_sessions`` cursor: the fields a backend needs to resume a page, as an opaque URL-safe string."""

from __future__ import annotations

import base64
import binascii
import json

__all__ = ["decode_cursor", "encode_cursor"]


def encode_cursor(*fields: int | str) -> str:
    """A cursor holding ``fields`` (integers and strings, any unicode), for ``SessionPage.next_cursor``."""
    raw = json.dumps(fields, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return base64.urlsafe_b64encode(raw).decode("ascii")


def decode_cursor(cursor: str, *types: type[int] | type[str]) -> tuple[int | str, ...]:
    """The fields of a cursor made by :func:`encode_cursor`, checked against ``types`` in order.

    Raises:
        ValueError: it is not such a cursor (the base class turns this into ``InvalidArgumentError``).
    """
    try:
        fields = json.loads(base64.urlsafe_b64decode(cursor.encode("ascii")).decode("utf-8", "surrogatepass"))
    except (ValueError, UnicodeError, binascii.Error) as exc:
        raise ValueError(f"{cursor!r} is not a list_sessions cursor") from exc
    if (
        not isinstance(fields, list)
        or len(fields) != len(types)
        or not all(type(value) is kind for value, kind in zip(fields, types, strict=False))
    ):
        raise ValueError(f"{cursor!r} is not a list_sessions cursor")
    return tuple(fields)
