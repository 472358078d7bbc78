"""The storage-mode table of DESIGN.md, end to end: Agent + OpenAIResponsesClient + backend stores, on loopback.

| situation                                                    | what happens                                  |
|--------------------------------------------------------------|-----------------------------------------------|
| no service_session_id, client not keeping history            | local mode: the loading provider loads/stores |
| service_session_id, or a client keeping history              | loaders neither load nor store; audit records |
| per-call persistence required in service mode                | HistoryModeConflictError                      |
| explicit conversation id in options with a loading provider  | HistoryModeConflictError                      |
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from chatkeep.core import (
    ChatOptions,
    HistoryModeConflictError,
    HistoryStore,
    SessionKey,
    StoreHistoryProvider,
    open_store,
)
from chatkeep.core.openai import OpenAIResponsesClient
from chatkeep.testing.openai_server import FakeOpenAIServer


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as fake:
        yield fake


@pytest.fixture
async def audit_store() -> AsyncIterator[HistoryStore]:
    async with open_store(f"memory://audit-{uuid.uuid4().hex}") as store:
        yield store


def history_url() -> str:
    return f"memory://service-mode-{uuid.uuid4().hex}"


def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order by its id."""
    return {"order_id": order_id, "status": "shipped"}


def response_bodies(server: FakeOpenAIServer) -> list[dict[str, Any]]:
    return [r.body for r in server.log if r.method == "POST" and r.path == "/v1/responses"]


def assert_model_never_saw_history_twice(server: FakeOpenAIServer) -> None:
    for seen in server.seen_inputs:
        keys = [json.dumps(item, sort_keys=True) for item in seen]
        assert len(keys) == len(set(keys)), f"the model saw an item twice: {keys}"


async def stored(url_or_store: str | HistoryStore, session_id: str) -> list[str]:
    """``role: text`` of what a store holds for a session (a memory:// URL names the same process-wide store)."""
    if isinstance(url_or_store, str):
        async with open_store(url_or_store) as store:
            messages = await store.load(SessionKey("default", session_id))
    else:
        messages = await url_or_store.load(SessionKey("default", session_id))
    return [f"{m.role}: {m.text}" if m.text else f"{m.role}: <{m.contents[0].type}>" for m in messages]


# -- service mode: the loading provider stands aside, the audit provider records -------------------------------


async def test_a_client_that_keeps_history_makes_the_loading_provider_stand_aside_and_the_audit_record(
    server: FakeOpenAIServer, audit_store: HistoryStore
) -> None:
    url = history_url()
    server.reply_tool_calls([("call_7", "lookup_order", '{"order_id": "A-17"}')])
    server.reply_text("Order A-17 has shipped.")
    server.reply_text("It was A-17.")
    audit = StoreHistoryProvider(audit_store, source_id="audit", load_messages=False)
    async with (
        OpenAIResponsesClient("fake-model", base_url=server.base_url) as client,
        client.as_agent(tools=[lookup_order], history=url, context_providers=[audit]) as agent,
    ):
        session = agent.create_session()
        await agent.run("Where is order A-17?", session=session)
        updates = [u async for u in agent.run_stream("Which order was it?", session=session)]

    assert "".join(u.text for u in updates) == "It was A-17."
    # The loading provider neither loaded nor stored: the service holds the conversation.
    assert await stored(url, session.session_id) == []
    assert session.state == {}
    # Each request carried only what was new; the model never saw an item twice.
    assert [[i["type"] for i in b["input"]] for b in response_bodies(server)] == [
        ["message"],
        ["function_call_output"],
        ["message"],
    ]
    assert_model_never_saw_history_twice(server)
    assert [i.get("content", i["type"]) for i in server.seen_inputs[-1]] == [
        "Where is order A-17?",
        "function_call",
        "function_call_output",
        "Order A-17 has shipped.",
        "Which order was it?",
    ]
    # The write-only provider still recorded every run, tool call and result included.
    assert await stored(audit_store, session.session_id) == [
        "user: Where is order A-17?",
        "assistant: <function_call>",
        "tool: <function_result>",
        "assistant: Order A-17 has shipped.",
        "user: Which order was it?",
        "assistant: It was A-17.",
    ]


