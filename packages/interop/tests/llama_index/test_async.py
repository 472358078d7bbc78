"""ChatkeepChatStore's async methods: they await the store on its view's loop thread, with no worker thread.

Every async method keeps the caller's event loop free while the store works (another task runs meanwhile);
none hops through a worker thread (``asyncio.to_thread``); a cancelled append is stored whole or not at all,
and a cancelled multi-step write (``adelete_message``, ``aset_messages``) still finishes whole.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from llama_index.core.llms import ChatMessage

from chatkeep.interop.llama_index import ChatkeepChatStore


def user(text: str) -> ChatMessage:
    return ChatMessage(role="user", content=text)


def texts(messages: list[ChatMessage]) -> list[str | None]:
    return [message.content for message in messages]


@pytest.fixture
def gated(gated_store: Any) -> Iterator[tuple[ChatkeepChatStore, Any]]:
    store = gated_store
    chat_store = ChatkeepChatStore(store, tenant="acme")
    try:
        yield chat_store, store
    finally:
        chat_store.close()


CALLS: dict[str, Callable[[ChatkeepChatStore], Awaitable[object]]] = {
    "aget_messages": lambda s: s.aget_messages("k"),
    "aget_messages-last": lambda s: s.aget_messages("k", last=2),
    "aget_keys": lambda s: s.aget_keys(),
    "async_add_message": lambda s: s.async_add_message("k", user("new")),
    "async_add_message-idx": lambda s: s.async_add_message("k", user("new"), idx=1),
    "async_add_messages": lambda s: s.async_add_messages("k", [user("new"), user("newer")]),
    "aset_messages": lambda s: s.aset_messages("k", [user("new")]),
    "adelete_messages": lambda s: s.adelete_messages("k"),
    "adelete_last_message": lambda s: s.adelete_last_message("k"),
    "adelete_message-first": lambda s: s.adelete_message("k", 0),
    "adelete_message-middle": lambda s: s.adelete_message("k", 1),
}


@pytest.mark.parametrize("name", list(CALLS))
async def test_an_async_method_keeps_the_callers_loop_free_and_uses_no_worker_thread(
    gated: tuple[ChatkeepChatStore, Any], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    chat_store, store = gated
    chat_store.set_messages("k", [user("a"), user("b"), user("c")])
    await store.run_with_the_loop_free(CALLS[name](chat_store), monkeypatch)


async def test_a_cancelled_append_is_stored_whole_or_not_at_all(gated: tuple[ChatkeepChatStore, Any]) -> None:
    chat_store, store = gated
    store.armed = True
    adding = asyncio.ensure_future(chat_store.async_add_messages("k", [user("one"), user("two"), user("three")]))
    await asyncio.to_thread(store.waiting.wait, 10)
    adding.cancel()
    with pytest.raises(asyncio.CancelledError):
        await adding
    store.opened.set()  # too late: the append was cancelled on the loop thread, before it stored anything
    await asyncio.sleep(0.1)
    assert await chat_store.aget_messages("k") == []
    store.armed, store.opened = False, threading.Event()
    await chat_store.async_add_message("k", user("after"))
    assert texts(await chat_store.aget_messages("k")) == ["after"]


async def test_cancelled_appends_at_any_moment_are_each_whole_or_absent(store_url: str, tenant: str) -> None:
    chat_store = ChatkeepChatStore(store_url, tenant=tenant)
    try:
        for n in range(20):  # cancel after a growing delay: before, during and after the store's write
            batch = [user(f"{n}-{part}") for part in range(5)]
            adding = asyncio.ensure_future(chat_store.async_add_messages("k", batch))
            await asyncio.sleep(n * 0.0005)
            adding.cancel()
            await asyncio.gather(adding, return_exceptions=True)
        await asyncio.sleep(0.2)  # let a write that was past the point of no return land
        stored = [str(text) for text in texts(await chat_store.aget_messages("k"))]
        batches = [stored[n : n + 5] for n in range(0, len(stored), 5)]
        assert len(stored) % 5 == 0
        for batch in batches:
            prefix = batch[0].split("-")[0]
            assert batch == [f"{prefix}-{part}" for part in range(5)]
    finally:
        await chat_store.aclose()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("adelete_message-middle", ["a", "c", "d"], id="delete-middle"),
        pytest.param("async_add_message-idx", ["a", "new", "b", "c", "d"], id="insert"),
        pytest.param("aset_messages", ["new"], id="set"),
    ],
)
async def test_a_cancelled_multi_step_write_still_finishes_whole(
    gated: tuple[ChatkeepChatStore, Any], name: str, expected: list[str]
) -> None:
    chat_store, store = gated
    chat_store.set_messages("k", [user(text) for text in "abcd"])
    store.armed = True
    writing = asyncio.ensure_future(CALLS[name](chat_store))
    await asyncio.to_thread(store.waiting.wait, 10)
    writing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writing
    store.opened.set()
    for _ in range(200):  # the write goes on, on the view's loop thread
        if texts(chat_store.get_messages("k")) == expected:
            break
        await asyncio.sleep(0.01)
    assert texts(chat_store.get_messages("k")) == expected


async def test_the_sync_and_async_splice_are_one_rule(gated: tuple[ChatkeepChatStore, Any]) -> None:
    chat_store, store = gated
    chat_store.set_messages("k", [user(text) for text in "abcd"])
    store.calls.clear()
    assert chat_store.delete_message("k", 1) == user("b")
    sync_calls = list(store.calls)
    await chat_store.aset_messages("k", [user(text) for text in "abcd"])
    store.calls.clear()
    assert await chat_store.adelete_message("k", 1) == user("b")
    assert store.calls == sync_calls == ["count", "load", "pop", "pop", "pop", "append"]
    assert texts(await chat_store.aget_messages("k")) == ["a", "c", "d"]
