"""HistoryStore's default prune and delete_tenant (built on list_sessions and delete), on memory's storage.

The example plugin (docs/examples/chatkeep-jsonfiles) runs the whole kit on the defaults with its own atomic
``_prune_session``; here a store keeps the base's unconditional one, and the kit shows what that costs.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from chatkeep.core import HistoryStore, Message, SessionKey, UnsupportedOperationError
from chatkeep.memory import MemoryHistoryStore
from chatkeep.testing import RetentionConformance, StoreFactory, StoreKit


class _DefaultRetention(MemoryHistoryStore):
    """Memory's storage and _list_tenants, with the base's retention: no _prune, _prune_session or _delete_tenant."""

    _prune = HistoryStore._prune
    _delete_tenant = HistoryStore._delete_tenant


class _NoTenantListing(_DefaultRetention):
    _list_tenants = HistoryStore._list_tenants


class TestDefaultRetention(RetentionConformance):
    native_ttl = True
    multi_process = False

    @pytest.fixture
    def make_store(self) -> StoreFactory:
        namespace = f"retention-defaults-{uuid.uuid4().hex}"

        def make(**options: Any) -> HistoryStore:
            return _DefaultRetention(namespace=namespace, **options)

        return make

    @pytest.mark.xfail(strict=True, reason="the default _prune_session deletes without checking the updated time")
    async def test_prune_spares_a_session_written_after_it_was_listed(
        self, kit: StoreKit, store: HistoryStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        await super().test_prune_spares_a_session_written_after_it_was_listed(kit, store, monkeypatch)


async def test_the_defaults_page_through_more_sessions_than_one_listing_page() -> None:
    store = _DefaultRetention(f"memory://retention-pages-{uuid.uuid4().hex}")
    keys = [SessionKey("t", f"s{n}") for n in range(1_203)]  # two full pages of 500 and a partial one
    for key in keys:
        await store.append(key, [Message(role="user", text="hi")])
    await store.append(SessionKey("other", "kept"), [Message(role="user", text="hi")])
    assert await store.prune(older_than=timedelta(hours=1), tenant="t") == 0
    assert await store.prune(older_than=datetime.now(timezone.utc) + timedelta(seconds=1), tenant="t") == 1_203
    assert (await store.list_sessions("t")).items == []
    for key in keys[:3]:
        await store.append(key, [Message(role="user", text="again")])
    assert await store.delete_tenant("t") == 3
    assert await store.count(SessionKey("other", "kept")) == 1


async def test_prune_of_every_tenant_needs_a_tenant_listing_and_says_so() -> None:
    store = _NoTenantListing(f"memory://retention-tenants-{uuid.uuid4().hex}")
    key = SessionKey("t", "s")
    await store.append(key, [Message(role="user", text="kept")])
    with pytest.raises(UnsupportedOperationError, match=r"_NoTenantListing cannot list its tenants: name them"):
        await store.prune(older_than=timedelta(0))
    with pytest.raises(UnsupportedOperationError, match=r"prune\(older_than=\.\.\., tenant=\.\.\.\)"):
        await store.list_tenants()
    assert await store.count(key) == 1
    assert await store.prune(older_than=datetime.now(timezone.utc) + timedelta(seconds=1), tenant="t") == 1
