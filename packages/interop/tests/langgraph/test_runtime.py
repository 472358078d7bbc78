"""LangGraph's own runtime on ChatkeepSaver: a StateGraph with a messages state, a model node and a tool node.

The model is ChatOpenAI (langchain-openai) talking to the project's local OpenAI-protocol server. Turn 1 runs the
sync graph (``invoke``) in the test's process: the model calls a tool, the tool node answers, the model replies.
Turn 2 runs the async graph (``ainvoke``) in a new process on the same store (on memory, whose data lives in one
process, with a new saver in this one): what the server receives proves the graph resumed from the stored
checkpoint, tool call and tool result included.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command, interrupt
from typing_extensions import TypedDict

from chatkeep.core import SyncHistoryStore
from chatkeep.interop.langgraph import ChatkeepSaver
from chatkeep.testing.openai_server import FakeOpenAIServer

CONFIG: RunnableConfig = {"configurable": {"thread_id": "trip"}}


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"18°C in {city}"


def build_graph(base_url: str, checkpointer: ChatkeepSaver) -> CompiledStateGraph[Any, Any, Any, Any]:
    """The graph LangGraph's docs build for a tool-calling agent: model, then tools while it calls them."""
    llm = ChatOpenAI(model="fake-model", base_url=base_url, api_key="test-key", max_retries=0)  # type: ignore[arg-type]
    model = llm.bind_tools([get_weather])

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([get_weather]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


async def second_turn(base_url: str, store: SyncHistoryStore | str, tenant: str) -> dict[str, Any]:
    """Turn 2 on a new saver: the async graph resumes the thread from the store."""
    async with ChatkeepSaver(store, tenant=tenant) as saver:
        graph = build_graph(base_url, saver)
        result = await graph.ainvoke({"messages": [HumanMessage("And tomorrow?")]}, CONFIG)
        return {"answer": result["messages"][-1].content, "messages": len(result["messages"])}


TURN_2 = """
import asyncio, importlib.util, json, sys

path, base_url, store_url, tenant = sys.argv[1:]
spec = importlib.util.spec_from_file_location("langgraph_runtime", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps(asyncio.run(module.second_turn(base_url, store_url, tenant))))
"""


def test_a_tool_calling_graph_resumes_its_thread_in_a_new_process(
    openai_server: FakeOpenAIServer, view: SyncHistoryStore, store_url: str, tenant: str
) -> None:
    openai_server.reply_tool_calls([("call_1", "get_weather", '{"city": "Lisbon"}')])
    openai_server.reply_text("It is 18°C in Lisbon.")
    first = build_graph(openai_server.base_url, ChatkeepSaver(view, tenant=tenant)).invoke(
        {"messages": [HumanMessage("Weather in Lisbon?")]}, CONFIG
    )
    human, call, result, answer = first["messages"]
    assert isinstance(call, AIMessage)
    assert call.tool_calls[0]["args"] == {"city": "Lisbon"}
    assert isinstance(result, ToolMessage)
    assert result.content == "18°C in Lisbon"
    assert answer.content == "It is 18°C in Lisbon."

    openai_server.reply_text("Sunny again.")
    if store_url.startswith("memory"):  # a memory store lives in this process: a new saver and graph on it
        done = asyncio.run(second_turn(openai_server.base_url, view, tenant))
    else:
        script = textwrap.dedent(TURN_2)
        ran = subprocess.run(
            [sys.executable, "-c", script, __file__, openai_server.base_url, store_url, tenant],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert ran.returncode == 0, ran.stderr
        done = json.loads(ran.stdout.strip().splitlines()[-1])
    assert done == {"answer": "Sunny again.", "messages": 6}

    assert openai_server.requests[-1]["messages"] == [
        {"role": "user", "content": "Weather in Lisbon?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "type": "function",
                    "id": "call_1",
                    "function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'},
                }
            ],
        },
        {"role": "tool", "content": "18°C in Lisbon", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "It is 18°C in Lisbon."},
        {"role": "user", "content": "And tomorrow?"},
    ]
    saver = ChatkeepSaver(view, tenant=tenant)
    latest = saver.get_tuple(CONFIG)
    assert latest is not None
    kept = latest.checkpoint["channel_values"]["messages"]
    assert kept[:4] == [human, call, result, answer], "turn 1's messages were not kept field for field"
    history = list(saver.list(CONFIG))
    assert [t.metadata["step"] for t in history] == list(range(len(history) - 2, -2, -1))
    assert history[0] == latest
    assert [t.checkpoint["id"] for t in saver.list(CONFIG, limit=2)] == [t.checkpoint["id"] for t in history[:2]]


class Draft(TypedDict):
    text: str
    approved: bool


def test_an_interrupted_graph_resumes_from_its_pending_writes(view: SyncHistoryStore, tenant: str) -> None:
    """Human in the loop: ``interrupt()`` stops a run with its interrupt stored as a pending write; a later run with
    ``Command(resume=...)``, on a new saver, reads it back and finishes."""
    ran: list[str] = []

    def write(state: Draft) -> dict[str, Any]:
        ran.append("write")
        return {"text": state["text"] + " drafted"}

    def review(state: Draft) -> dict[str, Any]:
        ran.append("review")
        return {"approved": interrupt({"question": "approve?", "text": state["text"]}) == "yes"}

    def build(saver: ChatkeepSaver) -> CompiledStateGraph[Any, Any, Any, Any]:
        builder = StateGraph(Draft)
        builder.add_node("write", write)
        builder.add_node("review", review)
        builder.add_edge(START, "write")
        builder.add_edge("write", "review")
        return builder.compile(checkpointer=saver)

    config: RunnableConfig = {"configurable": {"thread_id": "draft"}}
    first = build(ChatkeepSaver(view, tenant=tenant)).invoke({"text": "memo", "approved": False}, config)
    assert first["__interrupt__"][0].value == {"question": "approve?", "text": "memo drafted"}

    resumed = build(ChatkeepSaver(view, tenant=tenant)).invoke(Command(resume="yes"), config)
    assert resumed == {"text": "memo drafted", "approved": True}
    assert ran == ["write", "review", "review"]  # the resumed run reran only the interrupted node
