"""ChatkeepChatMessageHistory as LangChain's chat-history tests use a history, on memory, SQLite, PostgreSQL, Redis.

Equivalents of langchain_core's own checks (the buffer string, add_message and the convenience methods, bulk
add_messages, the async variants) plus what a persistent history owes: order, clear, concurrent writers,
unicode and large messages, a field-for-field round trip, windows that never cap silently, and sync and async
calls mixed on one instance, also from inside a running event loop.
"""

from __future__ import annotations

import asyncio
import datetime
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
)

from chatkeep.core import (
    FunctionCallContent,
    FunctionResultContent,
    InvalidArgumentError,
    InvalidSessionKeyError,
    Message,
    MessageFormatError,
    SessionKey,
    StoreConfigurationError,
    SyncHistoryStore,
    open_store,
)
from chatkeep.interop._envelope import wrap
from chatkeep.interop.langchain import ChatkeepChatMessageHistory
from chatkeep.memory import MemoryHistoryStore

HistoryFactory = Callable[..., ChatkeepChatMessageHistory]  # the ``history`` fixture


def every_kind_of_message() -> list[BaseMessage]:
    """One of each message LangChain writes, with every field it keeps set, and a field it does not know yet."""
    return [
        SystemMessage("You are terse.", id="sys-1"),
        HumanMessage(
            "héllo 🌍 — 你好, ‮right-to-left‬, a NUL \x00 too",
            name="ada",
            id="h-1",
            additional_kwargs={"client": {"locale": "fr-FR", "flags": [1, None, 2.5]}},
        ),
        HumanMessage(
            content=[
                {"type": "text", "text": "what is in this picture?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            ]
        ),
        AIMessage(
            content="",
            id="run-1",
            tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1", "type": "tool_call"}],
            invalid_tool_calls=[
                {
                    "name": "get_time",
                    "args": "{not json",
                    "id": "call_2",
                    "error": "bad JSON",
                    "type": "invalid_tool_call",
                }
            ],
            usage_metadata={
                "input_tokens": 12,
                "output_tokens": 7,
                "total_tokens": 19,
                "input_token_details": {"cache_read": 3},
                "output_token_details": {"reasoning": 2},
            },
            response_metadata={"model_name": "fake-model", "finish_reason": "tool_calls", "logprobs": None},
            additional_kwargs={"refusal": None},
        ),
        ToolMessage(
            "18°C and sunny",
            tool_call_id="call_1",
            name="get_weather",
            artifact={"raw": {"temp_c": 18, "samples": [17.5, 18.25]}, "source": None},
            status="success",
            id="tool-1",
        ),
        ToolMessage(content=[{"type": "text", "text": "no such tool"}], tool_call_id="call_2", status="error"),
        AIMessage(
            content=[
                {"type": "reasoning", "reasoning": "the user wants the weather"},
                {"type": "text", "text": "18°C"},
            ],
            name="assistant-7",
            future_field={"from": "a later LangChain", "values": [1, 2, {"deep": True}]},
        ),
        AIMessageChunk(content="a streamed ", id="run-2", response_metadata={"finish_reason": "stop"}),
        ChatMessage(role="critic", content="could be shorter"),
        FunctionMessage(name="legacy_function", content='{"ok": true}'),
    ]


def contents(messages: list[BaseMessage]) -> list[Any]:
    return [m.content for m in messages]


# -- what langchain_core's own chat-history tests check ---------------------------------------------------


def test_the_buffer_string_and_the_convenience_methods(history: HistoryFactory) -> None:
    chat = history()
    chat.add_message(SystemMessage(content="system"))
    chat.add_user_message("human 1")
    chat.add_ai_message(AIMessage(content="ai"))
    assert str(chat) == "System: system\nHuman: human 1\nAI: ai"
    assert [type(m) for m in chat.messages] == [SystemMessage, HumanMessage, AIMessage]


def test_an_empty_session_has_no_messages(history: HistoryFactory) -> None:
    assert history("never-written").messages == []


def test_batches_keep_append_order_and_one_batch_is_one_atomic_append(history: HistoryFactory) -> None:
    chat = history()
    chat.add_messages([HumanMessage("1"), AIMessage("2")])
    chat.add_messages([HumanMessage("3"), AIMessage("4"), HumanMessage("5")])
    chat.add_message(AIMessage("6"))
    assert contents(chat.messages) == ["1", "2", "3", "4", "5", "6"]
    with pytest.raises(MessageFormatError, match=r"item\['data'\]\['artifact'\]"):
        chat.add_messages([HumanMessage("7"), ToolMessage("x", tool_call_id="c", artifact=datetime.date.today())])
    assert contents(chat.messages) == ["1", "2", "3", "4", "5", "6"], "half of a refused batch was stored"


async def test_the_async_variants(history: HistoryFactory) -> None:
    chat = history()
    await chat.aadd_messages([HumanMessage("hi"), AIMessage("hello")])
    assert contents(await chat.aget_messages()) == ["hi", "hello"]
    await chat.aclear()
    assert await chat.aget_messages() == []


def test_clear_deletes_one_conversation_only(history: HistoryFactory) -> None:
    first, second = history("first"), history("second")
    first.add_messages([HumanMessage("mine")])
    second.add_messages([HumanMessage("yours")])
    first.clear()
    assert first.messages == []
    assert contents(second.messages) == ["yours"]
    first.add_messages([HumanMessage("after clear")])
    assert contents(first.messages) == ["after clear"]


def test_every_field_of_every_kind_of_message_round_trips(history: HistoryFactory, store_url: str, tenant: str) -> None:
    written = every_kind_of_message()
    history().add_messages(written)
    # Read through a new store of the same URL, as a later process would (a memory store lives in its process).
    if not store_url.startswith("memory"):
        with ChatkeepChatMessageHistory("chat", store_url, tenant=tenant) as fresh:
            read = fresh.messages
    else:
        read = history().messages
    assert [message_to_dict(m) for m in read] == [message_to_dict(m) for m in written]
    assert [type(m) for m in read] == [type(m) for m in written]
    assert read == written
    assert read[6].future_field == {"from": "a later LangChain", "values": [1, 2, {"deep": True}]}  # type: ignore[attr-defined]


async def test_every_field_round_trips_through_the_async_methods_too(history: HistoryFactory) -> None:
    chat = history()
    await chat.aadd_messages(every_kind_of_message())
    assert await chat.aget_messages() == every_kind_of_message()


async def test_eight_tasks_add_at_once_and_every_batch_stays_whole_and_in_order(history: HistoryFactory) -> None:
    chat = history()

    async def writer(n: int) -> None:
        await chat.aadd_messages([HumanMessage(f"task {n} part {part}") for part in range(5)])

    await asyncio.gather(*(writer(n) for n in range(8)))
    read = contents(await chat.aget_messages())
    assert sorted(read) == sorted(f"task {n} part {p}" for n in range(8) for p in range(5))
    for start in range(0, 40, 5):
        batch = read[start : start + 5]
        task = batch[0].split(" part ")[0]
        assert batch == [f"{task} part {p}" for p in range(5)], "a batch was split or reordered"


def test_unicode_and_a_large_message_are_kept_exactly(history: HistoryFactory) -> None:
    # About 1 MB of UTF-8. The record keeps it twice (LangChain's form, and chatkeep's readable text beside it),
    # so a message's limit is about half the store's max_message_bytes (4 MB by default).
    large = "".join(chr(c) for c in range(0x20, 0x2FF)) * 700 + " 🧪" * 10_000
    ids = ["Alice", "alice", "café", "cafe\u0301", "a/b", "a%2Fb", "会话 🌍"]
    for n, session_id in enumerate(ids):
        history(session_id).add_messages([HumanMessage(f"{n}: {session_id}")])
    history("large").add_messages([AIMessage(large)])
    assert [history(s).messages[0].content for s in ids] == [f"{n}: {s}" for n, s in enumerate(ids)]
    assert history("large").messages[0].content == large


# -- windows: the newest k, read as just those, never a silent cap ----------------------------------------


def test_a_window_reads_the_newest_messages_in_order(history: HistoryFactory) -> None:
    history().add_messages([HumanMessage(str(n)) for n in range(30)])
    assert contents(history(max_messages=10).messages) == [str(n) for n in range(20, 30)]
    assert contents(history(max_messages=100).messages) == [str(n) for n in range(30)]


async def test_a_window_reads_the_newest_messages_from_async_code_too(history: HistoryFactory) -> None:
    await history().aadd_messages([HumanMessage(str(n)) for n in range(30)])
    assert contents(await history(max_messages=3).aget_messages()) == ["27", "28", "29"]


def test_a_window_never_starts_with_a_tool_result_whose_call_fell_outside_it(history: HistoryFactory) -> None:
    call = AIMessage("", tool_calls=[{"name": "f", "args": {}, "id": "c1"}, {"name": "g", "args": {}, "id": "c2"}])
    answers = [ToolMessage("f done", tool_call_id="c1"), ToolMessage("g done", tool_call_id="c2")]
    history().add_messages([HumanMessage("go"), call, *answers, AIMessage("both done")])
    assert contents(history(max_messages=4).messages) == ["", "f done", "g done", "both done"]
    assert contents(history(max_messages=3).messages) == ["both done"]
    assert len(history().messages) == 5, "the window changed what is stored"
    # A window longer than the history cuts nothing, so nothing is dropped (nor is anything without a window).
    history("starts-with-a-result").add_messages(answers)
    assert contents(history("starts-with-a-result", max_messages=10).messages) == ["f done", "g done"]
    assert contents(history("starts-with-a-result").messages) == ["f done", "g done"]


def test_without_a_window_the_whole_history_is_read_however_long(history: HistoryFactory) -> None:
    chat = history()
    for start in range(0, 10_001, 2_500):
        chat.add_messages([HumanMessage(str(n)) for n in range(start, min(start + 2_500, 10_001))])
    read = chat.messages
    assert len(read) == 10_001  # LangChain's Redis history stops at the oldest 10,000
    assert (read[0].content, read[-1].content) == ("0", "10000")


def test_a_window_asks_the_store_for_just_that_many() -> None:
    asked: list[int | None] = []

    class Recording(MemoryHistoryStore):
        async def load(self, key: SessionKey, *, last: int | None = None) -> list[Message]:
            asked.append(last)
            return await super().load(key, last=last)

    with Recording().sync() as view:
        ChatkeepChatMessageHistory("s", view, max_messages=20).messages  # noqa: B018 - the read is the test
        ChatkeepChatMessageHistory("s", view).messages  # noqa: B018
    assert asked == [20, None]


# -- sync and async on one instance -----------------------------------------------------------------------


async def test_sync_calls_made_inside_the_running_loop_mix_with_async_ones(
    history: HistoryFactory, blocking_on_purpose: Callable[[], AbstractContextManager[None]]
) -> None:
    chat = history()

    def sync_tool() -> int:
        """A plain function that async code calls directly, as a sync LangChain callback or tool would."""
        with blocking_on_purpose():
            chat.add_user_message("from sync code")
            return len(chat.messages)

    await chat.aadd_messages([HumanMessage("from async code")])
    assert sync_tool() == 2
    await chat.aadd_messages([AIMessage("async again")])
    assert contents(await chat.aget_messages()) == ["from async code", "from sync code", "async again"]
    with blocking_on_purpose():
        chat.clear()
    assert await chat.aget_messages() == []


ASYNC_CALLS: dict[str, Callable[[ChatkeepChatMessageHistory], Any]] = {
    "aget_messages": lambda chat: chat.aget_messages(),
    "aadd_messages": lambda chat: chat.aadd_messages([HumanMessage("new")]),
    "aclear": lambda chat: chat.aclear(),
}


@pytest.mark.parametrize("name", list(ASYNC_CALLS))
async def test_an_async_method_keeps_the_callers_loop_free_and_uses_no_worker_thread(
    gated_store: Any, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with gated_store.sync() as view:
        chat = ChatkeepChatMessageHistory("k", view)
        chat.add_messages([HumanMessage("a")])
        await gated_store.run_with_the_loop_free(ASYNC_CALLS[name](chat), monkeypatch)
        assert gated_store.calls[-1] == {"aget_messages": "load", "aadd_messages": "append", "aclear": "delete"}[name]


def test_one_history_serves_two_event_loops_and_plain_threads(history: HistoryFactory) -> None:
    chat = history()

    async def on_a_loop(text: str) -> None:
        await chat.aadd_messages([HumanMessage(text)])
        chat.add_messages([AIMessage(f"{text} (sync)")])

    asyncio.run(on_a_loop("loop 1"))
    asyncio.run(on_a_loop("loop 2"))
    thread = threading.Thread(target=chat.add_messages, args=([HumanMessage("a thread")],))
    thread.start()
    thread.join()
    assert contents(chat.messages) == ["loop 1", "loop 1 (sync)", "loop 2", "loop 2 (sync)", "a thread"]


# -- what a history owes beyond LangChain's tests ---------------------------------------------------------


def test_messages_chatkeep_wrote_itself_read_as_the_closest_langchain_messages(
    view: SyncHistoryStore, history: HistoryFactory, tenant: str
) -> None:
    view.append(
        SessionKey(tenant, "agent"),
        [
            Message(role="system", text="be brief"),
            Message(role="user", text="weather?"),
            Message(
                role="assistant", contents=[FunctionCallContent(call_id="c1", name="weather", arguments='{"q": 1}')]
            ),
            Message(role="tool", contents=[FunctionResultContent(call_id="c1", result={"temp": 18})]),
            Message(role="assistant", text="18"),
        ],
    )
    system, user, call, result, answer = history("agent").messages
    assert (type(system), system.content, type(user), user.content) == (
        SystemMessage,
        "be brief",
        HumanMessage,
        "weather?",
    )
    assert isinstance(call, AIMessage)
    assert [(c["name"], c["args"], c["id"]) for c in call.tool_calls] == [("weather", {"q": 1}, "c1")]
    assert isinstance(result, ToolMessage)
    assert (result.tool_call_id, result.content, result.status) == ("c1", '{"temp": 18}', "success")
    assert (type(answer), answer.content) == (AIMessage, "18")


def test_a_session_another_adapter_wrote_is_named(view: SyncHistoryStore, history: HistoryFactory, tenant: str) -> None:
    view.append(SessionKey(tenant, "agents"), [wrap({"type": "message"}, format="openai-agents", role="user")])
    with pytest.raises(MessageFormatError, match="'openai-agents' item, not 'langchain'"):
        history("agents").messages  # noqa: B018


def test_what_is_not_a_langchain_message_is_refused(history: HistoryFactory) -> None:
    with pytest.raises(MessageFormatError, match="item 1 is a dict, not a LangChain message"):
        history().add_messages([HumanMessage("ok"), {"role": "user", "content": "hi"}])  # type: ignore[list-item]
    assert history().messages == []


def test_bad_arguments_say_what_to_pass() -> None:
    with open_store("memory://").sync() as view:
        for bad in (0, -1, True, 2.5, "20"):
            with pytest.raises(InvalidArgumentError, match="max_messages must be a whole number of at least 1"):
                ChatkeepChatMessageHistory("s", view, max_messages=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidSessionKeyError):
            ChatkeepChatMessageHistory("", view)
        async_store = open_store("memory://")
        with pytest.raises(StoreConfigurationError, match=r"store\.sync\(\)"):
            ChatkeepChatMessageHistory("s", async_store)  # type: ignore[arg-type]


def test_a_history_closes_the_store_it_opened_and_leaves_a_passed_view_open(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/own.db"
    with ChatkeepChatMessageHistory("s", url) as own:
        own.add_user_message("kept")
    assert own._binding.view.closed
    with open_store(url).sync() as view:
        shared = ChatkeepChatMessageHistory("s", view)
        assert contents(shared.messages) == ["kept"]
        shared.close()
        assert not view.closed
