"""ChatkeepChatStore against LlamaIndex's chat-store contract, on memory, SQLite, PostgreSQL and Redis.

The checks mirror LlamaIndex's own chat store tests (``SimpleChatStore``'s, and the Redis integration's,
``delete_message`` table included), plus what its stores get wrong or leave out: order after
``delete_message``, atomic ``delete_last_message``, concurrent writers, tenants, unicode and large messages.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from llama_index.core.base.llms.types import ImageBlock, TextBlock, ThinkingBlock, ToolCallBlock
from llama_index.core.llms import ChatMessage, MessageRole
from llama_index.core.memory import ChatMemoryBuffer

from chatkeep.core import (
    InvalidArgumentError,
    InvalidSessionKeyError,
    Message,
    MessageFormatError,
    SessionKey,
    StoreConfigurationError,
    open_store,
)
from chatkeep.interop import llama_index as llama_index_adapter
from chatkeep.interop._envelope import ENVELOPE_KEY, wrap
from chatkeep.interop.llama_index import FORMAT, ChatkeepChatStore


def user(text: str) -> ChatMessage:
    return ChatMessage(role=MessageRole.USER, content=text, additional_kwargs={"metadata": {"source": "test"}})


def texts(messages: list[ChatMessage]) -> list[str | None]:
    return [message.content for message in messages]


def test_messages_come_back_in_order_per_key(chat_store: ChatkeepChatStore) -> None:
    for key in ("user1", "user2"):
        chat_store.add_message(key, ChatMessage(role="user", content="hello"))
        chat_store.add_message(key, ChatMessage(role="assistant", content="world"))
    expected = [ChatMessage(role="user", content="hello"), ChatMessage(role="assistant", content="world")]
    assert chat_store.get_messages("user1") == expected
    assert chat_store.get_messages("user2") == expected
    assert sorted(chat_store.get_keys()) == ["user1", "user2"]
    assert chat_store.get_messages("nobody") == []


def test_add_message_at_an_index_inserts_there(chat_store: ChatkeepChatStore) -> None:
    for text in ("b", "d"):
        chat_store.add_message("k", user(text))
    chat_store.add_message("k", user("a"), idx=0)
    chat_store.add_message("k", user("c"), idx=2)
    chat_store.add_message("k", user("e"), idx=99)  # past the end: appended, as list.insert does
    assert texts(chat_store.get_messages("k")) == ["a", "b", "c", "d", "e"]
    with pytest.raises(InvalidArgumentError, match="0 or more"):
        chat_store.add_message("k", user("x"), idx=-1)


def test_get_messages_last_reads_the_newest(chat_store: ChatkeepChatStore) -> None:
    chat_store.set_messages("k", [user(str(n)) for n in range(5)])
    assert texts(chat_store.get_messages("k", last=2)) == ["3", "4"]
    assert texts(chat_store.get_messages("k", last=50)) == ["0", "1", "2", "3", "4"]
    assert chat_store.get_messages("k", last=0) == []


def test_get_keys_lists_only_this_tenant_with_messages(
    chat_store: ChatkeepChatStore, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llama_index_adapter, "_PAGE", 2)  # seven keys take four pages
    other = ChatkeepChatStore(store_url, tenant=f"{chat_store.tenant}-other")
    try:
        other.add_message("theirs", user("x"))
        for n in range(7):
            chat_store.add_message(f"key-{n}", user("x"))
        chat_store.delete_messages("key-3")
        assert sorted(chat_store.get_keys()) == sorted(f"key-{n}" for n in range(7) if n != 3)
        assert other.get_keys() == ["theirs"]
    finally:
        other.delete_messages("theirs")
        other.close()


def test_delete_messages_clears_one_key(chat_store: ChatkeepChatStore) -> None:
    for key in ("user1", "user2"):
        chat_store.set_messages(key, [user("hello"), user("world")])
    assert chat_store.delete_messages("user1") is None
    assert chat_store.get_messages("user1") == []
    assert texts(chat_store.get_messages("user2")) == ["hello", "world"]
    chat_store.delete_messages("never-there")


def test_set_messages_replaces_the_history(chat_store: ChatkeepChatStore) -> None:
    chat_store.set_messages("k", [user("old-1"), user("old-2"), user("old-3")])
    chat_store.set_messages("k", [user("new-1"), user("new-2")])
    assert texts(chat_store.get_messages("k")) == ["new-1", "new-2"]
    chat_store.set_messages("k", [])
    assert chat_store.get_messages("k") == []


def test_delete_last_message_on_full_and_empty_keys(chat_store: ChatkeepChatStore) -> None:
    chat_store.set_messages("k", [user("hello"), user("world")])
    assert chat_store.delete_last_message("k") == user("world")
    assert texts(chat_store.get_messages("k")) == ["hello"]
    assert chat_store.delete_last_message("k") == user("hello")
    assert chat_store.delete_last_message("k") is None
    assert chat_store.delete_last_message("never-there") is None


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(
    ("contents", "idx", "expected"),
    [
        pytest.param(["A", "B", "C"], 0, ["B", "C"], id="first"),
        pytest.param(["A", "B", "C", "D"], 1, ["A", "C", "D"], id="middle"),
        pytest.param(["A", "B", "C"], 2, ["A", "B"], id="last"),
        pytest.param(["A"], 0, [], id="only-message"),
        pytest.param(["A", "B", "C"], -1, ["A", "B", "C"], id="negative-index"),
        pytest.param(["A", "B", "C"], 3, ["A", "B", "C"], id="out-of-range"),
        pytest.param([], 0, [], id="missing-key"),
        pytest.param(["A", "B", "A"], 2, ["A", "B"], id="duplicate-content"),
        pytest.param(["A", "B", "A", "C"], 0, ["B", "A", "C"], id="duplicate-content-first"),
    ],
)
async def test_delete_message_removes_exactly_that_index_and_keeps_order(
    chat_store: ChatkeepChatStore, use_async: bool, contents: list[str], idx: int, expected: list[str]
) -> None:
    messages = [user(text) for text in contents]
    if use_async:
        await chat_store.aset_messages("k", messages)
        removed = await chat_store.adelete_message("k", idx)
        remaining = await chat_store.aget_messages("k")
    else:
        chat_store.set_messages("k", messages)
        removed = chat_store.delete_message("k", idx)
        remaining = chat_store.get_messages("k")
    assert removed == (messages[idx] if 0 <= idx < len(messages) else None)
    assert texts(remaining) == expected
    assert all(m.additional_kwargs == {"metadata": {"source": "test"}} for m in remaining)


def test_a_bad_index_is_refused(chat_store: ChatkeepChatStore) -> None:
    with pytest.raises(InvalidArgumentError, match="whole number"):
        chat_store.delete_message("k", "1")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="whole number"):
        chat_store.delete_message("k", True)


async def test_eight_tasks_adding_at_once_lose_nothing(chat_store: ChatkeepChatStore) -> None:
    async def writer(task: int) -> None:
        for n in range(5):
            await chat_store.async_add_message("k", user(f"{task}-{n}"))

    await asyncio.gather(*(writer(task) for task in range(8)))
    stored = [str(text) for text in texts(await chat_store.aget_messages("k"))]
    assert sorted(stored) == sorted(f"{task}-{n}" for task in range(8) for n in range(5))
    for task in range(8):  # each writer's own messages stay in its order
        assert [t for t in stored if t.startswith(f"{task}-")] == [f"{task}-{n}" for n in range(5)]


async def test_eight_tasks_deleting_the_last_message_get_distinct_messages(chat_store: ChatkeepChatStore) -> None:
    await chat_store.aset_messages("k", [user(str(n)) for n in range(12)])
    popped = await asyncio.gather(*(chat_store.adelete_last_message("k") for _ in range(8)))
    assert sorted(str(m.content) for m in popped if m is not None) == sorted(str(n) for n in range(4, 12))
    assert texts(await chat_store.aget_messages("k")) == ["0", "1", "2", "3"]


async def test_sync_and_async_calls_of_one_store_mix(chat_store: ChatkeepChatStore) -> None:
    # As LlamaIndex does: ChatMemoryBuffer.aget reads with the sync API on a worker thread while aput writes
    # with the async one, and a sync call may also come from the event loop's own thread.
    chat_store.add_message("k", user("sync on the loop thread"))
    await chat_store.async_add_message("k", user("async"))
    reads: list[int] = []

    def reader() -> None:
        reads.append(len(chat_store.get_messages("k")))

    await asyncio.gather(asyncio.to_thread(reader), chat_store.async_add_message("k", user("async 2")))
    thread = threading.Thread(target=chat_store.add_message, args=("k", user("plain thread")))
    thread.start()
    thread.join()
    assert len(reads) == 1
    assert reads[0] >= 2
    assert sorted(str(t) for t in texts(chat_store.get_messages("k"))) == sorted(
        ["sync on the loop thread", "async", "async 2", "plain thread"]
    )


def test_unicode_and_large_messages_round_trip(chat_store: ChatkeepChatStore) -> None:
    big = "ハロー héllo 🚀 " * 40_000  # about 700 kB of UTF-8
    chat_store.add_message("ключ-🔑", ChatMessage(role="user", content="ハロー héllo"))
    chat_store.add_message("ключ-🔑", ChatMessage(role="assistant", content=big))
    assert texts(chat_store.get_messages("ключ-🔑")) == ["ハロー héllo", big]
    assert "ключ-🔑" in chat_store.get_keys()


def rich_message() -> ChatMessage:
    return ChatMessage(
        role=MessageRole.ASSISTANT,
        blocks=[
            TextBlock(text="Let me look."),
            ImageBlock(image=b"\x89PNG\r\n\x1a\n", image_mimetype="image/png", detail="low"),
            ToolCallBlock(tool_call_id="call_1", tool_name="lookup", tool_kwargs={"q": "état", "n": [1, 2]}),
        ],
        additional_kwargs={
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}],
            "nested": {"list": [1, 2.5, None, True], "text": "ünïcode"},
        },
    )


async def test_every_field_and_block_round_trips(chat_store: ChatkeepChatStore) -> None:
    messages = [
        ChatMessage(role=MessageRole.SYSTEM, content="be brief"),
        rich_message(),
        ChatMessage(role=MessageRole.TOOL, content="42", additional_kwargs={"tool_call_id": "call_1", "name": "x"}),
        ChatMessage(role=MessageRole.DEVELOPER, content="dev"),
        ChatMessage(  # a reasoning model's thinking, with the signature its API needs to take it back
            role=MessageRole.ASSISTANT,
            blocks=[
                ThinkingBlock(content="The user asked for 42.", num_tokens=7, additional_information={"sig": "c2ln"}),
                TextBlock(text="42"),
            ],
        ),
    ]
    await chat_store.aset_messages("k", messages)
    back = await chat_store.aget_messages("k")
    assert [m.model_dump(mode="json") for m in back] == [m.model_dump(mode="json") for m in messages]
    assert back[1].blocks[1].image == messages[1].blocks[1].image


def test_the_stored_message_keeps_the_item_and_a_readable_rendering(store_url: str, tenant: str) -> None:
    view = open_store(store_url).sync()
    chat_store = ChatkeepChatStore(view, tenant=tenant)
    try:
        chat_store.add_message("k", rich_message())
        (stored,) = view.load(SessionKey(tenant, "k"))
        assert stored.role == "assistant"
        assert stored.text == "Let me look."
        envelope = stored.additional_properties[ENVELOPE_KEY]
        assert envelope == {"format": FORMAT, "item": rich_message().model_dump(mode="json")}
    finally:
        chat_store.close()
        view.delete(SessionKey(tenant, "k"))
        assert not view.closed  # a SyncHistoryStore passed in stays its owner's
        view.close()


def test_a_field_a_later_llama_index_adds_is_stored(store_url: str, tenant: str) -> None:
    class LaterChatMessage(ChatMessage):
        importance: int = 0

    chat_store = ChatkeepChatStore(store_url, tenant=tenant)
    try:
        chat_store.add_message("k", LaterChatMessage(role="user", content="hi", importance=3))
        (stored,) = chat_store.store.load(SessionKey(tenant, "k"))
        assert stored.additional_properties[ENVELOPE_KEY]["item"]["importance"] == 3  # type: ignore[index,call-overload]
        assert chat_store.get_messages("k") == [ChatMessage(role="user", content="hi")]
    finally:
        chat_store.close()


def test_a_store_object_is_taken_over_and_a_sync_view_stays_yours() -> None:
    store = open_store("memory://")
    ChatkeepChatStore(store).close()
    assert store.closed  # it ran on the chat store's loop thread: nothing else could close it there
    view = open_store("memory://").sync()
    with pytest.raises(StoreConfigurationError, match="only apply to a store opened from a URL"):
        ChatkeepChatStore(view, store_options={"ttl": 60})
    ChatkeepChatStore(view).close()
    assert not view.closed
    view.close()


def test_messages_chatkeep_wrote_itself_read_as_their_role_and_text(chat_store: ChatkeepChatStore) -> None:
    key = SessionKey(chat_store.tenant, "k")
    chat_store.store.append(key, [Message(role="user", text="from a chatkeep agent")])
    assert chat_store.get_messages("k") == [ChatMessage(role="user", content="from a chatkeep agent")]


def test_another_frameworks_session_is_refused_with_its_name(chat_store: ChatkeepChatStore) -> None:
    key = SessionKey(chat_store.tenant, "k")
    chat_store.store.append(key, [wrap({"type": "message"}, format="openai-agents.item", role="user")])
    with pytest.raises(MessageFormatError, match=r"openai-agents\.item"):
        chat_store.get_messages("k")


def test_wrong_input_says_what_to_do() -> None:
    with pytest.raises(InvalidSessionKeyError):
        ChatkeepChatStore("memory://", tenant="")
    with pytest.raises(StoreConfigurationError, match="store URL"):
        ChatkeepChatStore(42)  # type: ignore[arg-type]
    chat_store = ChatkeepChatStore("memory")
    try:
        with pytest.raises(InvalidArgumentError, match="ChatMessage"):
            chat_store.add_message("k", "hello")  # type: ignore[arg-type]
        with pytest.raises(InvalidSessionKeyError):
            chat_store.get_messages("")
        with pytest.raises(MessageFormatError, match="not JSON"):
            chat_store.add_message("k", ChatMessage(content="x", additional_kwargs={"when": object()}))
        assert chat_store.get_messages("k") == []
    finally:
        chat_store.close()


def test_chat_memory_buffer_runs_on_it(chat_store: ChatkeepChatStore) -> None:
    memory = ChatMemoryBuffer.from_defaults(chat_store=chat_store, chat_store_key="user-1", token_limit=5)
    memory.put(ChatMessage(role="user", content="one two three"))
    memory.put(ChatMessage(role="assistant", content="four five six"))
    memory.put(ChatMessage(role="user", content="seven"))
    assert texts(memory.get_all()) == ["one two three", "four five six", "seven"]
    assert texts(memory.get()) == ["seven"]  # the token window, computed by LlamaIndex
    memory.set([ChatMessage(role="user", content="reset")])
    assert texts(chat_store.get_messages("user-1")) == ["reset"]
    dumped: dict[str, Any] = memory.to_dict()
    assert dumped["chat_store"] == {"tenant": chat_store.tenant, "class_name": "ChatkeepChatStore"}
    memory.reset()
    assert chat_store.get_messages("user-1") == []


async def test_chat_memory_buffer_async_api_runs_on_it(chat_store: ChatkeepChatStore) -> None:
    memory = ChatMemoryBuffer.from_defaults(chat_store=chat_store, chat_store_key="user-1")
    await memory.aput(ChatMessage(role="user", content="hi"))
    await memory.aput_messages([ChatMessage(role="assistant", content="hello"), ChatMessage(content="bye")])
    assert texts(await memory.aget()) == ["hi", "hello", "bye"]
    await memory.areset()
    assert await memory.aget_all() == []
