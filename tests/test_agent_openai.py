"""End to end: Agent + OpenAIChatClient (the real openai package) + a backend store, against a local server.

The assertions are on what the server received: the history sent exactly once, in order, with
nothing internal in it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from chatkeep.core import AgentSession, SessionKey, open_store
from chatkeep.core.openai import OpenAIChatClient
from chatkeep.testing.openai_server import FakeOpenAIServer

INTERNAL = ("message_id", "created_at", "additional_properties", "_source", "source", "author_name", '"v"')


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as fake:
        yield fake


def roles_and_texts(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["role"], m.get("content") or "") for m in body["messages"]]


def assert_nothing_internal(body: dict[str, Any]) -> None:
    raw = json.dumps(body)
    for word in INTERNAL:
        assert word not in raw, f"{word} leaked into the request"


async def test_history_in_a_backend_is_sent_exactly_once_in_order(server: FakeOpenAIServer) -> None:
    store_url = f"memory://e2e-{uuid.uuid4().hex}"
    server.reply_text("Noted: Italian food.")
    server.reply_text("You like Italian food.")
    async with OpenAIChatClient("fake-model", base_url=server.base_url) as client:
        agent = client.as_agent(name="StorageAgent", instructions="You are a helpful assistant.", history=store_url)
        async with agent:
            session = agent.create_session()
            first = await agent.run("Remember that I like Italian food.", session=session)
            resumed = AgentSession.from_dict(json.loads(json.dumps(session.to_dict())))
            second = await agent.run("What food do I like?", session=resumed)
    assert first.text == "Noted: Italian food."
    assert second.text == "You like Italian food."
    body = server.requests[1]
    assert roles_and_texts(body) == [
        ("system", "You are a helpful assistant."),
        ("user", "Remember that I like Italian food."),
        ("assistant", "Noted: Italian food."),
        ("user", "What food do I like?"),
    ]
    assert_nothing_internal({"messages": [{k: v for k, v in m.items() if k != "name"} for m in body["messages"]]})
    async with open_store(store_url) as store:
        stored = await store.load(SessionKey("default", session.session_id))
    assert [m.text for m in stored] == [
        "Remember that I like Italian food.",
        "Noted: Italian food.",
        "What food do I like?",
        "You like Italian food.",
    ]


def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order by its id."""
    return {"order_id": order_id, "status": "shipped"}


async def test_streamed_tool_loop_is_stored_and_replayed_to_the_model(server: FakeOpenAIServer) -> None:
    store_url = f"memory://e2e-{uuid.uuid4().hex}"
    server.reply_tool_calls([("call_7", "lookup_order", '{"order_id": "A-17"}')], arguments_chunk_size=3)
    server.reply_text("Order A-17 has shipped.")
    server.reply_text("It was A-17.")
    async with (
        OpenAIChatClient("fake-model", base_url=server.base_url) as client,
        client.as_agent(tools=[lookup_order], history=store_url) as agent,
    ):
        session = agent.create_session()
        updates = [u async for u in agent.run_stream("Where is order A-17?", session=session)]
        assert "".join(u.text for u in updates) == "Order A-17 has shipped."
        await agent.run("Which order was it?", session=session)

    assert server.requests[0]["stream"] is True
    assert server.requests[0]["tools"][0]["function"]["name"] == "lookup_order"
    # The second call of the loop carries the call and its result once each.
    loop_call = server.requests[1]["messages"]
    assert [m["role"] for m in loop_call] == ["user", "assistant", "tool"]
    assert loop_call[1]["tool_calls"][0]["function"]["arguments"] == '{"order_id": "A-17"}'
    assert loop_call[2]["tool_call_id"] == "call_7"
    assert json.loads(loop_call[2]["content"]) == {"order_id": "A-17", "status": "shipped"}
    # The next run replays the stored exchange in the same shape.
    replay = server.requests[2]["messages"]
    assert [m["role"] for m in replay] == ["user", "assistant", "tool", "assistant", "user"]
    for body in server.requests:
        assert_nothing_internal(body)


async def test_a_failed_model_call_stores_nothing(server: FakeOpenAIServer) -> None:
    from chatkeep.core import ModelError

    store_url = f"memory://e2e-{uuid.uuid4().hex}"
    server.fail(500, times=None)
    async with (
        OpenAIChatClient("fake-model", base_url=server.base_url) as client,
        client.as_agent(history=store_url) as agent,
    ):
        session = agent.create_session()
        with pytest.raises(ModelError):
            await agent.run("hello?", session=session)
    async with open_store(store_url) as store:
        assert await store.count(SessionKey("default", session.session_id)) == 0
