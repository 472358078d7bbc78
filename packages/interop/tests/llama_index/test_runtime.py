"""LlamaIndex's own runtime on ChatkeepChatStore: a chat engine and a tool-calling agent, against the local server.

Turn 1 runs here; turn 2 runs in a new process on the same store, and the request the OpenAI-protocol server
receives on turn 2 must carry turn 1 exactly once. LlamaIndex's ``OpenAI`` LLM checks model names (context
window, function calling), so the requests name a real model; the local server answers any model.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import ChatMessage
from llama_index.core.memory import ChatMemoryBuffer, Memory
from llama_index.llms.openai import OpenAI

from chatkeep.core.backend import SupportsReadProbe
from chatkeep.interop.llama_index import ChatkeepChatMemoryBuffer, ChatkeepChatStore, ChatkeepDBChatStore
from chatkeep.testing.openai_server import FakeOpenAIServer

# FunctionAgent (the workflows package) looks over its own pydantic members with inspect.getmembers, which touches
# pydantic's deprecated attributes (`__fields__`, instance `model_computed_fields`): their code, not ours. Only
# warnings raised from inspect are ignored.
pytestmark = [
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20:inspect"),
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince211:inspect"),
]

MODEL = "gpt-4o-mini"

# Turn 2 in a new process: the same store, tenant and key; it prints the reply.
TURN_2 = """
import asyncio, json, sys
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.llms.openai import OpenAI
from llama_index.core.memory import Memory
from chatkeep.interop.llama_index import ChatkeepChatMemoryBuffer, ChatkeepChatStore, ChatkeepDBChatStore

args = json.loads(sys.argv[1])
llm = OpenAI(model=args["model"], api_base=args["base_url"], api_key="sk-local", max_retries=0)
chat_store = ChatkeepChatStore(args["store_url"], tenant=args["tenant"])
if args["window"] == "db":
    chat_store = ChatkeepDBChatStore(args["store_url"], tenant=args["tenant"])
    memory = Memory.from_defaults(session_id=args["key"], chat_store=chat_store)
elif args["window"] is None:
    memory = ChatMemoryBuffer.from_defaults(chat_store=chat_store, chat_store_key=args["key"])
else:
    memory = ChatkeepChatMemoryBuffer.from_defaults(
        chat_store=chat_store, chat_store_key=args["key"], max_messages=args["window"]
    )
if args["kind"] == "engine":
    print(SimpleChatEngine.from_defaults(llm=llm, memory=memory).chat(args["text"]).response)
else:
    def add(a: int, b: int) -> int:
        "Add two numbers."
        return a + b

    async def turn():
        agent = FunctionAgent(tools=[add], llm=llm, system_prompt="You add numbers.")
        return await agent.run(user_msg=args["text"], memory=memory)

    print(asyncio.run(turn()))
