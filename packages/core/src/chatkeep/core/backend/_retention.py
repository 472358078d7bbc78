"""The default ``_prune`` and ``_delete_tenant`` of a :class:`~chatkeep.core.backend.HistoryStore`.

Derived from hooks every backend has: they page through ``_list_sessions`` and delete session by session
(``_prune_session``, ``_delete``), so a backend without a cheaper way gets both for free. They rely on the
``list_sessions`` cursor being a position in the listing's order (as :func:`encode_cursor` of the updated time
and the id makes it), not an offset: deleting sessions already listed must not make the next page skip any.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from chatkeep.core.backend._paging import listed_sessions
from chatkeep.core.backend._sessions import SessionKey

if TYPE_CHECKING:
    from chatkeep.core.backend._hooks import StoreHooks

__all__ = ["delete_listed_sessions", "prune_listed_sessions"]


async def prune_listed_sessions(store: StoreHooks, cutoff: datetime, tenant: str | None) -> int:
    """Delete, with ``_prune_session``, each listed session of ``tenant`` (or of every tenant) idle since ``cutoff``.

    A session written after the listing was read moves to the front of the listing and is not seen again; one
    written between its listing and its deletion is spared only if ``_prune_session`` checks its updated time in
    the same step as it deletes (see ``HistoryStore._prune_session``).
    """
    tenants = [tenant] if tenant is not None else await store._list_tenants()
    removed = 0
    for name in tenants:
        async for info in listed_sessions(store, name):
            if info.updated_at < cutoff:
                removed += await store._prune_session(SessionKey(name, info.session_id), cutoff)
    return removed


async def delete_listed_sessions(store: StoreHooks, tenant: str) -> int:
    """Delete, with ``_delete``, every listed session of ``tenant``; a session created meanwhile may stay."""
    removed = 0
    async for info in listed_sessions(store, tenant):
        removed += await store._delete(SessionKey(tenant, info.session_id))
    return removed
