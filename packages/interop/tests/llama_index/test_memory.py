"""ChatkeepChatMemoryBuffer: LlamaIndex's ChatMemoryBuffer reading a window, on memory, SQLite, PostgreSQL, Redis.

It must return what ``ChatMemoryBuffer`` returns over the whole history whenever that fits in the window (checked
against LlamaIndex's own class on many random histories), read only the window from the store, and never start
a cut history with a tool or assistant message.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import pytest
from llama_index.core.llms import ChatMessage, MessageRole
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.core.storage.chat_store import SimpleChatStore

from chatkeep.core import InvalidArgumentError
from chatkeep.core.backend import SupportsReadProbe
from chatkeep.interop.llama_index import DEFAULT_MAX_MESSAGES, ChatkeepChatMemoryBuffer, ChatkeepChatStore

ROLES = [MessageRole.USER, MessageRole.ASSISTANT, MessageRole.TOOL, MessageRole.SYSTEM]


def words(text: str) -> list[str]:
    return text.split()


def texts(messages: list[ChatMessage]) -> list[str | None]:
    return [message.content for message in messages]


def random_history(rng: random.Random, size: int) -> list[ChatMessage]:
    return [
        ChatMessage(role=rng.choices(ROLES, weights=[4, 4, 2, 1])[0], content=f"{n} " + "w " * rng.randint(0, 12))
        for n in range(size)
    ]


def messages_read(chat_store: ChatkeepChatStore) -> int:
    store = chat_store.store.store
    assert isinstance(store, SupportsReadProbe)
    return store.messages_read


@pytest.fixture
def memory_store() -> Iterator[ChatkeepChatStore]:
    chat_store = ChatkeepChatStore("memory://", tenant="acme")
    try:
        yield chat_store
    finally:
        chat_store.close()


def characters(text: str) -> list[str]:
    return list(text)  # a joined history has a separator more per message than its messages' own counts


def w_pieces(text: str) -> list[str]:
    return text.split("w")  # a joined history has a piece less per message than its messages' own counts


@pytest.mark.parametrize("tokenizer", [words, characters, w_pieces], ids=["words", "characters", "w-pieces"])
def test_it_returns_what_chat_memory_buffer_returns_when_that_fits_the_window(
    memory_store: ChatkeepChatStore, tokenizer: Callable[[str], list[str]]
) -> None:
    # Tokenizers whose count of a joined history is, is above and is below the sum of its messages' counts: the
    # memory guesses from the messages' own counts, and must still find exactly ChatMemoryBuffer's answer.
    rng = random.Random(20261201)
    for case in range(400):
        history = random_history(rng, rng.randint(0, 40))
        token_limit = rng.randint(1, 150)
        initial = rng.randint(0, token_limit)
        max_messages = rng.randint(1, 45)
        key = f"case-{case}"
        memory_store.set_messages(key, history)
        theirs = ChatMemoryBuffer.from_defaults(
            chat_store=SimpleChatStore(store={key: history}),
            chat_store_key=key,
            token_limit=token_limit,
            tokenizer_fn=tokenizer,
        ).get(initial_token_count=initial)
        ours = ChatkeepChatMemoryBuffer.from_defaults(
            chat_store=memory_store,
            chat_store_key=key,
            token_limit=token_limit,
            tokenizer_fn=tokenizer,
            max_messages=max_messages,
        ).get(initial_token_count=initial)
        if len(theirs) <= max_messages:
            assert ours == theirs, (case, max_messages, token_limit)
        else:  # the token limit lets more through than the window holds: the newest of them, at most a window
            assert len(ours) <= max_messages
            assert ours == theirs[len(theirs) - len(ours) :]


async def test_get_and_aget_read_only_the_window(memory_store: ChatkeepChatStore) -> None:
    history = [ChatMessage(role="user" if n % 2 == 0 else "assistant", content=f"m{n}") for n in range(2_000)]
    memory_store.set_messages("long", history)
    memory = ChatkeepChatMemoryBuffer.from_defaults(
        chat_store=memory_store, chat_store_key="long", token_limit=100_000, max_messages=30
    )
    before = messages_read(memory_store)
    got = memory.get()
    assert messages_read(memory_store) - before == 31  # the window, and one more to know older messages exist
    assert texts(got) == [f"m{n}" for n in range(1_970, 2_000)]
    before = messages_read(memory_store)
    assert await memory.aget() == got
    assert messages_read(memory_store) - before == 31


def test_a_cut_window_never_starts_with_a_tool_or_assistant_message(memory_store: ChatkeepChatStore) -> None:
    history = [
        ChatMessage(role="user", content="q1"),
        ChatMessage(role="assistant", content="calling", additional_kwargs={"tool_calls": [{"id": "c1"}]}),
        ChatMessage(role="tool", content="42", additional_kwargs={"tool_call_id": "c1"}),
        ChatMessage(role="assistant", content="it is 42"),
        ChatMessage(role="user", content="q2"),
        ChatMessage(role="assistant", content="a2"),
    ]
    memory_store.set_messages("k", history)
    for max_messages, expected in [(6, texts(history)), (5, ["q2", "a2"]), (3, ["q2", "a2"]), (2, ["q2", "a2"])]:
        memory = ChatkeepChatMemoryBuffer.from_defaults(
            chat_store=memory_store, chat_store_key="k", max_messages=max_messages
        )
        assert texts(memory.get()) == expected, max_messages
    # An uncut history may start with the assistant (a greeting): kept, as ChatMemoryBuffer keeps it.
    memory_store.set_messages("greeting", history[3:])
    memory = ChatkeepChatMemoryBuffer.from_defaults(chat_store=memory_store, chat_store_key="greeting", max_messages=3)
    assert texts(memory.get()) == ["it is 42", "q2", "a2"]
    # A window of nothing but tool and assistant messages keeps the newest one, as ChatMemoryBuffer does.
    memory_store.set_messages("tools", [ChatMessage(role="user", content="go"), *history[1:4]])
    memory = ChatkeepChatMemoryBuffer.from_defaults(chat_store=memory_store, chat_store_key="tools", max_messages=3)
    assert texts(memory.get()) == ["it is 42"]


def test_put_set_reset_and_get_all_work_on_the_store(memory_store: ChatkeepChatStore) -> None:
    memory = ChatkeepChatMemoryBuffer.from_defaults(
        chat_history=[ChatMessage(role="user", content="earlier")],
        chat_store=memory_store,
        chat_store_key="k",
        max_messages=2,
    )
    assert memory.max_messages == 2
    memory.put(ChatMessage(role="assistant", content="noted"))
    memory.put_messages([ChatMessage(role="user", content="a"), ChatMessage(role="assistant", content="b")])
    assert texts(memory.get_all()) == ["earlier", "noted", "a", "b"]  # get_all still reads everything
    assert texts(memory.get()) == ["a", "b"]
    memory.set([ChatMessage(role="user", content="reset")])
    assert texts(memory_store.get_messages("k")) == ["reset"]
    memory.reset()
    assert memory.get() == []
    assert memory.to_dict()["max_messages"] == 2
    assert ChatkeepChatMemoryBuffer.from_defaults(chat_store=memory_store).max_messages == DEFAULT_MAX_MESSAGES


async def test_the_async_methods(memory_store: ChatkeepChatStore) -> None:
    memory = ChatkeepChatMemoryBuffer.from_defaults(chat_store=memory_store, chat_store_key="k", max_messages=3)
    await memory.aput(ChatMessage(role="user", content="hi"))
    await memory.aput_messages([ChatMessage(role="assistant", content="hello"), ChatMessage(content="bye")])
    await memory.aput_messages([ChatMessage(role="assistant", content="see you")])
    assert texts(await memory.aget()) == ["bye", "see you"]  # the window began with "hello", an assistant turn
    assert texts(await memory.aget_all()) == ["hi", "hello", "bye", "see you"]
    await memory.areset()
    assert await memory.aget() == []


def test_wrong_arguments_say_what_to_do(memory_store: ChatkeepChatStore) -> None:
    with pytest.raises(InvalidArgumentError, match="ChatkeepChatStore"):
        ChatkeepChatMemoryBuffer.from_defaults(chat_store=SimpleChatStore())
    with pytest.raises(InvalidArgumentError, match="ChatkeepChatStore"):
        ChatkeepChatMemoryBuffer.from_defaults()
    with pytest.raises(InvalidArgumentError, match="ChatkeepChatStore"):
        ChatkeepChatMemoryBuffer(token_limit=10)
    for bad in (0, -1, 2.5, True, "10"):
        with pytest.raises(InvalidArgumentError, match="max_messages"):
            ChatkeepChatMemoryBuffer.from_defaults(chat_store=memory_store, max_messages=bad)  # type: ignore[arg-type]
    memory = ChatkeepChatMemoryBuffer.from_defaults(chat_store=memory_store, token_limit=10)
    with pytest.raises(InvalidArgumentError, match="token_limit") as raised:
        memory.get(initial_token_count=11)
    assert isinstance(raised.value, ValueError)  # what ChatMemoryBuffer raises, so LlamaIndex's handlers still match


def test_it_is_a_chat_memory_buffer_on_every_backend(store_url: str, tenant: str) -> None:
    chat_store = ChatkeepChatStore(store_url, tenant=tenant)
    try:
        memory = ChatkeepChatMemoryBuffer.from_defaults(chat_store=chat_store, chat_store_key="k", max_messages=4)
        assert isinstance(memory, ChatMemoryBuffer)
        for n in range(10):
            memory.put(ChatMessage(role="user" if n % 2 == 0 else "assistant", content=f"m{n}"))
        before = messages_read(chat_store)
        assert texts(memory.get()) == ["m6", "m7", "m8", "m9"]
        assert messages_read(chat_store) - before == 5
    finally:
        chat_store.close()
