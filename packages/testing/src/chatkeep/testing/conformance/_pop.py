"""Conformance of ``pop``: the newest message leaves atomically, once, and the rest of the session stays."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

from chatkeep.core import AgentSession, Message
from chatkeep.core.backend import HistoryStore, SessionKey
from chatkeep.testing.conformance._base import ConformanceBase, StoreKit, make_messages, message_ids
from chatkeep.testing.conformance._lifecycle import GAP

__all__ = ["PopConformance"]

POPPERS = 8


async def _drain(store: HistoryStore, key: SessionKey) -> list[Message]:
    """Pop until the session is empty; the messages in the order they were popped."""
    popped: list[Message] = []
    while (message := await store.pop(key)) is not None:
        popped.append(message)
        await asyncio.sleep(0)  # let the other poppers in between pops
    return popped


class PopConformance(ConformanceBase):
    """``pop``: returns the newest message and removes it, atomically under concurrent callers."""

    async def test_pop_of_an_empty_session_returns_none(self, kit: StoreKit, store: HistoryStore) -> None:
        missing, document_only = kit.key(), kit.key()
        assert await store.pop(missing) is None
        assert await store.count(missing) == 0
        await store.save_session(
            document_only, AgentSession(session_id=document_only.session_id, tenant=document_only.tenant)
        )
        assert await store.pop(document_only) is None
        assert await (await kit.open()).load_session(document_only) is not None

    async def test_pop_returns_the_newest_and_the_count_drops(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        batch = make_messages(5)
        await store.append(key, batch[:3])
        await store.append(key, batch[3:])
        popped = await (await kit.open()).pop(key)
        assert popped == batch[-1]
        assert popped is not None
        assert popped.to_record() == batch[-1].to_record()
        fresh = await kit.open()
        assert await fresh.count(key) == 4
        assert message_ids(await fresh.load(key)) == message_ids(batch[:4])
        assert message_ids(await fresh.load(key, last=2)) == message_ids(batch[2:4])
        assert message_ids([m async for m in fresh.iter_messages(key, batch=3)]) == message_ids(batch[:4])

    async def test_repeated_pops_drain_in_reverse_order(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        batch = make_messages(7)
        await store.append(key, batch[:4])
        await store.append(key, batch[4:])
        assert message_ids(await _drain(store, key)) == message_ids(batch[::-1])
        assert await store.pop(key) is None
        fresh = await kit.open()
        assert await fresh.count(key) == 0
        assert await fresh.load(key) == []
        more = make_messages(2, "after")
        assert await store.append(key, more) == 2
        assert message_ids(await fresh.load(key)) == message_ids(more)

    async def test_concurrent_pops_return_distinct_messages(self, kit: StoreKit) -> None:
        # Few messages, more poppers: each message goes to one popper, the others get None.
        few, many = kit.key(), kit.key()
        small, large = make_messages(5, "few"), make_messages(40, "many")
        writer = await kit.open()
        await writer.append(few, small)
        await writer.append(many, large[:25])
        await writer.append(many, large[25:])
        stores = [await kit.open() for _ in range(POPPERS)]

        singles = await asyncio.gather(*(s.pop(few) for s in stores))
        got = [m for m in singles if m is not None]
        assert len(got) == len(small), f"{POPPERS} pops of {len(small)} messages returned {len(got)} messages"
        assert sorted(message_ids(got)) == sorted(message_ids(small)), "a message was popped twice or lost"

        drained = await asyncio.gather(*(_drain(s, many) for s in stores))
        everything = [m for popped in drained for m in popped]
        assert len(everything) == len(large), "messages were popped twice or lost"
        assert sorted(message_ids(everything)) == sorted(message_ids(large))
        position = {m.message_id: n for n, m in enumerate(large)}
        for popped in drained:  # each popper saw newer messages first
            order = [position[m.message_id] for m in popped]
            assert order == sorted(order, reverse=True), "a popper got an older message before a newer one"
        fresh = await kit.open()
        assert [await fresh.count(few), await fresh.count(many)] == [0, 0]
        assert await fresh.pop(many) is None

    async def test_popped_message_can_be_appended_again(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        batch = make_messages(3)
        await store.append(key, batch)
        popped = await store.pop(key)
        assert popped == batch[-1]
        # Idempotency covers messages still stored: the popped id is new again, the others are not.
        assert await (await kit.open()).append(key, batch) == 1
        assert message_ids(await (await kit.open()).load(key)) == message_ids(batch)
        assert await store.append(key, batch) == 0
        assert await store.count(key) == 3

    async def test_pop_touches_nothing_else(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        sibling = kit.key(tenant=key.tenant)
        namesake = SessionKey(kit.tenant("namesake"), key.session_id)  # same session id, another tenant
        ours, theirs = make_messages(3, "ours"), make_messages(3, "theirs")
        for k, batch in ((key, ours), (sibling, theirs), (namesake, theirs)):
            await store.append(k, batch)
        state = {"turn": 3, "notes": ["kept"]}
        version = await store.save_session(
            key, AgentSession(session_id=key.session_id, tenant=key.tenant, state=state), owner="alice"
        )
        assert await store.pop(key) == ours[-1]
        fresh = await kit.open()
        stored = await fresh.load_session(key, owner="alice")
        assert stored is not None
        assert (stored.session.state, stored.version, stored.owner) == (state, version, "alice")
        assert message_ids(await fresh.load(sibling)) == message_ids(theirs)
        assert message_ids(await fresh.load(namesake)) == message_ids(theirs)
        listed = {info.session_id: info.message_count for info in (await fresh.list_sessions(key.tenant)).items}
        assert listed == {key.session_id: 2, sibling.session_id: 3}
        assert await store.pop(namesake) == theirs[-1]
        assert message_ids(await fresh.load(key)) == message_ids(ours[:2])

    async def test_pop_counts_as_an_update(self, kit: StoreKit, store: HistoryStore) -> None:
        tenant = kit.tenant("pop-update")
        popped, idle = SessionKey(tenant, "popped"), SessionKey(tenant, "idle")
        for key in (popped, idle):
            await store.append(key, make_messages(3))
        await asyncio.sleep(GAP)
        cutoff = datetime.now(timezone.utc)
        await asyncio.sleep(GAP)
        assert await store.pop(popped) is not None
        page = await (await kit.open()).list_sessions(tenant)
        assert [info.session_id for info in page.items] == ["popped", "idle"], "a pop did not update the session"
        assert page.items[0].updated_at >= cutoff
        assert await store.prune(older_than=cutoff, tenant=tenant) == 1
        fresh = await kit.open()
        assert [await fresh.count(popped), await fresh.count(idle)] == [2, 0]

    async def test_ttl_is_refreshed_by_pop(self, kit: StoreKit) -> None:
        async def pop(store: HistoryStore, key: SessionKey) -> None:
            assert await store.pop(key) is not None

        await self.check_write_restarts_ttl(kit, pop, kept=2, what="popped")
