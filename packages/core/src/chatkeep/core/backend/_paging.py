"""Paging ``list_sessions``: the cursor (the fields a backend needs to resume a page, as an opaque URL-safe string),
and the walk through a tenant's pages that the base class's derived hooks share (:func:`listed_sessions`)."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from chatkeep.core._errors import DamagedListingError

if TYPE_CHECKING:
    from chatkeep.core.backend._hooks import StoreHooks
    from chatkeep.core.backend._sessions import SessionInfo, SessionPage

__all__ = ["decode_cursor", "encode_cursor", "listed_sessions"]

#: Sessions listed per ``_list_sessions`` call by :func:`listed_sessions`.
PAGE = 500


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


async def listed_sessions(store: StoreHooks, tenant: str, *, past_damage: bool = False) -> AsyncIterator[SessionInfo]:
    """Every session of ``tenant``, newest first, read a page at a time from the store's ``_list_sessions`` hook.

    Args:
        store: the store whose hook is called (with checked arguments, as the base class would).
        tenant: the tenant to walk.
        past_damage: go on past entries that name no session (:class:`DamagedListingError`), with the rest of
            each page; else such an entry stops the walk with that error.
    """
    cursor: str | None = None
    while True:
        page: SessionPage
        try:
            page = await store._list_sessions(tenant, PAGE, cursor)
        except DamagedListingError as exc:
            if not past_damage or exc.page is None:
                raise
            page = exc.page
        for info in page.items:
            yield info
        if page.next_cursor is None:
            return
        cursor = page.next_cursor
