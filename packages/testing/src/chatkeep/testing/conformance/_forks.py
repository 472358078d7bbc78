"""Conformance of ``fork``: a session branches from any message, without copying, and the branches stay apart."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from chatkeep.core import (
    AgentSession,
    ConcurrencyConflictError,
    ForkInfo,
    InvalidArgumentError,
    Message,
    SessionOwnershipError,
)
from chatkeep.core.backend import HistoryStore, SessionInfo, SessionKey
from chatkeep.testing.conformance._base import (
    WINDOW_SLACK,
    ConformanceBase,
    StoreKit,
    make_messages,
    message_ids,
    texts,
)
from chatkeep.testing.conformance._ranges import expected_range

__all__ = ["ForkConformance", "listed_info"]

FORK_WRITERS, FORK_APPENDS, FORK_BATCH = 8, 12, 5
LARGE_SOURCE, LARGE_BATCH, WINDOW = 100_000, 1_000, 20


async def listed_info(store: HistoryStore, key: SessionKey) -> SessionInfo:
    """``key``'s entry in ``list_sessions`` of its tenant (the test's tenants hold a few sessions).

    It also checks that ``session_info(key)`` reads that same entry, so every test that looks at an entry checks both.
    """
    cursor = None
    while True:
        page = await store.list_sessions(key.tenant, limit=100, cursor=cursor)
        for info in page.items:
            if info.session_id == key.session_id:
                assert await store.session_info(key) == info, "session_info differs from the list_sessions entry"
                return info
        if page.next_cursor is None:
            raise AssertionError(f"session {key.session_id!r} is not listed")
        cursor = page.next_cursor


async def _everything(store: HistoryStore, key: SessionKey) -> tuple[list[str], list[str], list[str], int]:
    """What a reader sees of ``key`` through every read: load, load(last=3), iter_messages, count."""
    return (
        message_ids(await store.load(key)),
        message_ids(await store.load(key, last=3)),
        message_ids([m async for m in store.iter_messages(key, batch=2)]),
        await store.count(key),
    )


def _batch(writer: str, append: int) -> list[Message]:
    return [Message(role="user", text=f"{writer}/{append}/{i}") for i in range(FORK_BATCH)]


def _check_whole_appends(stored: list[str], writers: list[str]) -> None:
    """Each writer's appends are whole and in order, nothing lost or doubled (``stored``: texts)."""
    assert len(set(stored)) == len(stored), "a message is stored twice"
    assert sorted(stored) == sorted(
        f"{w}/{a}/{i}" for w in writers for a in range(FORK_APPENDS) for i in range(FORK_BATCH)
    )
    position = {label: n for n, label in enumerate(stored)}
    for writer in writers:
        for append in range(FORK_APPENDS):
            start = position[f"{writer}/{append}/0"]
            assert stored[start : start + FORK_BATCH] == [f"{writer}/{append}/{i}" for i in range(FORK_BATCH)]