chat_store.close()
"""


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def llm(server: FakeOpenAIServer) -> OpenAI:
    return OpenAI(model=MODEL, api_base=server.base_url, api_key="sk-local", max_retries=0)


def run_turn_2(
    kind: str,
    server: FakeOpenAIServer,
    store_url: str,
    tenant: str,
    key: str,
    text: str,
    window: int | str | None = None,
) -> str:
    """Turn 2 in a new process: ChatMemoryBuffer, ChatkeepChatMemoryBuffer of ``window`` messages, or "db" (Memory)."""
    if store_url.startswith("memory"):
        pytest.skip("a memory:// store lives in one process; the new-process turn needs a persistent backend")
    args = {"kind": kind, "model": MODEL, "base_url": server.base_url, "store_url": store_url}
    args |= {"tenant": tenant, "key": key, "text": text, "window": window}
    done = subprocess.run(
        [sys.executable, "-c", TURN_2, json.dumps(args)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def count(messages: list[dict[str, Any]], **fields: Any) -> int:
    return sum(all(message.get(k) == v for k, v in fields.items()) for message in messages)


def test_a_chat_engine_resumes_in_a_new_process(openai_server: FakeOpenAIServer, store_url: str, tenant: str) -> None:
    chat_store = ChatkeepChatStore(store_url, tenant=tenant)
    try:
        memory = ChatMemoryBuffer.from_defaults(chat_store=chat_store, chat_store_key="user-1")
        engine = SimpleChatEngine.from_defaults(llm=llm(openai_server), memory=memory)
        openai_server.reply_text("Nice to meet you, Ada.")
        assert engine.chat("Hi, I am Ada.").response == "Nice to meet you, Ada."
        assert [m.content for m in chat_store.get_messages("user-1")] == ["Hi, I am Ada.", "Nice to meet you, Ada."]

        openai_server.reply_text("You are Ada.")
        assert run_turn_2("engine", openai_server, store_url, tenant, "user-1", "Who am I?") == "You are Ada."
        turn_2 = openai_server.requests[-1]["messages"]
        assert count(turn_2, role="user", content="Hi, I am Ada.") == 1
        assert count(turn_2, role="assistant", content="Nice to meet you, Ada.") == 1
        assert turn_2[-1] == {"role": "user", "content": "Who am I?"}
        assert len(chat_store.get_messages("user-1")) == 4
    finally:
        chat_store.close()


async def test_a_tool_calling_agent_resumes_in_a_new_process(
    openai_server: FakeOpenAIServer, store_url: str, tenant: str
) -> None:
    chat_store = ChatkeepChatStore(store_url, tenant=tenant)
    try:
        memory = ChatMemoryBuffer.from_defaults(chat_store=chat_store, chat_store_key="user-1")
        agent = FunctionAgent(tools=[add], llm=llm(openai_server), system_prompt="You add numbers.")
        openai_server.reply_tool_calls([("call_1", "add", '{"a": 2, "b": 3}')])
        openai_server.reply_text("2 + 3 = 5")
        assert str(await agent.run(user_msg="What is 2 + 3?", memory=memory)) == "2 + 3 = 5"

        stored = await chat_store.aget_messages("user-1")
        assert [m.role.value for m in stored] == ["user", "assistant", "tool", "assistant"]
        assert stored[2].content == "5"
        assert stored[2].additional_kwargs["tool_call_id"] == "call_1"
        first_request = openai_server.requests[1]["messages"]  # the agent's second call, after the tool ran

        openai_server.reply_text("You asked about 2 + 3.")
        reply = run_turn_2("agent", openai_server, store_url, tenant, "user-1", "What did I ask?")
        assert reply == "You asked about 2 + 3."
        turn_2 = openai_server.requests[-1]["messages"]
        assert count(turn_2, role="user", content="What is 2 + 3?") == 1
        calls = [m for m in turn_2 if m.get("tool_calls")]
        assert len(calls) == 1
        assert calls[0]["tool_calls"][0]["id"] == "call_1"
        assert count(turn_2, role="tool", tool_call_id="call_1") == 1
        assert count(turn_2, role="assistant", content="2 + 3 = 5") == 1
        # The tool call and its result went out on turn 2 exactly as on turn 1 (what LlamaIndex wrote is read back).
        assert [m for m in turn_2 if m.get("role") != "system"][:3] == [
            m for m in first_request if m.get("role") != "system"
        ]
    finally:
        await chat_store.aclose()


def test_history_set_from_defaults_reaches_the_model(openai_server: FakeOpenAIServer, tenant: str) -> None:
    chat_store = ChatkeepChatStore("memory://", tenant=tenant)
    try:
        history = [ChatMessage(role="user", content="earlier"), ChatMessage(role="assistant", content="noted")]
        memory = ChatMemoryBuffer.from_defaults(chat_history=history, chat_store=chat_store, chat_store_key="k")
        openai_server.reply_text("ok")
        SimpleChatEngine.from_defaults(llm=llm(openai_server), memory=memory).chat("now")
        sent = openai_server.requests[-1]["messages"]
        assert [m["content"] for m in sent if m["role"] != "system"] == ["earlier", "noted", "now"]
    finally:
        chat_store.close()


# -- ChatkeepChatMemoryBuffer: the same runtime, reading a window --------------------------------------------------


def messages_read(chat_store: ChatkeepChatStore) -> int:
    store = chat_store.store.store
    assert isinstance(store, SupportsReadProbe)
    return store.messages_read


def test_a_chat_engine_on_the_windowed_memory_resumes_in_a_new_process(
    openai_server: FakeOpenAIServer, store_url: str, tenant: str
) -> None:
    chat_store = ChatkeepChatStore(store_url, tenant=tenant)
    try:
        memory = ChatkeepChatMemoryBuffer.from_defaults(chat_store=chat_store, chat_store_key="user-1", max_messages=8)
        engine = SimpleChatEngine.from_defaults(llm=llm(openai_server), memory=memory)
        openai_server.reply_text("Nice to meet you, Ada.")
        assert engine.chat("Hi, I am Ada.").response == "Nice to meet you, Ada."

        openai_server.reply_text("You are Ada.")
        assert run_turn_2("engine", openai_server, store_url, tenant, "user-1", "Who am I?", window=8) == "You are Ada."
        turn_2 = openai_server.requests[-1]["messages"]
        assert [m for m in turn_2 if m["role"] != "system"] == [
            {"role": "user", "content": "Hi, I am Ada."},
            {"role": "assistant", "content": "Nice to meet you, Ada."},
            {"role": "user", "content": "Who am I?"},
        ]
        assert len(chat_store.get_messages("user-1")) == 4
    finally:
        chat_store.close()


async def test_a_chat_engine_on_a_long_history_reads_and_sends_only_the_window(
    openai_server: FakeOpenAIServer, store_url: str, tenant: str
) -> None:
    chat_store = ChatkeepChatStore(store_url, tenant=tenant)
    try:
        history = [ChatMessage(role="user" if n % 2 == 0 else "assistant", content=f"m{n}") for n in range(300)]
        await chat_store.aset_messages("long", history)
        memory = ChatkeepChatMemoryBuffer.from_defaults(chat_store=chat_store, chat_store_key="long", max_messages=10)
        engine = SimpleChatEngine.from_defaults(llm=llm(openai_server), memory=memory)
        expected = [
            [*(f"m{k}" for k in range(292, 300)), "question 0"],
            [*(f"m{k}" for k in range(294, 300)), "question 0", "answer 0", "question 1"],
        ]
        for n in range(2):  # the sync path (get), then the async one (aget)
            openai_server.reply_text(f"answer {n}")
            before = messages_read(chat_store)
            reply = await engine.achat(f"question {n}") if n else engine.chat(f"question {n}")
            assert str(reply) == f"answer {n}"
            # One get() per turn: the newest 10 and one more (to know older ones exist), never the 300 before.
            assert messages_read(chat_store) - before == 11
            sent = [m["content"] for m in openai_server.requests[-1]["messages"] if m["role"] != "system"]
            # The newest 10 once the question is put, less the assistant turn they would start with.
            assert sent == expected[n]
        assert len(await chat_store.aget_messages("long")) == 304
    finally:
        await chat_store.aclose()


async def test_a_tool_calling_agent_on_the_windowed_memory_resumes_in_a_new_process(
    openai_server: FakeOpenAIServer, store_url: str, tenant: str
) -> None:
    chat_store = ChatkeepChatStore(store_url, tenant=tenant)
    try:
        memory = ChatkeepChatMemoryBuffer.from_defaults(chat_store=chat_store, chat_store_key="user-1", max_messages=20)
        agent = FunctionAgent(tools=[add], llm=llm(openai_server), system_prompt="You add numbers.")
        openai_server.reply_tool_calls([("call_1", "add", '{"a": 2, "b": 3}')])
        openai_server.reply_text("2 + 3 = 5")
        assert str(await agent.run(user_msg="What is 2 + 3?", memory=memory)) == "2 + 3 = 5"
        stored = await chat_store.aget_messages("user-1")
        assert [m.role.value for m in stored] == ["user", "assistant", "tool", "assistant"]
        first_request = openai_server.requests[1]["messages"]

        openai_server.reply_text("You asked about 2 + 3.")
        reply = run_turn_2("agent", openai_server, store_url, tenant, "user-1", "What did I ask?", window=20)
        assert reply == "You asked about 2 + 3."
        turn_2 = openai_server.requests[-1]["messages"]
        assert count(turn_2, role="user", content="What is 2 + 3?") == 1
        assert len([m for m in turn_2 if m.get("tool_calls")]) == 1
        assert count(turn_2, role="tool", tool_call_id="call_1") == 1
        assert count(turn_2, role="assistant", content="2 + 3 = 5") == 1
        assert [m for m in turn_2 if m.get("role") != "system"][:3] == [
            m for m in first_request if m.get("role") != "system"
        ]
    finally:
        await chat_store.aclose()


# -- LlamaIndex's Memory on ChatkeepDBChatStore ----------------------------------------------------------------


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


def test_a_chat_engine_on_llama_index_memory_resumes_in_a_new_process(
    openai_server: FakeOpenAIServer, store_url: str, tenant: str, thread_loop: None
) -> None:
    db = ChatkeepDBChatStore(store_url, tenant=tenant)
    try:
        memory = Memory.from_defaults(session_id="user-1", chat_store=db)
        engine = SimpleChatEngine.from_defaults(llm=llm(openai_server), memory=memory)
        openai_server.reply_text("Nice to meet you, Ada.")
        assert engine.chat("Hi, I am Ada.").response == "Nice to meet you, Ada."

        openai_server.reply_text("You are Ada.")
        assert (
            run_turn_2("engine", openai_server, store_url, tenant, "user-1", "Who am I?", window="db") == "You are Ada."
        )
        turn_2 = openai_server.requests[-1]["messages"]
        assert [m for m in turn_2 if m["role"] != "system"] == [
            {"role": "user", "content": "Hi, I am Ada."},
            {"role": "assistant", "content": "Nice to meet you, Ada."},
            {"role": "user", "content": "Who am I?"},
        ]
        assert len(db.chat_store.get_messages("user-1")) == 4
    finally:
        db.close()


async def test_a_tool_calling_agent_on_llama_index_memory_keeps_the_call_and_result(
    openai_server: FakeOpenAIServer, store_url: str, tenant: str
) -> None:
    db = ChatkeepDBChatStore(store_url, tenant=tenant)
    try:
        memory = Memory.from_defaults(session_id="user-1", chat_store=db)
        agent = FunctionAgent(tools=[add], llm=llm(openai_server), system_prompt="You add numbers.")
        openai_server.reply_tool_calls([("call_1", "add", '{"a": 2, "b": 3}')])
        openai_server.reply_text("2 + 3 = 5")
        assert str(await agent.run(user_msg="What is 2 + 3?", memory=memory)) == "2 + 3 = 5"
        stored = await db.get_messages("user-1")
        assert [m.role.value for m in stored] == ["user", "assistant", "tool", "assistant"]
        assert stored[2].additional_kwargs["tool_call_id"] == "call_1"

        openai_server.reply_text("You asked about 2 + 3.")
        reply = run_turn_2("agent", openai_server, store_url, tenant, "user-1", "What did I ask?", window="db")
        assert reply == "You asked about 2 + 3."
        turn_2 = openai_server.requests[-1]["messages"]
        assert count(turn_2, role="user", content="What is 2 + 3?") == 1
        assert count(turn_2, role="tool", tool_call_id="call_1") == 1
        assert count(turn_2, role="assistant", content="2 + 3 = 5") == 1
    finally:
        await db.aclose()
