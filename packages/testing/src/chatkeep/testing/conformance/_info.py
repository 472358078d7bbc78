"""Conformance of what a store keeps about a session: its token usage, title, tags and metadata."""

from __future__ import annotations

import asyncio
import random

from chatkeep.core import ForkInfo, Message, SessionUsage, TextContent, Usage, UsageContent
from chatkeep.core.backend import HistoryStore, usage_of
from chatkeep.testing.conformance._base import WINDOW_SLACK, ConformanceBase, StoreKit, make_messages
from chatkeep.testing.conformance._forks import listed_info

__all__ = ["InfoConformance", "UsageConformance", "costly_messages"]

USAGE_WRITERS, USAGE_APPENDS, POPS = 8, 10, 20


def costly_messages(n: int, label: str = "c", *, start: int = 1) -> list[Message]:
    """``n`` assistant messages with usage contents: message ``i`` used ``start + i`` input tokens (and more)."""
    messages = []
    for i in range(n):
        used = Usage(input_tokens=start + i, output_tokens=2 * (start + i), total_tokens=3 * (start + i))
        model = ("model-a", "model-b", None)[i % 3]
        contents = [TextContent(text=f"{label}-{i}"), UsageContent(usage=used, model=model)]
        messages.append(Message(role="assistant", contents=contents))
    return messages