class ForkConformance(ConformanceBase):
    """``fork``: the target takes the source's history up to a message, by reference; the two never mix."""

    async def test_fork_takes_the_history_through_a_message(self, kit: StoreKit, store: HistoryStore) -> None:
        source = kit.key()
        target, whole = kit.key(tenant=source.tenant), kit.key(tenant=source.tenant)
        batch = make_messages(10)
        await store.append(source, batch[:6])
        await store.append(source, batch[6:])
        assert await store.fork(source, target, through=batch[4].message_id) == 5
        assert await store.fork(source, whole) == 10
        fresh = await kit.open()
        assert await _everything(fresh, target) == (
            message_ids(batch[:5]),
            message_ids(batch[2:5]),
            message_ids(batch[:5]),
            5,
        )
        assert await fresh.load(target) == batch[:5], "a forked message differs from the source's"
        assert message_ids(await fresh.load(whole)) == message_ids(batch)
        assert message_ids(await fresh.load(source)) == message_ids(batch), "the fork changed its source"
        assert (await listed_info(fresh, target)).forked_from == ForkInfo(source.session_id, batch[4].message_id)
        assert (await listed_info(fresh, whole)).forked_from == ForkInfo(source.session_id, batch[-1].message_id)
        assert (await listed_info(fresh, source)).forked_from is None
        assert (await listed_info(fresh, target)).message_count == 5

    async def test_appends_to_either_side_never_show_in_the_other(self, kit: StoreKit, store: HistoryStore) -> None:
        source = kit.key()
        target = kit.key(tenant=source.tenant)
        base = make_messages(4, "base")
        await store.append(source, base)
        assert await store.fork(source, target, through=base[1].message_id) == 2
        on_source, on_target = make_messages(3, "source"), make_messages(2, "target")
        assert await store.append(source, on_source) == 3
        assert await store.append(target, on_target) == 2
        fresh = await kit.open()
        assert texts(await fresh.load(source)) == texts(base + on_source)
        assert texts(await fresh.load(target)) == texts(base[:2] + on_target)
        assert texts(await fresh.load(target, last=3)) == texts(base[1:2] + on_target)
        assert await fresh.count(target) == 4
        # Idempotency covers what the fork took: appending an inherited message again stores nothing.
        assert await store.append(target, [base[0], *on_target]) == 0
        # A message the fork did not take is new to it.
        assert await store.append(target, [base[3]]) == 1
        assert texts(await fresh.load(target)) == texts([*base[:2], *on_target, base[3]])
        assert texts(await fresh.load(source)) == texts(base + on_source)

    async def test_ranges_of_a_fork_span_its_fork_points(self, kit: StoreKit, store: HistoryStore) -> None:
        source = kit.key()
        target, third = kit.key(tenant=source.tenant), kit.key(tenant=source.tenant)
        batch, own, later = make_messages(10, "source"), make_messages(4, "own"), make_messages(2, "later")
        await store.append(source, batch[:3])
        await store.append(source, batch[3:])
        assert await store.fork(source, target, through=batch[5].message_id) == 6
        await store.append(target, own)
        await store.append(source, later)  # not the fork's
        await store.fork(target, third, through=own[1].message_id)
        mine = make_messages(3, "third")
        await store.append(third, mine)
        histories = {
            target: message_ids(batch[:6] + own),
            third: message_ids(batch[:6] + own[:2] + mine),
            source: message_ids(batch + later),
        }
        reader = await kit.open()
        for key, ids in histories.items():
            for before in range(len(ids) + 2):
                for last in (None, 1, 3, 6, 11):
                    got = message_ids(await reader.load(key, last=last, before=before))
                    assert got == expected_range(ids, before, last), (key.session_id, before, last)
        # A trim of the fork: its positions restart at the oldest message it keeps, inherited or its own.
        await store.trim(target, 7)
        kept = histories[target][-7:]
        for before, last in ((2, None), (4, 3), (7, 2), (9, 5)):
            got = message_ids(await reader.load(target, last=last, before=before))
            assert got == expected_range(kept, before, last), (before, last)

    async def test_a_range_of_a_large_fork_reads_only_the_range(self, kit: StoreKit) -> None:
        writer = await kit.open()
        # Filled once per backing where the backing outlives the test (shared_backing): this test never changes it.
        source, last = await kit.large_session(writer, LARGE_SOURCE, LARGE_BATCH)
        first, second = kit.key(tenant=source.tenant), kit.key(tenant=source.tenant)
        await writer.fork(source, first, through=last[-10].message_id)
        await writer.append(first, make_messages(5, "one"))
        await writer.fork(first, second)
        await writer.append(second, make_messages(5, "two"))
        reader = await kit.open()
        inherited, own = LARGE_SOURCE - 9, [f"{label}-{i}" for label in ("one", "two") for i in range(5)]
        # Inherited from the large source, across both fork points, and beyond the count.
        for before, last_k in ((LARGE_SOURCE // 2, WINDOW), (inherited + 3, WINDOW), (inherited + 7, 4), (10**9, 12)):
            read = await self.messages_read(reader)
            window = await reader.load(second, last=last_k, before=before)
            assert await self.messages_read(reader) - read <= last_k + WINDOW_SLACK, f"before={before} read too much"
            stop = min(before, inherited + len(own))
            expected = [f"#{n}" if n < inherited else own[n - inherited] for n in range(stop - last_k, stop)]
            assert texts(window) == expected, (before, last_k)

    async def test_fork_of_a_fork(self, kit: StoreKit, store: HistoryStore) -> None:
        first = kit.key()
        second, third, fourth = (kit.key(tenant=first.tenant) for _ in range(3))
        roots = make_messages(6, "root")
        await store.append(first, roots)
        await store.fork(first, second, through=roots[3].message_id)
        own = make_messages(3, "second")
        await store.append(second, own)
        assert await store.fork(second, third, through=own[0].message_id) == 5
        assert await store.fork(second, fourth, through=roots[1].message_id) == 2  # through an inherited message
        await store.append(third, make_messages(1, "third"))
        fresh = await kit.open()
        assert texts(await fresh.load(third)) == [*texts([*roots[:4], own[0]]), "third-0"]
        assert texts(await fresh.load(third, last=2)) == [own[0].text, "third-0"]
        assert texts([m async for m in fresh.iter_messages(third, batch=4)]) == texts(await fresh.load(third))
        assert texts(await fresh.load(fourth)) == texts(roots[:2])
        assert texts(await fresh.load(second)) == texts([*roots[:4], *own])
        assert texts(await fresh.load(first)) == texts(roots)
        assert (await listed_info(fresh, third)).forked_from == ForkInfo(second.session_id, own[0].message_id)
        assert (await listed_info(fresh, fourth)).forked_from == ForkInfo(second.session_id, roots[1].message_id)

    async def test_deleting_trimming_or_popping_the_source_never_changes_a_fork(self, kit: StoreKit) -> None:
        store = await kit.open()
        source = kit.key()
        fork, grandchild = kit.key(tenant=source.tenant), kit.key(tenant=source.tenant)
        batch = make_messages(12)
        await store.append(source, batch)
        await store.fork(source, fork, through=batch[7].message_id)
        await store.fork(fork, grandchild, through=batch[5].message_id)
        await store.append(fork, make_messages(2, "fork"))
        expected = {key: await _everything(store, key) for key in (fork, grandchild)}

        async def unchanged(after: str) -> None:
            fresh = await kit.open()
            for key, seen in expected.items():
                assert await _everything(fresh, key) == seen, f"a fork changed after its source was {after}"

        assert await store.pop(source) == batch[-1]
        assert await store.pop(source) == batch[-2]
        assert await store.pop(source) == batch[-3]
        assert await store.pop(source) == batch[-4]
        assert await store.pop(source) == batch[-5]  # the fork's through message leaves the source
        await unchanged("popped")
        assert await store.trim(source, 2) == 5
        await unchanged("trimmed")
        await store.append(source, make_messages(3, "again"))
        assert await store.delete(source)
        await unchanged("deleted")
        await store.append(source, make_messages(2, "reborn"))  # a new session at the deleted one's key
        await unchanged("deleted and its key reused")
        assert await store.delete(fork)  # the middle of the chain goes too
        fresh = await kit.open()
        assert await _everything(fresh, grandchild) == expected[grandchild], "deleting a fork changed its own fork"
        assert texts(await fresh.load(source)) == ["reborn-0", "reborn-1"]

    async def test_pruning_the_source_never_changes_a_fork(self, kit: StoreKit, store: HistoryStore) -> None:
        source = kit.key()
        fork = kit.key(tenant=source.tenant)
        batch = make_messages(5)
        await store.append(source, batch)
        await asyncio.sleep(0.01)
        await store.fork(source, fork, through=batch[2].message_id)
        cutoff = (await listed_info(store, fork)).updated_at - timedelta(microseconds=1)
        assert (await listed_info(store, source)).updated_at < cutoff, "the fork was stamped before its source"
        assert await store.prune(older_than=cutoff, tenant=source.tenant) == 1
        fresh = await kit.open()
        assert await fresh.count(source) == 0
        assert message_ids(await fresh.load(fork)) == message_ids(batch[:3])
        assert message_ids(await fresh.load(fork, last=1)) == [batch[2].message_id]

    async def test_expiring_the_source_never_changes_a_fork(self, kit: StoreKit) -> None:
        self.skip_without_native_ttl()
        lasting = await kit.open()
        expiring = await kit.open(ttl=timedelta(seconds=1))
        source = kit.key()
        fork = kit.key(tenant=source.tenant)
        batch = make_messages(4)
        await expiring.append(source, batch)
        await lasting.fork(source, fork, through=batch[1].message_id)  # written without a TTL: it stays
        await kit.clock.sleep(1.5)
        fresh = await kit.open()
        assert await fresh.count(source) == 0, "the source outlived its TTL"
        assert message_ids(await fresh.load(fork)) == message_ids(batch[:2])

    async def test_changing_a_fork_never_changes_its_source(self, kit: StoreKit, store: HistoryStore) -> None:
        source = kit.key()
        fork = kit.key(tenant=source.tenant)
        batch = make_messages(6)
        await store.append(source, batch)
        await store.fork(source, fork)
        expected = await _everything(store, source)
        assert await store.pop(fork) == batch[-1]
        assert await store.trim(fork, 2) == 3
        assert message_ids(await store.load(fork)) == message_ids(batch[3:5])
        assert await store.pop(fork) == batch[4]
        assert await store.append(fork, [batch[4]]) == 1, "a popped inherited message is no longer held"
        assert await store.delete(fork)
        assert await _everything(await kit.open(), source) == expected

    async def test_fork_refusals(self, kit: StoreKit, store: HistoryStore) -> None:
        source = kit.key()
        taken, documented, fresh_target = (kit.key(tenant=source.tenant) for _ in range(3))
        batch = make_messages(3)
        await store.append(source, batch)
        assert await store.fork(source, taken, through=batch[0].message_id) == 1
        with pytest.raises(ConcurrencyConflictError, match="already exists"):
            await store.fork(source, taken)
        await store.save_session(documented, AgentSession(session_id=documented.session_id, tenant=source.tenant))
        with pytest.raises(ConcurrencyConflictError, match="already exists"):
            await store.fork(source, documented)
        with pytest.raises(InvalidArgumentError, match="not in session"):
            await store.fork(source, fresh_target, through="no-such-message")
        await store.append(taken, make_messages(1, "taken"))
        own = (await store.load(taken, last=1))[0]
        with pytest.raises(InvalidArgumentError, match="not in session"):
            await store.fork(source, fresh_target, through=own.message_id)  # the fork's message, not the source's
        popped = await store.pop(source)
        assert popped is not None
        with pytest.raises(InvalidArgumentError, match="not in session"):
            await store.fork(source, fresh_target, through=popped.message_id)
        with pytest.raises(InvalidArgumentError, match="no messages"):
            await store.fork(kit.key(tenant=source.tenant), fresh_target)
        with pytest.raises(SessionOwnershipError, match="tenant"):
            await store.fork(source, kit.key(fresh_target.session_id))
        fresh = await kit.open()
        assert await fresh.count(fresh_target) == 0, "a refused fork left messages behind"
        assert await fresh.load_session(fresh_target) is None
        assert message_ids(await fresh.load(taken)) == [batch[0].message_id, own.message_id]

    async def test_concurrent_forks_onto_one_target_make_one(self, kit: StoreKit) -> None:
        source = kit.key()
        target = kit.key(tenant=source.tenant)
        batch = make_messages(6)
        stores = [await kit.open() for _ in range(6)]
        await stores[0].append(source, batch)
        outcomes = await asyncio.gather(
            *(s.fork(source, target, through=batch[n].message_id) for n, s in enumerate(stores)),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, ConcurrencyConflictError):
                raise outcome
        made = [n for n, outcome in enumerate(outcomes) if not isinstance(outcome, BaseException)]
        assert len(made) == 1, f"{len(made)} concurrent forks onto one target succeeded"
        assert message_ids(await (await kit.open()).load(target)) == message_ids(batch[: made[0] + 1])

    async def test_fork_under_concurrent_appenders_on_both_sides(self, kit: StoreKit) -> None:
        source = kit.key()
        target = kit.key(tenant=source.tenant)
        source_writers = [f"s{n}" for n in range(FORK_WRITERS)]
        target_writers = [f"t{n}" for n in range(FORK_WRITERS)]
        forked, started = asyncio.Event(), asyncio.Event()
        appended = 0

        async def write(store: HistoryStore, key: SessionKey, writer: str) -> None:
            nonlocal appended
            for append in range(FORK_APPENDS):
                if append == FORK_APPENDS // 2 and key == source:
                    await forked.wait()  # half the source's appends land after the fork
                assert await store.append(key, _batch(writer, append)) == FORK_BATCH
                appended += 1
                if appended == FORK_WRITERS * 2:
                    started.set()
                await asyncio.sleep(0)

        async def fork_midway(store: HistoryStore) -> int:
            await started.wait()  # the source's writers are under way, and keep writing during the fork
            held = await store.fork(source, target)
            forked.set()
            target_stores = [await kit.open() for _ in target_writers]
            await asyncio.gather(*(write(s, target, w) for s, w in zip(target_stores, target_writers, strict=True)))
            return held

        stores = [await kit.open() for _ in source_writers]
        _, held = await asyncio.gather(
            asyncio.gather(*(write(s, source, w) for s, w in zip(stores, source_writers, strict=True))),
            fork_midway(await kit.open()),
        )
        fresh = await kit.open()
        on_source, on_target = texts(await fresh.load(source)), texts(await fresh.load(target))
        _check_whole_appends(on_source, source_writers)
        assert on_target[:held] == on_source[:held], "the fork is not a prefix of its source"
        assert held % FORK_BATCH == 0, "the fork cut an append in two"
        _check_whole_appends(on_target[held:], target_writers)
        assert await fresh.count(target) == held + FORK_WRITERS * FORK_APPENDS * FORK_BATCH

    async def test_fork_costs_no_reads_and_a_fork_reads_only_its_window(self, kit: StoreKit) -> None:
        writer = await kit.open()
        # Filled once per backing where the backing outlives the test (shared_backing): this test never changes it.
        source, last = await kit.large_session(writer, LARGE_SOURCE, LARGE_BATCH)
        chain = [kit.key(tenant=source.tenant) for _ in range(3)]
        small, small_fork = kit.key(tenant=source.tenant), kit.key(tenant=source.tenant)
        reader = await kit.open()
        await writer.append(small, make_messages(10))
        before = await self.messages_read(reader)
        assert await reader.fork(small, small_fork) == 10
        small_cost = await self.messages_read(reader) - before
        before = await self.messages_read(reader)
        assert await reader.fork(source, chain[0], through=last[-10].message_id) == LARGE_SOURCE - 9
        assert await self.messages_read(reader) - before <= small_cost + WINDOW_SLACK, "a fork read the history"
        await reader.append(chain[0], make_messages(5, "one"))
        await reader.fork(chain[0], chain[1])
        await reader.append(chain[1], make_messages(5, "two"))
        await reader.fork(chain[1], chain[2], through=(await reader.load(chain[1], last=1))[0].message_id)
        await reader.append(chain[2], make_messages(5, "three"))

        before = await self.messages_read(reader)
        window = await reader.load(chain[2], last=WINDOW)
        assert await self.messages_read(reader) - before <= WINDOW + WINDOW_SLACK, (
            "load(last=20) on a fork read too much"
        )
        expected = [f"#{n}" for n in range(LARGE_SOURCE - 15, LARGE_SOURCE - 9)]
        expected += [f"{label}-{i}" for label in ("one", "two") for i in range(5)] + [f"three-{i}" for i in range(4)]
        assert texts(window)[:-1] == expected[-(WINDOW - 1) :]
        assert texts(window)[-1] == "three-4"
        before = await self.messages_read(reader)
        assert await reader.count(chain[2]) == LARGE_SOURCE - 9 + 15
        assert await self.messages_read(reader) - before <= WINDOW_SLACK, "count() on a fork read the messages"
        extra = make_messages(3, "extra")
        before = await self.messages_read(reader)
        assert await reader.append(chain[2], extra) == 3
        assert await self.messages_read(reader) - before <= len(extra) + WINDOW_SLACK, (
            "append() to a fork read its history"
        )
