"""Conformance of session documents (versions, owners) and of ``list_sessions`` (order, pages, counts, times) and
``session_info`` (one session's listing entry, read by key)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest

from chatkeep.core import ABSENT, AgentSession, ConcurrencyConflictError, SessionFormatError, SessionOwnershipError
from chatkeep.core.backend import Absent, HistoryStore, SessionKey, SessionPage, StoredSession
from chatkeep.testing.conformance._base import (
    WINDOW_SLACK,
    ConformanceBase,
    DocumentDamager,
    StoreKit,
    make_messages,
)

__all__ = ["ListingConformance", "SessionDocumentConformance"]

# Room for a server clock that is not the test's own (same machine, but rounded or read at another moment).
CLOCK_SLACK = timedelta(seconds=2)
# Between writes whose order list_sessions must show (engines keep at least millisecond timestamps).
TICK = 0.02


def _session(key: SessionKey, **state: object) -> AgentSession:
    return AgentSession(session_id=key.session_id, tenant=key.tenant, state=dict(state))


class SessionDocumentConformance(ConformanceBase):
    """``save_session``/``load_session``: exact round trip, opaque versions, optimistic concurrency, owners."""

    async def test_document_round_trips(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        session = AgentSession(
            session_id=key.session_id,
            tenant=key.tenant,
            service_session_id="resp_123",
            state={"memory": {"facts": ["likes Italian food", "ünïcode 😀"], "n": 3, "ok": True, "none": None}},
        )
        version = await store.save_session(key, session)
        assert isinstance(version, str)
        assert version
        for reader in (store, await kit.open()):
            stored = await reader.load_session(key)
            assert stored == StoredSession(session, version)
            assert isinstance(stored.session, AgentSession)
        assert await store.load_session(kit.key(tenant=key.tenant)) is None

    async def test_a_damaged_document_is_reported_naming_its_session(
        self, kit: StoreKit, store: HistoryStore, damage_session_document: DocumentDamager
    ) -> None:
        key, neighbour = kit.key("s-damaged"), kit.key()
        key = SessionKey(neighbour.tenant, key.session_id)
        for each in (key, neighbour):
            await store.save_session(each, _session(each, n=1))
            await store.append(each, make_messages(2))
        await damage_session_document(store, key)
        for reader in (store, await kit.open()):
            with pytest.raises(SessionFormatError) as caught:
                await reader.load_session(key)
            text = str(caught.value)
            assert f"session 's-damaged' in tenant {key.tenant!r}" in text, text
            assert f"chatkeep sessions delete s-damaged --tenant {key.tenant}" in text, text
            assert (await reader.load_session(neighbour)) is not None, "one damaged document broke another session"
        fresh = await kit.open()
        assert [info.session_id for info in (await fresh.list_sessions(key.tenant)).items].count("s-damaged") == 1
        assert await fresh.delete(key), "the way out the error names does not work"
        assert await fresh.load_session(key) is None

    async def test_stale_version_is_refused(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        first = await store.save_session(key, _session(key, step=1))
        second = await (await kit.open()).save_session(key, _session(key, step=2), expected_version=first)
        assert second != first
        with pytest.raises(ConcurrencyConflictError):
            await store.save_session(key, _session(key, step=3), expected_version=first)
        stored = await (await kit.open()).load_session(key)
        assert stored == StoredSession(_session(key, step=2), second)
        third = await store.save_session(key, _session(key, step=3), expected_version=second)
        assert third not in (first, second)
        unconditional = await store.save_session(key, _session(key, step=4))
        assert await store.load_session(key) == StoredSession(_session(key, step=4), unconditional)

    async def test_expected_version_of_missing_document_conflicts(self, kit: StoreKit, store: HistoryStore) -> None:
        key, elsewhere = kit.key(), kit.key()
        version_elsewhere = await store.save_session(elsewhere, _session(elsewhere))
        for version in ("1", "0", version_elsewhere):
            with pytest.raises(ConcurrencyConflictError):
                await store.save_session(key, _session(key), expected_version=version)
        assert await (await kit.open()).load_session(key) is None

    async def test_versions_are_not_reused_after_delete(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        old = await store.save_session(key, _session(key, life=1))
        await store.delete(key)
        await store.save_session(key, _session(key, life=2))
        # A writer holding the old document's version must not overwrite the new document.
        with pytest.raises(ConcurrencyConflictError):
            await store.save_session(key, _session(key, life=3), expected_version=old)

    async def test_concurrent_savers_exactly_one_wins(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        base = await store.save_session(key, _session(key, writer=None))
        await _exactly_one_wins(kit, key, base)

    async def test_absent_creates_a_new_document(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        version = await store.save_session(key, _session(key, made=1), expected_version=ABSENT)
        assert isinstance(version, str)
        assert version
        assert await (await kit.open()).load_session(key) == StoredSession(_session(key, made=1), version)
        newer = await store.save_session(key, _session(key, made=2), expected_version=version)
        assert newer != version

    async def test_absent_refuses_an_existing_document_and_leaves_it(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        version = await store.save_session(key, _session(key, first=True))
        with pytest.raises(ConcurrencyConflictError, match="already has a document"):
            await (await kit.open()).save_session(key, _session(key, first=False), expected_version=ABSENT)
        assert await (await kit.open()).load_session(key) == StoredSession(_session(key, first=True), version)

    async def test_absent_creates_beside_messages_without_a_document(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        messages = make_messages(3)
        await store.append(key, messages)
        version = await store.save_session(key, _session(key, beside="messages"), expected_version=ABSENT)
        fresh = await kit.open()
        assert await fresh.load_session(key) == StoredSession(_session(key, beside="messages"), version)
        assert [m.message_id for m in await fresh.load(key)] == [m.message_id for m in messages]

    async def test_concurrent_absent_creators_exactly_one_wins(self, kit: StoreKit, store: HistoryStore) -> None:
        await _exactly_one_wins(kit, kit.key(), ABSENT)

    async def test_absent_creates_again_after_delete(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        old = await store.save_session(key, _session(key, life=1), expected_version=ABSENT)
        assert await store.delete(key)
        new = await (await kit.open()).save_session(key, _session(key, life=2), expected_version=ABSENT)
        assert new != old
        assert await store.load_session(key) == StoredSession(_session(key, life=2), new)

    async def test_owner_binding(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        version = await store.save_session(key, _session(key, who="alice"), owner="alice")
        fresh = await kit.open()
        with pytest.raises(SessionOwnershipError):
            await fresh.load_session(key, owner="bob")
        with pytest.raises(SessionOwnershipError):
            await fresh.save_session(key, _session(key, who="bob"), owner="bob")
        with pytest.raises(SessionOwnershipError):
            await fresh.save_session(key, _session(key, who="bob"), owner="bob", expected_version=version)
        assert await fresh.load_session(key, owner="alice") == StoredSession(_session(key, who="alice"), version)
        # Without an owner the caller asserts none (a trusted server-side call): the document is returned.
        assert await fresh.load_session(key) == StoredSession(_session(key, who="alice"), version)
        newer = await fresh.save_session(key, _session(key, who="alice", n=2), owner="alice", expected_version=version)
        with pytest.raises(SessionOwnershipError):
            await store.load_session(key, owner="bob")
        assert await store.load_session(key, owner="alice") == StoredSession(_session(key, who="alice", n=2), newer)


async def _exactly_one_wins(kit: StoreKit, key: SessionKey, expected_version: str | Absent, savers: int = 8) -> None:
    """``savers`` stores save other documents at once with one ``expected_version``: one wins, its document stays."""
    stores = [await kit.open() for _ in range(savers)]
    outcomes = await asyncio.gather(
        *(
            s.save_session(key, _session(key, writer=n), expected_version=expected_version)
            for n, s in enumerate(stores)
        ),
        return_exceptions=True,
    )
    winners = [(n, v) for n, v in enumerate(outcomes) if isinstance(v, str)]
    losers = [v for v in outcomes if isinstance(v, ConcurrencyConflictError)]
    assert len(winners) == 1, f"{len(winners)} savers won with expected version {expected_version!r}: {outcomes!r}"
    assert len(losers) == savers - 1, f"unexpected outcomes: {outcomes!r}"
    writer, version = winners[0]
    assert await (await kit.open()).load_session(key) == StoredSession(_session(key, writer=writer), version)


async def _pages(store: HistoryStore, tenant: str, limit: int) -> list[SessionPage]:
    pages: list[SessionPage] = []
    cursor: str | None = None
    for _ in range(1000):
        page = await store.list_sessions(tenant, limit=limit, cursor=cursor)
        pages.append(page)
        cursor = page.next_cursor
        if cursor is None:
            return pages
        assert isinstance(cursor, str)
    raise AssertionError("list_sessions kept returning a cursor")


def _ids(pages: list[SessionPage]) -> list[str]:
    return [info.session_id for page in pages for info in page.items]


class ListingConformance(ConformanceBase):
    """``list_sessions``: one tenant's sessions, newest first, every one exactly once across pages; ``session_info``:
    one session's entry of that listing, read by key."""

    async def test_list_sessions_newest_first_by_pages(self, kit: StoreKit, store: HistoryStore) -> None:
        tenant = kit.tenant("list")
        started = datetime.now(timezone.utc)
        for n in range(7):
            await store.append(SessionKey(tenant, f"s{n}"), make_messages(n + 1))
            await asyncio.sleep(TICK)
        await store.append(SessionKey(kit.tenant("other"), "s0"), make_messages(1))
        await store.append(SessionKey(tenant, "s1"), make_messages(1))  # s1 becomes the newest
        finished = datetime.now(timezone.utc)

        pages = await _pages(await kit.open(), tenant, limit=3)
        assert all(len(page.items) <= 3 for page in pages)
        assert all(page.items for page in pages[:-1]), "an empty page came before the end"
        assert _ids(pages) == ["s1", "s6", "s5", "s4", "s3", "s2", "s0"]
        infos = [info for page in pages for info in page.items]
        assert {i.session_id: i.message_count for i in infos} == {f"s{n}": n + 1 for n in range(7)} | {"s1": 3}
        assert {i.tenant for i in infos} == {tenant}
        for info in infos:
            assert info.created_at.tzinfo is not None
            assert info.updated_at.tzinfo is not None
            assert started - CLOCK_SLACK <= info.created_at <= info.updated_at <= finished + CLOCK_SLACK
        updated = [info.updated_at for info in infos]
        assert updated == sorted(updated, reverse=True)
        s1 = infos[0]
        assert s1.updated_at > s1.created_at
        assert s1.updated_at > infos[1].updated_at

        single = await store.list_sessions(tenant, limit=100)
        assert [i.session_id for i in single.items] == _ids(pages)
        assert single.next_cursor is None

    async def test_cursor_is_stable_while_sessions_change(self, kit: StoreKit, store: HistoryStore) -> None:
        tenant = kit.tenant("cursor")
        for n in range(6):
            await store.append(SessionKey(tenant, f"s{n}"), make_messages(1))
            await asyncio.sleep(TICK)
        first = await store.list_sessions(tenant, limit=2)
        assert [i.session_id for i in first.items] == ["s5", "s4"]
        assert first.next_cursor is not None
        # A session created between pages is newer than the cursor: it neither shifts nor repeats the next pages.
        await store.append(SessionKey(tenant, "new"), make_messages(1))
        cursor: str | None = first.next_cursor
        seen = [i.session_id for i in first.items]
        while cursor is not None:
            page = await store.list_sessions(tenant, limit=2, cursor=cursor)
            seen += [i.session_id for i in page.items]
            cursor = page.next_cursor
        assert seen == ["s5", "s4", "s3", "s2", "s1", "s0"]
        assert _ids(await _pages(store, tenant, limit=4)) == ["new", "s5", "s4", "s3", "s2", "s1", "s0"]

    async def test_session_info_is_the_sessions_listing_entry(self, kit: StoreKit, store: HistoryStore) -> None:
        tenant = kit.tenant("info")
        keys = [SessionKey(tenant, f"s{n}") for n in range(3)]
        for n, key in enumerate(keys):
            await store.append(key, make_messages(n + 1))
            await asyncio.sleep(TICK)
        documented = SessionKey(tenant, "document only")
        await store.save_session(documented, _session(documented, step=1))
        await store.append(keys[0], make_messages(2, "more"))  # updated after it was created, and newest
        await store.append(SessionKey(kit.tenant("other"), "s0"), make_messages(5))  # its namesake elsewhere
        fresh = await kit.open()
        listed = {info.session_id: info for page in await _pages(fresh, tenant, limit=2) for info in page.items}
        assert set(listed) == {"s0", "s1", "s2", "document only"}
        for key in [*keys, documented]:
            assert await fresh.session_info(key) == listed[key.session_id]
            assert await store.session_info(key) == listed[key.session_id]
        s0 = listed["s0"]
        assert (s0.tenant, s0.message_count) == (tenant, 3)
        assert s0.updated_at > s0.created_at
        assert listed["document only"].message_count == 0

    async def test_session_info_reads_no_message(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        for n in range(5):
            await store.append(key, make_messages(200, f"b{n}"))
        reader = await kit.open()
        before = await self.messages_read(reader)
        info = await reader.session_info(key)
        assert info is not None
        assert info.message_count == 1_000
        assert await self.messages_read(reader) - before <= WINDOW_SLACK, "session_info read the messages"

    async def test_session_info_of_a_missing_or_deleted_session_is_none(
        self, kit: StoreKit, store: HistoryStore
    ) -> None:
        key = kit.key()
        assert await store.session_info(key) is None
        await store.append(key, make_messages(2))
        assert await store.session_info(SessionKey(kit.tenant("other"), key.session_id)) is None
        assert await store.session_info(SessionKey(key.tenant, key.session_id + " ")) is None
        reader = await kit.open()
        assert await reader.session_info(key) is not None
        assert await store.delete(key)
        assert await store.session_info(key) is None
        assert await reader.session_info(key) is None
        await store.save_session(key, _session(key))  # a document alone is a session again, without messages
        found = await (await kit.open()).session_info(key)
        assert found is not None
        assert found.message_count == 0

    async def test_list_sessions_of_empty_tenant(self, kit: StoreKit, store: HistoryStore) -> None:
        await store.append(kit.key(), make_messages(1))
        page = await store.list_sessions(kit.tenant("empty"))
        assert page.items == []
        assert page.next_cursor is None
