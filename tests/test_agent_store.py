"""An agent whose history lives in a backend chosen by URL (the memory backend, found through its entry point)."""

from __future__ import annotations

import uuid

import pytest

from chatkeep.core import (
    Agent,
    AgentSession,
    Message,
    MessageCountingReducer,
    SessionKey,
    StoreClosedError,
    StoreHistoryProvider,
    history_provider,
    open_store,
)
from chatkeep.testing.scripted import ScriptedChatClient


def url() -> str:
    return f"memory://agent-{uuid.uuid4().hex}"


async def test_history_url_stores_by_tenant_and_session_and_resumes_in_a_new_agent() -> None:
    store_url = url()
    client = ScriptedChatClient()
    async with Agent(client, history=store_url) as agent:
        session = agent.create_session(tenant="acme")
        await agent.run("hello", session=session)
        payload = session.to_dict()
    assert "in_memory" not in payload["state"]  # the backend holds the history, not the session

    client2 = ScriptedChatClient()
    async with Agent(client2, history=store_url) as agent2:
        resumed = AgentSession.from_dict(payload, tenant="acme")
        await agent2.run("again", session=resumed)
    assert client2.requests[0].texts == ["user: hello", "assistant: echo: hello", "user: again"]

    async with open_store(store_url) as store:
        stored = await store.load(SessionKey("acme", session.session_id))
        assert [m.text for m in stored] == ["hello", "echo: hello", "again", "echo: again"]
        assert await store.count(SessionKey("default", session.session_id)) == 0  # other tenant: nothing


async def test_agent_closes_the_store_it_opened_but_not_one_it_was_given() -> None:
    agent = Agent(ScriptedChatClient(), history=url())
    provider = agent.history_provider
    assert isinstance(provider, StoreHistoryProvider)
    await agent.run("x", session=agent.create_session())
    await agent.close()
    await agent.close()  # idempotent
    with pytest.raises(StoreClosedError):
        await provider.store.count(SessionKey("default", "s"))

    given = open_store(url())
    async with Agent(ScriptedChatClient(), history=given) as agent2:
        await agent2.run("y", session=agent2.create_session())
    assert await given.count(SessionKey("default", "nothing")) == 0  # still open
    await given.close()


async def test_window_is_bounded_and_never_starts_with_an_orphaned_tool_result() -> None:
    store_url = url()
    key = SessionKey("default", "windowed")
    async with open_store(store_url) as store:
        from chatkeep.core import FunctionCallContent, FunctionResultContent

        history = []
        for i in range(10):
            history.append(Message(role="user", text=f"q{i}"))
            history.append(Message(role="assistant", contents=[FunctionCallContent(call_id=f"c{i}", name="t")]))
            history.append(Message(role="tool", contents=[FunctionResultContent(call_id=f"c{i}", result=i)]))
            history.append(Message(role="assistant", text=f"a{i}"))
        await store.append(key, history)

    client = ScriptedChatClient()
    # A window of 6 ends [..., call8, result8, a8, q9, call9, result9, a9] -> 6 newest start at result8.
    provider = history_provider(store_url, reducer=MessageCountingReducer(6))
    async with Agent(client, history=provider) as agent:
        await agent.run("next", session=AgentSession(session_id="windowed"))
    await provider.close()
    sent = client.requests[0].messages
    assert sent[0].role != "tool"
    assert [m.text for m in sent if m.role in ("user", "assistant") and m.text] == ["a8", "q9", "a9", "next"]
    assert len(sent) == 6  # result8 dropped: its call fell outside the window
