"""HistoryStore's default ``_session_info`` (a walk of ``_list_sessions``' pages), on memory's storage.

A plugin written before ``session_info`` existed gets it from the base class: correct, at a cost that grows with
the tenant's sessions. The kit's listing and info tests run on it here; every bundled backend overrides it.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from chatkeep.core import DamagedListingError, HistoryStore, Message, SessionKey, SessionPage
from chatkeep.memory import MemoryHistoryStore
from chatkeep.testing import InfoConformance, ListingConformance, StoreFactory


class _DefaultSessionInfo(MemoryHistoryStore):
    """Memory's storage with the base's ``_session_info``, as a plugin that predates it has."""

    _session_info = HistoryStore._session_info


class TestDefaultSessionInfo(ListingConformance, InfoConformance):
    native_ttl = True
    multi_process = False

    @pytest.fixture
    def make_store(self) -> StoreFactory:
        namespace = f"session-info-default-{uuid.uuid4().hex}"

        def make(**options: Any) -> HistoryStore:
            return _DefaultSessionInfo(namespace=namespace, **options)

        return make


async def test_the_default_finds_a_session_pages_down_the_listing() -> None:
    store = _DefaultSessionInfo(f"memory://session-info-pages-{uuid.uuid4().hex}")
    keys = [SessionKey("t", f"s{n}") for n in range(1_203)]  # the oldest is on the third page of 500
    for key in keys:
        await store.append(key, [Message(role="user", text="hi")])
    await store.update_info(keys[0], title="oldest")
    for key in keys[1:]:
        await store.append(key, [Message(role="user", text="newer")])
    found = await store.session_info(keys[0])
    assert found is not None
    assert (found.title, found.message_count) == ("oldest", 1)
    listed = await store.list_sessions("t", limit=1_500)
    assert listed.items[-1] == found
    assert await store.session_info(SessionKey("t", "none such")) is None
    assert await store.session_info(SessionKey("other", "s0")) is None


async def test_the_default_reads_past_a_damaged_listing_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    store = _DefaultSessionInfo(f"memory://session-info-damage-{uuid.uuid4().hex}")
    key = SessionKey("t", "s")
    await store.append(key, [Message(role="user", text="hi")])
    listed = store._list_sessions

    async def with_damage(tenant: str, limit: int, cursor: str | None) -> SessionPage:
        page = await listed(tenant, limit, cursor)
        raise DamagedListingError("an entry names no session", page=page, entries=("somewhere",))

    monkeypatch.setattr(store, "_list_sessions", with_damage)
    found = await store.session_info(key)
    assert found is not None
    assert found.session_id == "s"
    with pytest.raises(DamagedListingError):
        await store.list_sessions("t")
