"""Conformance of the message history: append, load, iter_messages, count, delete, trim, and what a message holds."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest

from chatkeep.core import (
    AgentSession,
    DataContent,
    FunctionCallContent,
    FunctionResultContent,
    Message,
    MessageTooLargeError,
    TextContent,
    UriContent,
    Usage,
    UsageContent,
)
from chatkeep.core.backend import HistoryStore, SessionKey
from chatkeep.testing.conformance._base import (
    WINDOW_SLACK,
    ConformanceBase,
    StoreKit,
    make_messages,
    message_ids,
    texts,
)
from chatkeep.testing.conformance._lifecycle import GAP

__all__ = ["AppendConformance", "ContentConformance", "ReadConformance"]


class AppendConformance(ConformanceBase):
    """``append``: order, the count of new messages, idempotent retries."""

    async def test_append_keeps_order_across_appends(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        first, second, third = make_messages(3, "a"), make_messages(1, "b"), make_messages(4, "c")
        for batch in (first, second, third):
            await store.append(key, batch)
        expected = message_ids(first + second + third)
        assert message_ids(await store.load(key)) == expected
        assert message_ids(await (await kit.open()).load(key)) == expected

    async def test_append_returns_number_of_new_messages(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        assert await store.append(key, make_messages(5)) == 5
        assert await store.append(key, make_messages(1)) == 1
        assert await store.append(key, []) == 0
        assert await store.count(key) == 6

    async def test_retry_through_fresh_store_stores_nothing_twice(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        batch = make_messages(5)
        assert await store.append(key, batch) == 5
        retry_store = await kit.open()
        assert await retry_store.append(key, batch) == 0
        assert message_ids(await (await kit.open()).load(key)) == message_ids(batch)

    async def test_partial_overlap_appends_only_new_messages(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        batch = make_messages(5, "first")
        await store.append(key, batch)
        extra = make_messages(3, "second")
        assert await (await kit.open()).append(key, batch[3:] + extra) == 3
        assert message_ids(await (await kit.open()).load(key)) == message_ids(batch + extra)

    async def test_append_dedupes_within_one_batch(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        one, two = make_messages(2)
        assert await store.append(key, [one, two, one, two]) == 2
        assert message_ids(await (await kit.open()).load(key)) == [one.message_id, two.message_id]

    async def test_deleted_messages_can_be_appended_again(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        batch = make_messages(3)
        await store.append(key, batch)
        assert await store.delete(key)
        # Idempotency covers messages still stored: after a delete the same ids are new again.
        assert await store.append(key, batch) == 3
        assert message_ids(await store.load(key)) == message_ids(batch)


class ReadConformance(ConformanceBase):
    """``load``, ``iter_messages``, ``count``, ``delete``, ``trim``."""

    async def test_load_last_returns_newest_in_order(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        batch = make_messages(10)
        await store.append(key, batch)
        ids = message_ids(batch)
        assert message_ids(await store.load(key, last=3)) == ids[-3:]
        assert message_ids(await store.load(key, last=1)) == ids[-1:]
        assert message_ids(await store.load(key, last=10)) == ids
        assert message_ids(await store.load(key, last=25)) == ids
        assert await store.load(key, last=0) == []
        assert message_ids(await store.load(key, last=None)) == ids

    async def test_missing_session_reads_empty(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        assert await store.load(key) == []
        assert await store.load(key, last=5) == []
        assert [m async for m in store.iter_messages(key)] == []
        assert await store.count(key) == 0
        assert await store.delete(key) is False
        assert await store.trim(key, 3) == 0

    async def test_iter_messages_pages_through_everything(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        batch = make_messages(25)
        await store.append(key, batch[:10])
        await store.append(key, batch[10:])
        for size in (1, 7, 25, 1000):
            assert message_ids([m async for m in store.iter_messages(key, batch=size)]) == message_ids(batch)

    async def test_iter_messages_reads_one_page_at_a_time(self, kit: StoreKit) -> None:
        key = kit.key()
        batch = make_messages(60)
        await (await kit.open()).append(key, batch)
        reader = await kit.open()
        pages = reader.iter_messages(key, batch=7)
        before = await self.messages_read(reader)
        first = await pages.__anext__()
        assert await self.messages_read(reader) - before <= 7 + WINDOW_SLACK
        rest = [m async for m in pages]
        assert message_ids([first, *rest]) == message_ids(batch)

    async def test_count_is_exact(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        await store.append(key, make_messages(4))
        await store.append(key, make_messages(3))
        assert await store.count(key) == 7
        assert await (await kit.open()).count(key) == 7

    async def test_delete_removes_messages_and_document(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        other = kit.key(tenant=key.tenant)
        await store.append(key, make_messages(3))
        await store.append(other, make_messages(2))
        await store.save_session(key, AgentSession(session_id=key.session_id, tenant=key.tenant))
        assert await store.delete(key) is True
        assert await store.delete(key) is False
        fresh = await kit.open()
        assert await fresh.load(key) == []
        assert await fresh.count(key) == 0
        assert await fresh.load_session(key) is None
        assert key.session_id not in [s.session_id for s in (await fresh.list_sessions(key.tenant)).items]
        assert await fresh.count(other) == 2

    async def test_delete_of_document_only_session(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        await store.save_session(key, AgentSession(session_id=key.session_id, tenant=key.tenant))
        assert await store.delete(key) is True
        assert await (await kit.open()).load_session(key) is None

    async def test_trim_keeps_newest_and_counts_removed(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        batch = make_messages(10)
        await store.append(key, batch)
        assert await store.trim(key, 3) == 7
        assert message_ids(await (await kit.open()).load(key)) == message_ids(batch[-3:])
        assert await store.trim(key, 5) == 0
        assert await store.trim(key, 3) == 0
        assert await store.count(key) == 3
        more = make_messages(2, "after-trim")
        assert await store.append(key, more) == 2
        assert message_ids(await store.load(key)) == message_ids(batch[-3:] + more)
        assert await store.trim(key, 0) == 5
        assert await (await kit.open()).count(key) == 0

    async def test_trim_counts_as_an_update(self, kit: StoreKit, store: HistoryStore) -> None:
        tenant = kit.tenant("trim-update")
        trimmed, other = SessionKey(tenant, "trimmed"), SessionKey(tenant, "other")
        await store.append(trimmed, make_messages(3))
        await asyncio.sleep(GAP)
        await store.append(other, make_messages(3))  # written after: first in the listing until the trim
        await asyncio.sleep(GAP)
        cutoff = datetime.now(timezone.utc)
        await asyncio.sleep(GAP)
        assert await store.trim(trimmed, 1) == 2
        page = await (await kit.open()).list_sessions(tenant)
        assert [info.session_id for info in page.items] == ["trimmed", "other"], "a trim did not update the session"
        assert page.items[0].updated_at >= cutoff
        assert await store.prune(older_than=cutoff, tenant=tenant) == 1
        fresh = await kit.open()
        assert [await fresh.count(trimmed), await fresh.count(other)] == [1, 0]

    async def test_trim_that_deletes_nothing_is_not_an_update(self, kit: StoreKit, store: HistoryStore) -> None:
        tenant = kit.tenant("trim-noop")
        short, newer = SessionKey(tenant, "short"), SessionKey(tenant, "newer")
        await store.append(short, make_messages(3))
        await asyncio.sleep(GAP)
        await store.append(newer, make_messages(3))
        await asyncio.sleep(GAP)
        before = [(info.session_id, info.updated_at) for info in (await store.list_sessions(tenant)).items]
        assert [session_id for session_id, _ in before] == ["newer", "short"]
        assert await store.trim(short, 3) == 0
        assert await store.trim(short, 10) == 0
        after = [(info.session_id, info.updated_at) for info in (await (await kit.open()).list_sessions(tenant)).items]
        assert after == before, "a trim that deleted nothing changed the session's updated_at"

    async def test_ttl_is_refreshed_by_trim(self, kit: StoreKit) -> None:
        async def trim(store: HistoryStore, key: SessionKey) -> None:
            assert await store.trim(key, 1) == 2  # a trim that deletes is a write

        await self.check_write_restarts_ttl(kit, trim, kept=1, what="trimmed")


def _hard_texts() -> list[str]:
    return [
        "emoji 👩‍👩‍👧‍👦 🎉 🇵🇹 and astral 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
        "RTL مرحبا بالعالم שלום עולם mixed with LTR",
        "combining: e\u0301 a\u0308 n\u0303 (NFD) vs é ä ñ (NFC)",
        "NUL inside: a\x00b\x00\x00c and at the end\x00",
        "controls \x01\x02\x1f\x7f, separators \u2028\u2029, BOM \ufeff, zero width \u200b\u200d",
        'quotes \' " ` backslashes \\ \\\\ and escapes \\n \\u0000 {"v":1,"x":[1,2]}',
        "line\r\nbreaks\rand\ttabs\n",
        "",
        " ",
    ]


def _megabyte_text() -> str:
    # Mixed 1-, 2-, 3- and 4-byte UTF-8 characters plus a NUL, about 1 MB long.
    unit = "abc é ж 中文 😀 \x00 \u05d0 "
    return (unit * (1_000_000 // len(unit) + 1))[:1_000_000]


class ContentConformance(ConformanceBase):
    """What a message holds comes back exactly: unicode, NULs, large texts, every content type; the size limit."""

    async def test_unicode_and_nul_round_trip(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        batch = [Message(role="user", text=t) for t in _hard_texts()]
        await store.append(key, batch)
        loaded = await (await kit.open()).load(key)
        assert texts(loaded) == _hard_texts()
        assert [m.to_record() for m in loaded] == [m.to_record() for m in batch]

    async def test_one_megabyte_texts_round_trip(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        big = _megabyte_text()
        batch = [Message(role="user", text=big), Message(role="assistant", text=big[::-1])]
        assert await store.append(key, batch) == 2
        loaded = await (await kit.open()).load(key)
        assert len(loaded) == 2
        assert loaded[0].text == big
        assert loaded[1].text == big[::-1]

    async def test_every_content_type_round_trips_losslessly(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        call = Message(
            message_id="assistant-call-1",
            role="assistant",
            author_name="Planner 🤖",
            created_at=datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=timezone(timedelta(hours=5, minutes=30))),
            contents=[
                TextContent(text="let me look"),
                FunctionCallContent(call_id="call_1", name="get_weather", arguments='{"city": "Zürich", "days": 3}'),
                FunctionCallContent(call_id="call_2", name="no_args", arguments=""),
                UsageContent(usage=Usage(input_tokens=12, output_tokens=34, total_tokens=46)),
            ],
            additional_properties={
                "trace": {"id": "abc", "spans": [1, 2.5, None, True, "ü"]},
                "big": 2**62,
                "ключ": "значение",
                "empty": {},
            },
        )
        results = Message(
            role="tool",
            contents=[
                FunctionResultContent(call_id="call_1", result={"temp": -3.5, "sky": ["snow", None]}),
                FunctionResultContent(call_id="call_2", result="boom", is_error=True),
                FunctionResultContent(call_id="call_3"),
            ],
        )
        media = Message(
            role="user",
            author_name="",
            contents=[
                DataContent(
                    data="iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk", media_type="image/png"
                ),
                UriContent(uri="https://example.com/a%20b?c=d#e", media_type="text/html"),
                UriContent(uri="file-abc123"),
            ],
        )
        await store.append(key, [call, results, media])
        loaded = await (await kit.open()).load(key)
        assert loaded == [call, results, media]
        assert [m.to_record() for m in loaded] == [m.to_record() for m in (call, results, media)]
        assert loaded[0].created_at.utcoffset() == timedelta(hours=5, minutes=30)

    async def test_message_over_limit_stores_nothing(self, kit: StoreKit) -> None:
        key = kit.key()
        store = await kit.open(max_message_bytes=10_000)
        # The limit is in UTF-8 bytes: 4,000 "é" (8,000 bytes) fit, 6,000 (12,000 bytes) do not.
        fits = Message(role="user", text="é" * 4_000)
        too_big = Message(role="user", text="é" * 6_000)
        with pytest.raises(MessageTooLargeError):
            await store.append(key, [make_messages(1)[0], too_big, make_messages(1)[0]])
        assert await (await kit.open()).count(key) == 0
        assert await store.append(key, [fits]) == 1
        with pytest.raises(MessageTooLargeError):
            await store.append(key, [too_big])
        assert message_ids(await (await kit.open()).load(key)) == [fits.message_id]
