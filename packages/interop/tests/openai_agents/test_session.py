"""``ChatkeepSession`` as the SDK's ``Session``: the checks of the SDK's own session tests, on every store."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
from agents import Agent, TResponseInputItem
from agents.items import ReasoningItem
from agents.memory import Session, SessionSettings
from openai.types.responses import ResponseReasoningItem
from openai.types.responses.response_reasoning_item import Summary

from chatkeep.core import (
    InvalidArgumentError,
    InvalidSessionKeyError,
    Message,
    MessageFormatError,
    StoreClosedError,
    open_store,
)
from chatkeep.core.backend import SupportsReadProbe
from chatkeep.interop.openai_agents import ChatkeepSession

SessionFactory = Callable[..., Awaitable[ChatkeepSession]]


def _items(*contents: str) -> list[TResponseInputItem]:
    return [cast(TResponseInputItem, {"role": "user", "content": c}) for c in contents]


def _contents(items: list[TResponseInputItem]) -> list[Any]:
    return [cast(dict[str, Any], item).get("content") for item in items]


def _every_kind() -> list[dict[str, Any]]:
    """One item of each kind the SDK writes to a session, as the SDK makes them, plus an unknown future field."""
    reasoning = ResponseReasoningItem(
        id="rs_0a1b",
        type="reasoning",
        summary=[Summary(text="The user wants the weather; call the tool.", type="summary_text")],
        encrypted_content="gAAAAABo" + "Zm9v" * 300,
    )
    return [
        {"role": "user", "content": "What's the weather in Paris?"},
        ReasoningItem(agent=Agent(name="a"), raw_item=reasoning).to_input_item(),  # type: ignore[list-item]
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "weather",
            "arguments": '{"city": "Paris"}',
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21°C"},
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Sunny, 21°C.", "annotations": [], "logprobs": []}],
            "phase": "final_answer",
        },
        {"type": "compaction", "id": "cmp_1", "encrypted_content": "Y29tcGFjdA=="},
        {"type": "a_future_item", "nested": {"list": [1, 2.5, None, True], "empty": {}}, "ünïcode": "✓"},
    ]


async def test_it_is_an_agents_sdk_session(make_session: SessionFactory) -> None:
    session = await make_session()
    assert isinstance(session, Session)
    assert session.session_id == "s1"
    assert session.session_settings == SessionSettings()


async def test_every_item_kind_round_trips_field_for_field(make_session: SessionFactory) -> None:
    written = _every_kind()
    await (await make_session()).add_items(written)  # type: ignore[arg-type]
    # A fresh session (a new store connection) reads exactly what was written.
    assert await (await make_session()).get_items() == written


async def test_items_keep_their_order_across_calls(make_session: SessionFactory) -> None:
    session = await make_session()
    await session.add_items(_items("1", "2"))
    await session.add_items(_items("3"))
    await session.add_items([])
    await session.add_items(_items("4", "5", "6"))
    assert _contents(await session.get_items()) == ["1", "2", "3", "4", "5", "6"]


async def test_limit_returns_the_newest_items_in_order(make_session: SessionFactory) -> None:
    session = await make_session()
    await session.add_items(_items(*map(str, range(10))))
    assert _contents(await session.get_items(limit=3)) == ["7", "8", "9"]
    assert _contents(await session.get_items(limit=10)) == list(map(str, range(10)))
    assert _contents(await session.get_items(limit=50)) == list(map(str, range(10)))
    assert await session.get_items(limit=0) == []


async def test_a_window_reads_only_its_items_from_the_store_however_long_the_history(
    make_session: SessionFactory,
) -> None:
    session = await make_session(session_settings={"limit": 20})
    for start in range(0, 2_000, 500):
        await session.add_items(_items(*(str(n) for n in range(start, start + 500))))
    store = session.store
    assert isinstance(store, SupportsReadProbe)
    before = store.messages_read
    assert _contents(await session.get_items()) == [str(n) for n in range(1_980, 2_000)]
    # The window and one item more (to see whether the window starts mid-response), not the 2,000.
    assert store.messages_read - before == 21
    before = store.messages_read
    assert len(await session.get_items(limit=5)) == 5
    assert store.messages_read - before == 6


async def test_a_negative_limit_says_what_is_accepted(make_session: SessionFactory) -> None:
    session = await make_session()
    with pytest.raises(InvalidArgumentError, match="0 or more"):
        await session.get_items(limit=-1)


async def test_the_settings_limit_is_the_default_and_an_explicit_limit_wins(make_session: SessionFactory) -> None:
    session = await make_session(session_settings={"limit": 2})
    assert session.session_settings == SessionSettings(limit=2)
    await session.add_items(_items("a", "b", "c", "d"))
    assert _contents(await session.get_items()) == ["c", "d"]
    assert _contents(await session.get_items(limit=3)) == ["b", "c", "d"]


async def test_pop_item_on_an_empty_session_returns_none(make_session: SessionFactory) -> None:
    assert await (await make_session()).pop_item() is None


async def test_pop_item_removes_and_returns_the_newest_until_empty(make_session: SessionFactory) -> None:
    session = await make_session()
    written = _every_kind()
    await session.add_items(written)  # type: ignore[arg-type]
    for expected in reversed(written):
        assert await session.pop_item() == expected
    assert await session.pop_item() is None
    assert await session.get_items() == []


async def test_concurrent_pops_return_distinct_items(make_session: SessionFactory) -> None:
    session = await make_session()
    await session.add_items(_items(*map(str, range(8))))
    popped = await asyncio.gather(*(session.pop_item() for _ in range(10)))
    contents = sorted(cast(dict[str, Any], item)["content"] for item in popped if item is not None)
    assert contents == list(map(str, range(8)))
    assert popped.count(None) == 2


async def test_pops_through_separate_store_connections_return_each_item_once(make_session: SessionFactory) -> None:
    await (await make_session()).add_items(_items(*map(str, range(16))))
    # Eight sessions of one id, each on a store it opened itself: eight connections (processes, in production).
    sessions = [await make_session() for _ in range(8)]
    popped = await asyncio.gather(*(s.pop_item() for s in sessions for _ in range(3)))
    contents = sorted((cast(dict[str, Any], item)["content"] for item in popped if item is not None), key=int)
    assert contents == list(map(str, range(16)))
    assert popped.count(None) == 8
    assert await sessions[0].get_items() == []


async def test_clear_session_empties_only_this_session(make_session: SessionFactory) -> None:
    mine, other = await make_session("mine"), await make_session("other")
    await mine.add_items(_items("a", "b"))
    await other.add_items(_items("keep"))
    await mine.clear_session()
    assert await mine.get_items() == []
    assert await mine.pop_item() is None
    assert _contents(await other.get_items()) == ["keep"]
    await mine.add_items(_items("again"))
    assert _contents(await mine.get_items()) == ["again"]


async def test_sessions_of_another_id_or_tenant_are_separate(store_url: str, tenant: str) -> None:
    sessions = [
        ChatkeepSession("Alice", store=store_url, tenant=tenant),
        ChatkeepSession("alice", store=store_url, tenant=tenant),
        ChatkeepSession("Alice", store=store_url, tenant=tenant + "-b"),
    ]
    try:
        for n, session in enumerate(sessions):
            await session.add_items(_items(f"from {n}"))
        assert [_contents(await s.get_items()) for s in sessions] == [["from 0"], ["from 1"], ["from 2"]]
    finally:
        for session in sessions:
            await session.clear_session()
            await session.close()


async def test_add_items_from_8_concurrent_tasks_lose_and_interleave_nothing(make_session: SessionFactory) -> None:
    session = await make_session()

    async def writer(task: int) -> None:
        for turn in range(3):
            await session.add_items(_items(*(f"{task}-{turn}-{k}" for k in range(4))))

    await asyncio.gather(*(writer(task) for task in range(8)))
    contents = cast(list[str], _contents(await session.get_items()))
    assert sorted(contents) == sorted(f"{t}-{u}-{k}" for t in range(8) for u in range(3) for k in range(4))
    # Each add_items is one atomic append: its 4 items stay together, in their order.
    for start in range(0, len(contents), 4):
        task, turn, _ = contents[start].split("-")
        assert contents[start : start + 4] == [f"{task}-{turn}-{k}" for k in range(4)]


async def test_unicode_and_special_characters_are_kept_exactly(make_session: SessionFactory) -> None:
    texts = ["こんにちは", "😊👍", "Привет", "O'Reilly", "Robert'); DROP TABLE students;--", "a\x00b", "e\u0301 é", ""]
    session = await make_session("sessão ✓/é")
    await session.add_items(_items(*texts))
    assert _contents(await (await make_session("sessão ✓/é")).get_items()) == texts


async def test_large_items_are_kept_exactly(make_session: SessionFactory) -> None:
    big = "".join(chr(0x4E00 + n % 2000) for n in range(300_000))  # ~900 KB of UTF-8
    item = {"type": "function_call_output", "call_id": "c1", "output": big}
    session = await make_session()
    await session.add_items([{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}, item])  # type: ignore[list-item]
    assert (await session.get_items(limit=1)) == []  # the output's call is outside a window of 1
    assert (await session.get_items())[1] == item


async def test_an_item_that_is_not_json_is_refused_with_nothing_stored(make_session: SessionFactory) -> None:
    session = await make_session()
    with pytest.raises(MessageFormatError, match="JSON"):
        await session.add_items([*_items("ok"), cast(TResponseInputItem, {"role": "user", "content": object()})])
    assert await session.get_items() == []


async def test_a_message_not_written_by_the_adapter_is_named(store_url: str, tenant: str) -> None:
    session = ChatkeepSession("mixed", store=store_url, tenant=tenant)
    try:
        await session.store.append(session._key, [Message(role="user", text="from chatkeep's own agent")])
        with pytest.raises(MessageFormatError, match="not written through ChatkeepSession"):
            await session.get_items()
        with pytest.raises(MessageFormatError, match="not written through ChatkeepSession"):
            await session.pop_item()
    finally:
        await session.clear_session()
        await session.close()


def test_a_bad_session_id_is_refused() -> None:
    with pytest.raises(InvalidSessionKeyError):
        ChatkeepSession("", store="memory://")


async def test_close_closes_a_store_opened_from_a_url(make_session: SessionFactory) -> None:
    session = await make_session()
    await session.close()
    await session.close()  # idempotent
    with pytest.raises(StoreClosedError):
        await session.get_items()
    with pytest.raises(StoreClosedError):
        await session.add_items([])


async def test_close_leaves_a_store_object_to_its_owner() -> None:
    async with open_store("memory://") as store:
        session = ChatkeepSession("s1", store=store)
        await session.add_items(_items("a"))
        await session.close()
        assert _contents(await ChatkeepSession("s1", store=store).get_items()) == ["a"]


async def test_add_items_from_a_thread_pool_while_this_loop_uses_the_session(make_session: SessionFactory) -> None:
    # Each worker thread runs its own event loop (asyncio.run), as code calling the SDK from a thread pool does.
    session = await make_session()
    await session.add_items(_items("first"))

    def add(n: int) -> None:
        asyncio.run(session.add_items(_items(f"{n}-a", f"{n}-b")))

    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        added = [asyncio.wrap_future(pool.submit(add, n)) for n in range(10)]
        await session.add_items(_items("meanwhile"))
        await asyncio.gather(*added)
    contents = cast(list[str], _contents(await session.get_items()))
    assert contents[0] == "first"
    assert sorted(contents) == sorted(["first", "meanwhile", *(f"{n}-{s}" for n in range(10) for s in "ab")])
    for n in range(10):  # each add_items stays one atomic append
        assert contents.index(f"{n}-b") == contents.index(f"{n}-a") + 1
