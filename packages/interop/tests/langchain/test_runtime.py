"""LangChain's own runtime on the adapter: RunnableWithMessageHistory around a prompt and ChatOpenAI.

ChatOpenAI (langchain-openai) talks to the project's local OpenAI-protocol server, sync and async, plain and
streamed, with a tool call; what the server receives proves what the history fed the model.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import Runnable
from langchain_core.runnables.history import RunnableWithMessageHistory
from langchain_openai import ChatOpenAI

from chatkeep.core import SyncHistoryStore
from chatkeep.interop.langchain import ChatkeepChatMessageHistory
from chatkeep.testing.openai_server import FakeOpenAIServer

# RunnableWithMessageHistory is deprecated since langchain-core 1.3.3 in favour of LangGraph, yet it is what
# BaseChatMessageHistory is for; LangChain warns on each construction.
pytestmark = pytest.mark.filterwarnings(
    "ignore:RunnableWithMessageHistory is deprecated:langchain_core._api.deprecation.LangChainDeprecationWarning"
)

SYSTEM = "You are terse."


def model(server: FakeOpenAIServer) -> ChatOpenAI:
    return ChatOpenAI(model="fake-model", base_url=server.base_url, api_key="test-key", max_retries=0)  # type: ignore[arg-type]


@pytest.fixture
def llm(openai_server: FakeOpenAIServer) -> ChatOpenAI:
    """The model, made outside the test's event loop: its first construction imports httpx's modules (file reads)."""
    return model(openai_server)


def chat_chain(
    llm: Runnable[Any, Any], get_session_history: Callable[[str], ChatkeepChatMessageHistory]
) -> RunnableWithMessageHistory:
    """The chain LangChain's docs build: a system prompt, the history, then the question."""
    prompt = ChatPromptTemplate.from_messages(
        [("system", SYSTEM), MessagesPlaceholder("history"), MessagesPlaceholder("input")]
    )
    return RunnableWithMessageHistory(
        prompt | llm, get_session_history, input_messages_key="input", history_messages_key="history"
    )


def sent(server: FakeOpenAIServer, n: int = -1) -> list[dict[str, Any]]:
    """The messages of the ``n``-th Chat Completions request the server received."""
    messages: list[dict[str, Any]] = server.requests[n]["messages"]
    return messages


def said(role: str, content: str) -> dict[str, Any]:
    return {"role": role, "content": content}


def config(session_id: str) -> Any:
    return {"configurable": {"session_id": session_id}}


@pytest.fixture
def histories(view: SyncHistoryStore, tenant: str) -> Callable[[str], ChatkeepChatMessageHistory]:
    """The ``get_session_history`` factory the docs show: one shared view, a history per call."""
    return lambda session_id: ChatkeepChatMessageHistory(session_id, view, tenant=tenant)


TURN_2 = """
import json, sys, warnings
warnings.filterwarnings("ignore", "RunnableWithMessageHistory is deprecated")
from langchain_core.messages import HumanMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory
from langchain_openai import ChatOpenAI
from chatkeep.interop.langchain import ChatkeepChatMessageHistory

base_url, store_url, tenant = sys.argv[1:]
llm = ChatOpenAI(model="fake-model", base_url=base_url, api_key="test-key", max_retries=0)
prompt = ChatPromptTemplate.from_messages(
    [("system", {system!r}), MessagesPlaceholder("history"), MessagesPlaceholder("input")]
)
with ChatkeepChatMessageHistory("trip", store_url, tenant=tenant) as history:
    chain = RunnableWithMessageHistory(
        prompt | llm, lambda session_id: history, input_messages_key="input", history_messages_key="history"
    )
    turn = {{"input": [HumanMessage("Where am I going?")]}}
    answer = chain.invoke(turn, {{"configurable": {{"session_id": "trip"}}}})
    print(json.dumps({{"answer": answer.content, "stored": len(history.messages)}}))
"""


def test_history_survives_a_new_process_and_turn_2_sends_turn_1_once(
    openai_server: FakeOpenAIServer, histories: Callable[[str], ChatkeepChatMessageHistory], store_url: str, tenant: str
) -> None:
    if store_url.startswith("memory"):
        pytest.skip("a memory store lives in one process; the other targets are shared with the new process")
    openai_server.reply_text("Lisbon, noted.")
    first = chat_chain(model(openai_server), histories).invoke(
        {"input": [HumanMessage("I am flying to Lisbon.")]}, config("trip")
    )

    openai_server.reply_text("To Lisbon.")
    script = TURN_2.format(system=SYSTEM)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), openai_server.base_url, store_url, tenant],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"answer": "To Lisbon.", "stored": 4}
    assert sent(openai_server) == [
        said("system", SYSTEM),
        said("user", "I am flying to Lisbon."),
        said("assistant", "Lisbon, noted."),
        said("user", "Where am I going?"),
    ]
    stored = histories("trip").messages
    assert stored[1] == first, "the model's answer was not kept field for field"
    assert [m.content for m in stored] == [
        "I am flying to Lisbon.",
        "Lisbon, noted.",
        "Where am I going?",
        "To Lisbon.",
    ]


