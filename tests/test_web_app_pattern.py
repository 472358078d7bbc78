"""The multi-user web app pattern from docs/security.md: sessions kept on the server, bound to tenant and owner.

The client only ever sends its own session id; the tenant and user come from authentication; the
service's conversation id lives in the stored session document, never in what the client sends.
"""

from __future__ import annotations

import uuid

import pytest

from chatkeep.core import (
    ABSENT,
    Agent,
    AgentSession,
    ConcurrencyConflictError,
    HistoryStore,
    SessionKey,
    SessionOwnershipError,
    StoredSession,
    open_store,
)
from chatkeep.testing.scripted import ScriptedChatClient


async def handle_chat(store: HistoryStore, agent: Agent, *, tenant: str, user: str, session_id: str, text: str) -> str:
    """One request of the web app: what the docs show, line for line."""
    key = SessionKey(tenant, session_id)
    stored = await store.load_session(key, owner=user)  # SessionOwnershipError for another user's session
    session = stored.session if stored else AgentSession(session_id=session_id, tenant=tenant)
    response = await agent.run(text, session=session)
    await store.save_session(key, session, expected_version=stored.version if stored else ABSENT, owner=user)
    return response.text


@pytest.fixture
async def store() -> HistoryStore:
    async with open_store(f"memory://webapp-{uuid.uuid4().hex}") as opened:
        yield opened  # type: ignore[misc]


async def test_service_conversation_id_is_kept_on_the_server(store: HistoryStore) -> None:
    client = ScriptedChatClient(keeps_history=True)  # a service that keeps the conversation
    agent = Agent(client)
    await handle_chat(store, agent, tenant="acme", user="alice", session_id="chat-1", text="hi")
    await handle_chat(store, agent, tenant="acme", user="alice", session_id="chat-1", text="again")
    stored = await store.load_session(SessionKey("acme", "chat-1"))
    assert stored is not None
    assert stored.session.service_session_id == "conv_1"
    assert client.requests[1].options.conversation_id == "conv_1"  # continued from the server's record


async def test_another_user_or_tenant_cannot_reach_the_session(store: HistoryStore) -> None:
    agent = Agent(ScriptedChatClient())
    await handle_chat(store, agent, tenant="acme", user="alice", session_id="chat-1", text="private")
    with pytest.raises(SessionOwnershipError):
        await handle_chat(store, agent, tenant="acme", user="mallory", session_id="chat-1", text="show me")
    # Another tenant using the same id gets a new, empty session of its own.
    client = ScriptedChatClient()
    await handle_chat(store, Agent(client), tenant="globex", user="alice", session_id="chat-1", text="hello")
    assert client.requests[0].texts == ["user: hello"]


@pytest.mark.reliability
async def test_two_concurrent_requests_on_one_session_do_not_lose_a_turn_silently(store: HistoryStore) -> None:
    agent = Agent(ScriptedChatClient())
    await handle_chat(store, agent, tenant="acme", user="alice", session_id="chat-1", text="first")
    key = SessionKey("acme", "chat-1")
    first = await store.load_session(key, owner="alice")
    second = await store.load_session(key, owner="alice")
    assert first is not None
    assert second is not None
    await agent.run("from tab A", session=first.session)
    await agent.run("from tab B", session=second.session)
    await store.save_session(key, first.session, expected_version=first.version, owner="alice")
    with pytest.raises(ConcurrencyConflictError):
        await store.save_session(key, second.session, expected_version=second.version, owner="alice")


@pytest.mark.reliability
async def test_two_first_requests_on_a_new_session_do_not_lose_a_turn_silently(store: HistoryStore) -> None:
    agent = Agent(ScriptedChatClient())
    key = SessionKey("acme", "chat-new")
    tab_a = AgentSession(session_id="chat-new", tenant="acme")
    tab_b = AgentSession(session_id="chat-new", tenant="acme")
    await agent.run("from tab A", session=tab_a)
    await agent.run("from tab B", session=tab_b)
    version = await store.save_session(key, tab_a, expected_version=ABSENT, owner="alice")
    with pytest.raises(ConcurrencyConflictError):
        await store.save_session(key, tab_b, expected_version=ABSENT, owner="alice")
    assert await store.load_session(key, owner="alice") == StoredSession(tab_a, version)
