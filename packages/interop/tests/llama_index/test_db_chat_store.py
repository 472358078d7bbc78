"""ChatkeepDBChatStore: the store of LlamaIndex's ``Memory`` (active and archived messages), on every backend.

The contract checks follow ``AsyncDBChatStore``'s methods (statuses, counting, archiving the oldest, replacing,
deleting by status); then LlamaIndex's own ``Memory`` runs on it, sync and async, moving its oldest messages to
the archive as its token limit asks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from llama_index.core.llms import ChatMessage
from llama_index.core.memory import Memory
from llama_index.core.storage.chat_store.base_db import MessageStatus

from chatkeep.core import InvalidArgumentError, InvalidSessionKeyError
from chatkeep.interop.llama_index import ChatkeepChatStore, ChatkeepDBChatStore

ACTIVE, ARCHIVED = MessageStatus.ACTIVE, MessageStatus.ARCHIVED


def user(text: str) -> ChatMessage:
    return ChatMessage(role="user", content=text)


def texts(messages: list[ChatMessage]) -> list[str | None]:
    return [message.content for message in messages]


@pytest.fixture
async def db(store_url: str, tenant: str) -> AsyncIterator[ChatkeepDBChatStore]:
    store = ChatkeepDBChatStore(store_url, tenant=tenant)
    try:
        yield store
    finally:
        await store.aclose()


async def test_messages_by_status_count_and_read_in_order(db: ChatkeepDBChatStore) -> None:
    await db.add_messages("k", [user("a"), user("b"), user("c")])
    await db.add_message("k", user("old"), status=ARCHIVED)
    assert texts(await db.get_messages("k")) == ["a", "b", "c"]
    assert texts(await db.get_messages("k", status=ARCHIVED)) == ["old"]
    assert texts(await db.get_messages("k", status=None)) == ["old", "a", "b", "c"]
    assert texts(await db.get_messages("k", status=None, offset=1, limit=2)) == ["a", "b"]
    assert (await db.count_messages("k"), await db.count_messages("k", ARCHIVED)) == (3, 1)
    assert await db.count_messages("k", None) == 4
    assert await db.get_messages("nobody") == []
    with pytest.raises(InvalidArgumentError, match="limit"):
        await db.get_messages("k", limit=-1)


async def test_archiving_and_deleting_the_oldest(db: ChatkeepDBChatStore) -> None:
    await db.add_messages("k", [user(str(n)) for n in range(6)])
    assert texts(await db.archive_oldest_messages("k", 2)) == ["0", "1"]
    assert texts(await db.archive_oldest_messages("k", 1)) == ["2"]
    assert texts(await db.get_messages("k")) == ["3", "4", "5"]
    assert texts(await db.get_messages("k", status=ARCHIVED)) == ["0", "1", "2"]
    assert texts(await db.delete_oldest_messages("k", 1)) == ["3"]
    assert texts(await db.get_messages("k", status=None)) == ["0", "1", "2", "4", "5"]
    assert texts(await db.archive_oldest_messages("k", 10)) == ["4", "5"]  # more than there are: all of them
    assert await db.get_messages("k") == []
    assert await db.archive_oldest_messages("k", 1) == []


async def test_set_delete_and_keys(db: ChatkeepDBChatStore) -> None:
    await db.add_messages("k", [user("a"), user("b")])
    await db.archive_oldest_messages("k", 1)
    await db.set_messages("k", [user("x"), user("y")])  # replaces both statuses, as LlamaIndex's SQL store does
    assert texts(await db.get_messages("k", status=None)) == ["x", "y"]
    await db.add_message("other", user("z"), status=ARCHIVED)
    assert sorted(await db.get_keys()) == ["k", "other"]
    assert await db.delete_message("k", 0) == user("x")
    await db.add_message("k", user("old"), status=ARCHIVED)
    await db.delete_messages("k", status=ARCHIVED)
    assert texts(await db.get_messages("k", status=None)) == ["y"]
    await db.delete_messages("k")
    assert await db.count_messages("k", None) == 0
    assert await db.get_keys() == ["other"]


async def test_the_active_messages_are_the_chat_stores_key(db: ChatkeepDBChatStore) -> None:
    await db.add_messages("k", [user("a"), user("b")])
    await db.archive_oldest_messages("k", 1)
    assert isinstance(db.chat_store, ChatkeepChatStore)
    assert texts(await db.chat_store.aget_messages("k")) == ["b"]


async def test_llama_index_memory_archives_its_oldest_messages_here(db: ChatkeepDBChatStore) -> None:
    memory = Memory.from_defaults(session_id="s", chat_store=db, token_limit=60, token_flush_size=10)
    for n in range(12):
        await memory.aput(ChatMessage(role="user" if n % 2 == 0 else "assistant", content=f"message {n} " * 3))
    active = await memory.aget()
    everything = await memory.aget_all()
    assert texts(everything) == [f"message {n} " * 3 for n in range(12)]
    archived = await db.get_messages("s", status=ARCHIVED)
    assert archived  # the token limit moved the oldest out
    assert texts(archived) + texts(await db.get_messages("s")) == texts(everything)
    assert active[-1].content == "message 11 " * 3
    assert active[0].role.value == "user"  # Memory keeps whole turns


@pytest.fixture
def thread_loop() -> Iterator[None]:
    """An event loop set for this thread, closed after the test.

    ``Memory``'s sync methods run each call with LlamaIndex's ``asyncio_run``, which, in a thread without an event
    loop, makes one with ``asyncio.get_event_loop()`` and never closes it (a ResourceWarning later). Given one, it
    runs on it.
    """
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def test_llama_index_memory_sync_methods_run_on_it(store_url: str, tenant: str, thread_loop: None) -> None:
    db = ChatkeepDBChatStore(store_url, tenant=tenant)
    try:
        memory = Memory.from_defaults(session_id="s", chat_store=db, chat_history=[user("earlier")])
        memory.put(ChatMessage(role="assistant", content="noted"))
        assert texts(memory.get()) == ["earlier", "noted"]
        memory.reset()
        assert memory.get_all() == []
    finally:
        db.close()


def test_a_bad_tenant_is_refused() -> None:
    with pytest.raises(InvalidSessionKeyError):
        ChatkeepDBChatStore("memory://", tenant="")
