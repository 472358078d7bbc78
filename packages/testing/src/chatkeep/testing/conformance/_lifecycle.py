"""Conformance of retention (prune, delete_tenant, native TTL) and of the store's lifecycle (close, event loops)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone

import pytest

from chatkeep.core import AgentSession, Message, StoreClosedError, StoreLoopError
from chatkeep.core.backend import HistoryStore, SessionKey, SessionPage
from chatkeep.testing.conformance._base import (
    ConformanceBase,
    StoreKit,
    TTLTimeline,
    make_messages,
    message_ids,
    open_from,
)

__all__ = ["LifecycleConformance", "RetentionConformance", "TTLConformance"]

# Wait this long on each side of a prune cut-off, so engines with millisecond clocks order writes around it.
GAP = 0.1


def _now() -> datetime:
    return datetime.now(timezone.utc)


async def _gone(store: HistoryStore, key: SessionKey) -> bool:
    return (
        await store.load(key) == []
        and await store.count(key) == 0
        and await store.load_session(key) is None
        and key.session_id not in [i.session_id for i in (await store.list_sessions(key.tenant)).items]
        and await store.session_info(key) is None
    )


async def _seed(store: HistoryStore, key: SessionKey, n: int = 2, *, document: bool = True) -> None:
    await store.append(key, make_messages(n))
    if document:
        await store.save_session(key, AgentSession(session_id=key.session_id, tenant=key.tenant))


async def _outcomes(calls: dict[str, Callable[[], Awaitable[object]]]) -> dict[str, BaseException | None]:
    """Run each call; what each raised (``None`` when it worked)."""
    outcomes: dict[str, BaseException | None] = {}
    for name, call in calls.items():
        try:
            await call()
            outcomes[name] = None
        except Exception as exc:
            outcomes[name] = exc
    return outcomes


class RetentionConformance(ConformanceBase):
    """``prune`` removes sessions not updated since a cut-off; ``delete_tenant`` removes one whole tenant."""

    async def test_prune_removes_only_old_sessions(self, kit: StoreKit, store: HistoryStore) -> None:
        tenant, other_tenant = kit.tenant("prune"), kit.tenant("prune-other")
        old, touched, recent = (SessionKey(tenant, s) for s in ("old", "touched", "recent"))
        theirs = SessionKey(other_tenant, "old")
        for key in (old, touched, theirs):
            await _seed(store, key)
        await asyncio.sleep(GAP)
        cutoff = _now()
        await asyncio.sleep(GAP)
        await _seed(store, recent, document=False)
        await store.append(touched, make_messages(1))  # updated after the cut-off: it stays

        assert await store.prune(older_than=_now() - timedelta(hours=1), tenant=tenant) == 0
        assert await store.prune(older_than=timedelta(hours=1), tenant=tenant) == 0
        assert await store.count(old) == 2
        assert await store.prune(older_than=cutoff, tenant=tenant) == 1
        fresh = await kit.open()
        assert await _gone(fresh, old)
        assert [await fresh.count(k) for k in (touched, recent, theirs)] == [3, 2, 2]
        assert await fresh.load_session(touched) is not None

        assert await store.prune(older_than=_now() + timedelta(seconds=1), tenant=tenant) == 2
        assert await _gone(fresh, touched)
        assert await _gone(fresh, recent)
        assert await fresh.count(theirs) == 2
        assert await fresh.load_session(theirs) is not None

    async def test_prune_without_tenant_covers_every_tenant(self, kit: StoreKit, store: HistoryStore) -> None:
        # prune(tenant=None) acts on the whole backing: other data older than the cut-off goes too.
        old = [kit.key(tenant=kit.tenant("a")), kit.key(tenant=kit.tenant("b"))]
        new = [kit.key(tenant=old[0].tenant), kit.key(tenant=old[1].tenant)]
        for key in old:
            await _seed(store, key)
        await asyncio.sleep(GAP)
        cutoff = _now()
        await asyncio.sleep(GAP)
        for key in new:
            await _seed(store, key)
        assert await store.prune(older_than=cutoff) >= 2
        fresh = await kit.open()
        for key in old:
            assert await _gone(fresh, key)
        assert [await fresh.count(key) for key in new] == [2, 2]

    async def test_prune_spares_a_session_written_after_it_was_listed(
        self, kit: StoreKit, store: HistoryStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # A prune built on list_sessions (HistoryStore's default) must not delete a session written between its
        # listing and its deletion: here another writer appends to it right after the listing is read.
        tenant = kit.tenant("prune-race")
        old, returning = SessionKey(tenant, "old"), SessionKey(tenant, "returning")
        for key in (old, returning):
            await _seed(store, key)
        await asyncio.sleep(GAP)
        cutoff = _now()
        await asyncio.sleep(GAP)
        writer, listed = await kit.open(), store._list_sessions
        written: list[int] = []

        async def list_then_write(tenant: str, limit: int, cursor: str | None) -> SessionPage:
            page = await listed(tenant, limit, cursor)
            if not written and returning.session_id in [info.session_id for info in page.items]:
                written.append(await writer.append(returning, make_messages(1)))  # its user came back
            return page

        monkeypatch.setattr(store, "_list_sessions", list_then_write)
        removed = await store.prune(older_than=cutoff, tenant=tenant)
        fresh = await kit.open()
        assert await _gone(fresh, old)
        if written:  # the prune listed the sessions
            assert removed == 1
            assert await fresh.count(returning) == 3
            assert await fresh.load_session(returning) is not None
        else:  # the backend prunes without listing (in one statement, a script...): nothing was written meanwhile
            assert removed == 2
            assert await _gone(fresh, returning)

    async def test_prune_needs_an_aware_cutoff(self, store: HistoryStore) -> None:
        with pytest.raises(ValueError, match="timezone-aware"):
            await store.prune(older_than=datetime.now())

    async def test_delete_tenant(self, kit: StoreKit, store: HistoryStore) -> None:
        tenant, other_tenant = kit.tenant("doomed"), kit.tenant("kept")
        keys = [SessionKey(tenant, f"s{n}") for n in range(3)]
        kept = SessionKey(other_tenant, "s0")
        for n, key in enumerate(keys):
            await _seed(store, key, document=n == 0)
        await _seed(store, kept)
        assert await store.delete_tenant(tenant) == 3
        fresh = await kit.open()
        for key in keys:
            assert await _gone(fresh, key)
        assert (await fresh.list_sessions(tenant)).items == []
        assert await fresh.count(kept) == 2
        assert await fresh.load_session(kept) is not None
        assert await store.delete_tenant(tenant) == 0

    async def test_list_tenants_names_each_tenant_that_holds_a_session(
        self, kit: StoreKit, store: HistoryStore
    ) -> None:
        # The backing may hold other tests' tenants: only ours are checked, and the order of the whole list.
        labels = ("talk \u00fc/\u4e2d", "doc", "emptied", "deleted")
        talk, documented, emptied, deleted = (kit.tenant(label) for label in labels)
        for key in (SessionKey(talk, "a"), SessionKey(talk, "b"), SessionKey(emptied, "a"), SessionKey(deleted, "a")):
            await _seed(store, key, document=False)
        await store.save_session(SessionKey(documented, "a"), AgentSession(session_id="a", tenant=documented))
        await store.delete(SessionKey(emptied, "a"))
        await store.delete_tenant(deleted)

        listed = await (await kit.open()).list_tenants()
        assert listed == sorted(set(listed))
        assert [t for t in listed if t in (talk, documented, emptied, deleted)] == sorted([talk, documented])


class TTLConformance(ConformanceBase):
    """With ``native_ttl``: a store opened with ``ttl=`` lets idle sessions expire; every write restarts the clock."""

    async def test_ttl_expires_idle_sessions(self, kit: StoreKit) -> None:
        self.skip_without_native_ttl()

        async def scenario(timeline: TTLTimeline) -> None:
            store = await kit.open(ttl=timeline.ttl)
            key, lasting = kit.key(), kit.key()
            await timeline.write(_seed(store, key))
            await _seed(await kit.open(), lasting)  # written by a store without a TTL: it never expires
            assert await timeline.read(store.count(key)) == 2
            await timeline.sleep(1.5)
            fresh = await kit.open()
            for _ in range(15):  # up to 1.5 s more: some engines expire in a background sweep
                if await _gone(fresh, key):
                    break
                await timeline.sleep(0.1)
            assert await _gone(fresh, key), "the session outlived its 1 s TTL"
            assert await fresh.count(lasting) == 2

        await TTLTimeline.run(scenario, kit.clock)

    async def test_ttl_is_refreshed_by_writes(self, kit: StoreKit) -> None:
        self.skip_without_native_ttl()

        async def scenario(timeline: TTLTimeline) -> None:
            store = await kit.open(ttl=timedelta(seconds=timeline.ttl))
            key = kit.key()
            await timeline.write(_seed(store, key))  # t = 0: messages and document
            await timeline.sleep_until(0.7)
            await timeline.write(store.append(key, make_messages(1)))  # t = 0.7: a message write keeps the document
            await timeline.sleep_until(1.4)
            state = AgentSession(session_id=key.session_id, tenant=key.tenant, state={"t": 1.4})
            await timeline.write(store.save_session(key, state))
            await timeline.sleep_until(1.9)
            fresh = await kit.open()
            assert await timeline.read(fresh.count(key)) == 3, (
                "messages expired although the session was written 0.5 s ago"
            )
            stored = await timeline.read(fresh.load_session(key))
            assert stored is not None
            assert stored.session.state == {"t": 1.4}
            await timeline.sleep(1.5)
            assert await _gone(fresh, key), "the session outlived its TTL after the last write"

        await TTLTimeline.run(scenario, kit.clock)


class LifecycleConformance(ConformanceBase):
    """``close()`` is idempotent, a closed store refuses work, a store belongs to one running event loop."""

    def _calls(self, store: HistoryStore, key: SessionKey) -> dict[str, Callable[[], Awaitable[object]]]:
        async def iterate() -> list[Message]:
            return [m async for m in store.iter_messages(key)]

        return {
            "append": lambda: store.append(key, make_messages(1)),
            "load": lambda: store.load(key),
            "iter_messages": iterate,
            "count": lambda: store.count(key),
            "delete": lambda: store.delete(key),
            "trim": lambda: store.trim(key, 1),
            "pop": lambda: store.pop(key),
            "list_sessions": lambda: store.list_sessions(key.tenant),
            "session_info": lambda: store.session_info(key),
            "save_session": lambda: store.save_session(key, AgentSession(session_id=key.session_id, tenant=key.tenant)),
            "load_session": lambda: store.load_session(key),
            "prune": lambda: store.prune(older_than=timedelta(days=1), tenant=key.tenant),
            "delete_tenant": lambda: store.delete_tenant(key.tenant),
        }

    async def test_close_is_idempotent_and_closed_store_refuses(self, kit: StoreKit) -> None:
        store = await kit.open()
        key = kit.key()
        batch = make_messages(2)
        await store.append(key, batch)
        await store.close()
        await store.close()
        assert store.closed
        outcomes = await _outcomes(self._calls(store, key))
        wrong = {name: exc for name, exc in outcomes.items() if not isinstance(exc, StoreClosedError)}
        assert not wrong, f"calls on a closed store did not raise StoreClosedError: {wrong!r}"
        assert message_ids(await (await kit.open()).load(key)) == message_ids(batch)
        unused = await kit.open()
        await unused.close()
        assert unused.closed

    async def test_async_with_closes(self, kit: StoreKit) -> None:
        key = kit.key()
        async with await kit.open() as store:
            await store.append(key, make_messages(3))
        assert store.closed
        with pytest.raises(StoreClosedError):
            await store.count(key)
        assert await (await kit.open()).count(key) == 3

    async def test_another_running_loop_is_served_or_refused(self, kit: StoreKit, store: HistoryStore) -> None:
        """A store that ``serves_any_loop`` works on another running loop; any other raises ``StoreLoopError``."""
        key = kit.key()
        await store.append(key, make_messages(1))
        if store.serves_any_loop:
            # Every call works there while this loop keeps running (it awaits the thread).
            outcomes = await asyncio.to_thread(lambda: asyncio.run(_outcomes(self._calls(store, key))))
            failed = {name: exc for name, exc in outcomes.items() if exc is not None}
            assert not failed, f"calls from another running event loop failed: {failed!r}"
            await store.append(key, make_messages(1))
            assert await store.count(key) >= 1, "the store stopped working on its own loop"
            return

        def use_from_another_loop() -> dict[str, BaseException | None]:
            return asyncio.run(_outcomes(self._calls(store, key)))

        # This loop is still running (it awaits the thread), so the store must refuse the other one.
        outcomes = await asyncio.to_thread(use_from_another_loop)
        wrong = {name: exc for name, exc in outcomes.items() if not isinstance(exc, StoreLoopError)}
        assert not wrong, f"calls from another running event loop did not raise StoreLoopError: {wrong!r}"
        assert await store.count(key) == 1, "the store stopped working on its own loop"

    async def test_loops_sharing_a_store_lose_and_duplicate_nothing(self, kit: StoreKit, store: HistoryStore) -> None:
        """Appends from this loop and two threads' loops at once, each batch also sent twice: all kept, once each.

        ``serves_any_loop`` is a property of the store, not a capability flag of the kit (those are ``native_ttl``
        and ``multi_process`` only): a backend whose stores serve one loop at a time declares this test a strict
        expected failure, saying so, and it fails here with their ``StoreLoopError``.
        """
        key = kit.key()
        batches = [make_messages(6) for _ in range(3)]

        async def append_each(batch: list[Message]) -> None:
            for message in batch:
                await store.append(key, [message])
            assert await store.append(key, batch) == 0, "a batch appended again stored messages twice"

        def in_a_thread_loop(batch: list[Message]) -> None:
            asyncio.run(append_each(batch))

        await asyncio.gather(
            asyncio.to_thread(in_a_thread_loop, batches[0]),
            asyncio.to_thread(in_a_thread_loop, batches[1]),
            append_each(batches[2]),
        )
        stored = message_ids(await store.load(key))
        assert await store.count(key) == len(stored) == 18
        for batch in batches:  # each loop's messages, once each and in the order that loop appended them
            assert [i for i in stored if i in set(message_ids(batch))] == message_ids(batch)
        # The threads' loops are closed now: their connections were released when they shut down, and the store
        # still serves this loop and a new one.
        assert await asyncio.to_thread(lambda: asyncio.run(store.count(key))) == 18
        assert await store.count(key) == 18

    async def test_store_survives_sequential_event_loops(self, kit: StoreKit) -> None:
        key = kit.key()
        batch = make_messages(3)

        def script() -> list[Message]:
            # A script calling asyncio.run several times with one store (the previous loop is closed each time).
            store = asyncio.run(open_from(kit.factory))
            try:
                asyncio.run(store.append(key, batch))
                return asyncio.run(store.load(key))
            finally:
                asyncio.run(store.close())

        assert message_ids(await asyncio.to_thread(script)) == message_ids(batch)
        assert message_ids(await (await kit.open()).load(key)) == message_ids(batch)