async def test_ainvoke_astream_and_a_sync_stream_inside_the_loop_share_one_history(
    openai_server: FakeOpenAIServer,
    llm: ChatOpenAI,
    histories: Callable[[str], ChatkeepChatMessageHistory],
    blocking_on_purpose: Callable[[], AbstractContextManager[None]],
) -> None:
    chain = chat_chain(llm, histories)
    openai_server.reply_text("one")
    first = await chain.ainvoke({"input": [HumanMessage("turn 1")]}, config("mixed"))
    openai_server.reply_text("two words")
    streamed = "".join(
        [str(chunk.content) async for chunk in chain.astream({"input": [HumanMessage("turn 2")]}, config("mixed"))]
    )
    openai_server.reply_text("three")
    # A sync call from async code: LangChain's sync path blocks this loop, and must not deadlock it.
    with blocking_on_purpose():
        blocking = "".join(
            str(chunk.content) for chunk in chain.stream({"input": [HumanMessage("turn 3")]}, config("mixed"))
        )

    assert (first.content, streamed, blocking) == ("one", "two words", "three")
    assert sent(openai_server) == [
        said("system", SYSTEM),
        said("user", "turn 1"),
        said("assistant", "one"),
        said("user", "turn 2"),
        said("assistant", "two words"),
        said("user", "turn 3"),
    ]
    stored = await histories("mixed").aget_messages()
    assert [m.content for m in stored] == ["turn 1", "one", "turn 2", "two words", "turn 3", "three"]
    assert stored[1] == first
    assert stored[3].type == "AIMessageChunk", "LangChain keeps a streamed answer as its aggregated chunk"


async def test_a_tool_calling_turn_keeps_the_call_and_the_tool_message_exactly(
    openai_server: FakeOpenAIServer, llm: ChatOpenAI, histories: Callable[[str], ChatkeepChatMessageHistory]
) -> None:
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"18°C in {city}"

    chain = chat_chain(llm.bind_tools([get_weather]), histories)
    openai_server.reply_tool_calls([("call_1", "get_weather", '{"city": "Paris"}')])
    call = await chain.ainvoke({"input": [HumanMessage("Weather in Paris?")]}, config("tools"))
    assert isinstance(call, AIMessage)
    assert call.tool_calls == [{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1", "type": "tool_call"}]

    result = ToolMessage(
        get_weather("Paris"), tool_call_id="call_1", name="get_weather", artifact={"temp_c": 18}, status="success"
    )
    openai_server.reply_text("It is 18°C.")
    answer = await chain.ainvoke({"input": [result]}, config("tools"))

    assert sent(openai_server)[2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "type": "function",
                    "id": "call_1",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "content": "18°C in Paris", "tool_call_id": "call_1"},
    ]
    stored: list[BaseMessage] = await histories("tools").aget_messages()
    assert stored == [HumanMessage("Weather in Paris?"), call, result, answer]
    assert isinstance(stored[2], ToolMessage)
    assert (stored[2].artifact, stored[2].status, stored[2].name) == ({"temp_c": 18}, "success", "get_weather")


def test_a_window_bounds_what_the_model_is_sent_and_nothing_is_stored_twice(
    openai_server: FakeOpenAIServer, view: SyncHistoryStore, tenant: str
) -> None:
    # No history_messages_key: LangChain prepends the history to the input and, after the run, strips as many
    # messages as `messages` returns; a window must give the same count both times.
    chain = RunnableWithMessageHistory(
        model(openai_server), lambda sid: ChatkeepChatMessageHistory(sid, view, tenant=tenant, max_messages=2)
    )
    for n in range(1, 4):
        openai_server.reply_text(f"answer {n}")
        chain.invoke([HumanMessage(f"question {n}")], config("windowed"))
    assert sent(openai_server) == [
        said("user", "question 2"),
        said("assistant", "answer 2"),
        said("user", "question 3"),
    ]
    stored = ChatkeepChatMessageHistory("windowed", view, tenant=tenant).messages
    assert [m.content for m in stored] == [f"{kind} {n}" for n in range(1, 4) for kind in ("question", "answer")]