class UsageConformance(ConformanceBase):
    """``usage``: the tokens a session's messages used, kept exact by every write and read without the messages."""

    async def test_usage_adds_up_what_appends_stored(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        costly = costly_messages(6)
        assert await store.usage(key) == SessionUsage(), "a session without messages used tokens"
        await store.append(key, [*costly[:4], *make_messages(3)])
        await store.append(key, [Message(role="user", text="no usage")])  # a batch without usage keeps the sum
        await store.append(key, [costly[0], *costly[4:]])  # the repeated message counts once
        fresh = await kit.open()
        used = await fresh.usage(key)
        assert used == usage_of(costly)
        assert (used.input_tokens, used.output_tokens, used.total_tokens, used.calls) == (21, 42, 63, 6)
        assert dict(used.models) == dict(usage_of(costly).models)
        assert set(used.models) == {"model-a", "model-b"}
        assert used.models["model-a"].calls == 2
        assert (await listed_info(fresh, key)).usage == used

    async def test_usage_is_read_without_reading_the_messages(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        reader = await kit.open()
        assert await reader.usage(key) == SessionUsage()
        for start in range(0, 2_000, 200):
            await store.append(key, costly_messages(200, start=start))
        before = await self.messages_read(reader)
        used = await reader.usage(key)
        assert await self.messages_read(reader) - before <= WINDOW_SLACK, "usage() read the messages"
        assert (used.input_tokens, used.calls) == (sum(range(2_000)), 2_000)
        assert used == usage_of(await reader.load(key))

    async def test_pop_trim_and_delete_keep_usage_exact(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        costly = costly_messages(9)
        await store.append(key, costly)
        assert await store.pop(key) == costly[-1]
        assert await (await kit.open()).usage(key) == usage_of(costly[:-1])
        assert await store.trim(key, 5) == 3
        assert await (await kit.open()).usage(key) == usage_of(costly[3:8])
        await store.append(key, [costly[-1]])  # the popped message is new again
        assert await (await kit.open()).usage(key) == usage_of([*costly[3:8], costly[-1]])
        assert await store.delete(key)
        assert await (await kit.open()).usage(key) == SessionUsage()
        await store.append(key, costly[:1])  # a new session at the key starts from nothing
        assert await (await kit.open()).usage(key) == usage_of(costly[:1])

    async def test_usage_exact_after_concurrent_appends_and_pops(self, kit: StoreKit) -> None:
        key = kit.key()
        popped: list[Message] = []

        async def append(store: HistoryStore, writer: int) -> None:
            for n in range(USAGE_APPENDS):
                await store.append(key, costly_messages(3, f"w{writer}/{n}", start=random.randint(1, 50)))
                await asyncio.sleep(0)

        async def pop(store: HistoryStore) -> None:
            for _ in range(POPS):
                message = await store.pop(key)
                if message is not None:
                    popped.append(message)
                await asyncio.sleep(0)

        writers = [await kit.open() for _ in range(USAGE_WRITERS)]
        poppers = [await kit.open() for _ in range(2)]
        await asyncio.gather(*(append(s, n) for n, s in enumerate(writers)), *(pop(s) for s in poppers))
        fresh = await kit.open()
        stored = await fresh.load(key)
        assert len(stored) == USAGE_WRITERS * USAGE_APPENDS * 3 - len(popped)
        assert await fresh.usage(key) == usage_of(stored), "usage drifted from the messages under concurrent writes"

    async def test_a_fork_uses_what_it_took(self, kit: StoreKit, store: HistoryStore) -> None:
        source = kit.key()
        fork = kit.key(tenant=source.tenant)
        costly = costly_messages(8)
        await store.append(source, costly)
        await store.fork(source, fork, through=costly[4].message_id)
        assert await store.usage(fork) == usage_of(costly[:5])
        await store.append(fork, costly_messages(2, "own", start=100))
        await store.trim(source, 1)
        await store.delete(source)
        fresh = await kit.open()
        assert await fresh.usage(fork) == usage_of(await fresh.load(fork))
        assert await fresh.usage(source) == SessionUsage()
        assert await store.trim(fork, 3) == 4
        assert await (await kit.open()).usage(fork) == usage_of(await fresh.load(fork))


class InfoConformance(ConformanceBase):
    """``update_info``, ``list_sessions(tag=...)`` and ``session_info``: titles, tags and metadata, kept, found by tag,
    read by key."""

    async def test_update_info_sets_title_tags_and_metadata(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        await store.append(key, make_messages(2))
        assert (await listed_info(store, key)).title is None
        assert await store.update_info(key, title="Trip to Lisbon", tags={"travel", "ünïcode"}, metadata={"a": [1]})
        fresh = await kit.open()
        info = await listed_info(fresh, key)
        assert (info.title, info.tags, info.metadata) == (
            "Trip to Lisbon",
            frozenset({"travel", "ünïcode"}),
            {"a": [1]},
        )
        assert await store.update_info(key, tags={"work"})  # only what is given changes
        info = await listed_info(await kit.open(), key)
        assert (info.title, info.tags, info.metadata) == ("Trip to Lisbon", frozenset({"work"}), {"a": [1]})
        assert await store.update_info(key, title="", tags=set(), metadata={})
        info = await listed_info(await kit.open(), key)
        assert (info.title, info.tags, info.metadata) == (None, frozenset(), {})
        assert info.message_count == 2

    async def test_update_info_of_a_missing_session_stores_nothing(self, kit: StoreKit, store: HistoryStore) -> None:
        present, missing = kit.key(), kit.key()
        await store.append(present, make_messages(1))
        assert await store.update_info(present, title="here")
        assert not await store.update_info(missing, title="nowhere", tags={"x"})
        fresh = await kit.open()
        assert await fresh.count(missing) == 0
        assert [i.session_id for i in (await fresh.list_sessions(missing.tenant)).items] == []
        assert (await fresh.list_sessions(present.tenant, tag="x")).items == []

    async def test_info_outlives_pops_and_trims_and_goes_with_the_session(
        self, kit: StoreKit, store: HistoryStore
    ) -> None:
        key = kit.key()
        await store.append(key, make_messages(4))
        await store.update_info(key, title="kept", tags={"t"}, metadata={"k": 1})
        await store.pop(key)
        await store.trim(key, 1)
        info = await listed_info(await kit.open(), key)
        assert (info.title, info.tags, info.metadata) == ("kept", frozenset({"t"}), {"k": 1})
        assert await store.delete(key)
        await store.append(key, make_messages(1, "new"))
        fresh = await kit.open()
        info = await listed_info(fresh, key)
        assert (info.title, info.tags, info.metadata) == (None, frozenset(), {}), "a deleted session's info came back"
        assert (await fresh.list_sessions(key.tenant, tag="t")).items == []

    async def test_update_info_is_a_write(self, kit: StoreKit, store: HistoryStore) -> None:
        tenant = kit.tenant()
        older, newer = kit.key(tenant=tenant), kit.key(tenant=tenant)
        await store.append(older, make_messages(1))
        await asyncio.sleep(0.002)
        await store.append(newer, make_messages(1))
        before = await listed_info(store, older)
        await asyncio.sleep(0.002)
        await store.update_info(older, title="moved up")
        listed = (await (await kit.open()).list_sessions(tenant)).items
        assert [i.session_id for i in listed] == [older.session_id, newer.session_id]
        assert listed[0].updated_at > before.updated_at

    async def test_list_sessions_by_tag_is_paged_newest_first(self, kit: StoreKit, store: HistoryStore) -> None:
        tenant = kit.tenant()
        keys = [kit.key(f"s{n:02}", tenant=tenant) for n in range(24)]
        for n, key in enumerate(keys):
            await store.append(key, make_messages(1, key.session_id))
            tags = {"even"} if n % 2 == 0 else {"odd"}
            if n % 3 == 0:
                tags.add("third")
            await store.update_info(key, tags=tags)
        other = kit.key("s00")  # the same id in another tenant, tagged too
        await store.append(other, make_messages(1))
        await store.update_info(other, tags={"even", "third"})
        fresh = await kit.open()
        pages, cursor = [], None
        while True:
            page = await fresh.list_sessions(tenant, tag="third", limit=3, cursor=cursor)
            pages.append(page.items)
            cursor = page.next_cursor
            if cursor is None:
                break
        listed = [info for page in pages for info in page]
        assert all(len(page) <= 3 for page in pages)
        assert [i.session_id for i in listed] == [f"s{n:02}" for n in range(21, -1, -3)]
        assert all("third" in i.tags and i.tenant == tenant for i in listed)
        assert [i.updated_at for i in listed] == sorted((i.updated_at for i in listed), reverse=True)
        evens = (await fresh.list_sessions(tenant, tag="even", limit=100)).items
        assert sorted(i.session_id for i in evens) == [f"s{n:02}" for n in range(0, 24, 2)]
        assert (await fresh.list_sessions(tenant, tag="none-such")).items == []
        # A session re-tagged leaves the old tag's listing and joins the new one.
        await store.update_info(keys[21], tags={"even"})
        assert keys[21].session_id not in [i.session_id for i in (await fresh.list_sessions(tenant, tag="third")).items]
        assert (await fresh.list_sessions(tenant, tag="even")).items[0].session_id == keys[21].session_id

    async def test_a_fork_starts_with_its_source_info(self, kit: StoreKit, store: HistoryStore) -> None:
        source = kit.key()
        fork = kit.key(tenant=source.tenant)
        await store.append(source, make_messages(3))
        await store.update_info(source, title="plan", tags={"draft"}, metadata={"v": 1})
        await store.fork(source, fork)
        await store.update_info(fork, title="plan B", tags={"draft", "b"})
        fresh = await kit.open()
        info = await listed_info(fresh, fork)
        assert (info.title, info.tags, info.metadata) == ("plan B", frozenset({"draft", "b"}), {"v": 1})
        info = await listed_info(fresh, source)
        assert (info.title, info.tags, info.metadata) == ("plan", frozenset({"draft"}), {"v": 1})
        assert sorted(i.session_id for i in (await fresh.list_sessions(source.tenant, tag="draft")).items) == sorted(
            [source.session_id, fork.session_id]
        )

    async def test_session_info_tells_title_tags_usage_and_parent(self, kit: StoreKit, store: HistoryStore) -> None:
        source = kit.key()
        fork = kit.key(tenant=source.tenant)
        costly = costly_messages(4)
        await store.append(source, costly)
        await store.update_info(source, title="Trip", tags={"travel", "ünïcode"}, metadata={"k": [1]})
        await store.fork(source, fork, through=costly[2].message_id)
        await store.append(fork, make_messages(1, "own"))
        fresh = await kit.open()
        info = await fresh.session_info(fork)
        assert info == await listed_info(fresh, fork)
        assert info is not None
        assert info.forked_from == ForkInfo(source.session_id, costly[2].message_id)
        assert (info.message_count, info.usage) == (4, usage_of(costly[:3]))
        assert (info.title, info.tags, info.metadata) == ("Trip", frozenset({"travel", "ünïcode"}), {"k": [1]})
        assert await fresh.session_info(source) == await listed_info(fresh, source)
        assert await store.delete(source)
        assert await fresh.session_info(source) is None
        kept = await fresh.session_info(fork)
        assert kept is not None
        assert kept.forked_from == info.forked_from, "deleting the source changed its fork's parent"
        assert kept == await listed_info(fresh, fork)