async def test_a_session_with_a_service_id_is_service_managed_even_with_a_stateless_agent_history(
    server: FakeOpenAIServer,
) -> None:
    # The session's service_session_id alone puts the run in service mode, whatever else the agent has.
    url = history_url()
    async with OpenAIResponsesClient("fake-model", base_url=server.base_url) as client:
        first_agent = client.as_agent()
        first = first_agent.create_session()
        await first_agent.run("Remember 42.", session=first)
        assert first.service_session_id is not None
        async with client.as_agent(history=url) as agent:
            session = agent.get_session(service_session_id=first.service_session_id)
            await agent.run("What number?", session=session)

    assert await stored(url, session.session_id) == []
    body = response_bodies(server)[-1]
    assert body["previous_response_id"] == first.service_session_id
    assert body["input"] == [{"type": "message", "role": "user", "content": "What number?"}]
    assert_model_never_saw_history_twice(server)


# -- local mode: the same provider loads and stores -------------------------------------------------------------


async def test_a_client_that_keeps_no_history_is_local_mode_and_the_provider_loads_and_stores(
    server: FakeOpenAIServer, audit_store: HistoryStore
) -> None:
    url = history_url()
    audit = StoreHistoryProvider(audit_store, source_id="audit", load_messages=False)
    async with (
        OpenAIResponsesClient("fake-model", base_url=server.base_url, store=False) as client,
        client.as_agent(history=url, context_providers=[audit]) as agent,
    ):
        session = agent.create_session()
        await agent.run("one", session=session)
        await agent.run("two", session=session)

    assert session.service_session_id is None
    expected = ["user: one", "assistant: You said: one", "user: two", "assistant: You said: two"]
    assert await stored(url, session.session_id) == expected
    assert await stored(audit_store, session.session_id) == expected
    second = response_bodies(server)[1]
    assert [i["content"] for i in second["input"]] == ["one", "You said: one", "two"]
    assert "previous_response_id" not in second
    assert_model_never_saw_history_twice(server)


# -- conflicts ---------------------------------------------------------------------------------------------------


async def test_per_call_persistence_with_a_client_that_keeps_history_names_the_setting_to_change(
    server: FakeOpenAIServer,
) -> None:
    async with OpenAIResponsesClient("fake-model", base_url=server.base_url) as client:
        agent = client.as_agent(require_per_service_call_history_persistence=True)
        with pytest.raises(HistoryModeConflictError) as caught:
            await agent.run("hi", session=agent.create_session())

    message = str(caught.value)
    assert "require_per_service_call_history_persistence" in message
    assert "store=False" in message
    assert response_bodies(server) == []  # refused before anything reached the service


async def test_per_call_persistence_with_a_service_managed_session_names_the_setting_to_change(
    server: FakeOpenAIServer,
) -> None:
    url = history_url()
    async with (
        OpenAIResponsesClient("fake-model", base_url=server.base_url, store=False) as client,
        client.as_agent(history=url, require_per_service_call_history_persistence=True) as agent,
    ):
        session = agent.get_session(service_session_id="resp_held_by_the_service")
        with pytest.raises(HistoryModeConflictError, match="require_per_service_call_history_persistence"):
            await agent.run("hi", session=session)

    assert server.log == []
    assert await stored(url, session.session_id) == []


async def test_an_explicit_conversation_id_with_a_loading_provider_names_the_setting_to_change(
    server: FakeOpenAIServer,
) -> None:
    url = history_url()
    async with (
        OpenAIResponsesClient("fake-model", base_url=server.base_url) as client,
        client.as_agent(history=url) as agent,
    ):
        session = agent.create_session()
        with pytest.raises(HistoryModeConflictError) as caught:
            await agent.run("hi", session=session, options=ChatOptions(conversation_id="conv_explicit"))

    message = str(caught.value)
    assert "conversation_id" in message
    assert "load_messages=False" in message
    assert server.log == []
    assert await stored(url, session.session_id) == []


async def test_an_explicit_conversation_id_with_only_an_audit_provider_continues_it(
    server: FakeOpenAIServer, audit_store: HistoryStore
) -> None:
    audit = StoreHistoryProvider(audit_store, source_id="audit", load_messages=False)
    async with OpenAIResponsesClient("fake-model", base_url=server.base_url) as client:
        conversation = await client.client.conversations.create()
        agent = client.as_agent(context_providers=[audit])
        session = agent.create_session()
        await agent.run("hi", session=session, options=ChatOptions(conversation_id=conversation.id))

    assert response_bodies(server)[0]["conversation"] == conversation.id
    assert session.service_session_id == conversation.id
    assert await stored(audit_store, session.session_id) == ["user: hi", "assistant: You said: hi"]
