"""ChatkeepStore as LangGraph's stores are used, on memory, SQLite, PostgreSQL and Redis.

Items by namespace and key, updates that keep the creation time, search by prefix and filter, a query ranked by
chatkeep's recall where the store has the search capability, namespace listing, TTL, and a graph whose node
reads and writes the store LangGraph hands it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from langgraph.graph import START, StateGraph
from langgraph.store.base import BaseStore
from typing_extensions import TypedDict

from chatkeep.core import InvalidArgumentError, SearchUnsupportedError, SupportsSearch, SyncHistoryStore
from chatkeep.interop.langgraph import ChatkeepStore
from chatkeep.testing.embedding import HashingEmbedder


@pytest.fixture
def memories(view: SyncHistoryStore, tenant: str) -> Iterator[ChatkeepStore]:
    with ChatkeepStore(view, tenant=tenant, embedder=HashingEmbedder()) as store:
        yield store


def test_items_round_trip_and_an_update_keeps_the_creation_time(memories: ChatkeepStore) -> None:
    memories.put(("users", "ada"), "prefs", {"food": "Italian", "nested": {"n": [1, 2.5, None]}})
    first = memories.get(("users", "ada"), "prefs")
    assert first is not None
    assert first.value == {"food": "Italian", "nested": {"n": [1, 2.5, None]}}
    assert (first.namespace, first.key) == (("users", "ada"), "prefs")

    memories.put(("users", "ada"), "prefs", {"food": "Thai"})
    second = memories.get(("users", "ada"), "prefs")
    assert second is not None
    assert second.value == {"food": "Thai"}
    assert second.created_at == first.created_at
    assert second.updated_at > first.updated_at

    assert memories.get(("users", "bob"), "prefs") is None
    memories.delete(("users", "ada"), "prefs")
    assert memories.get(("users", "ada"), "prefs") is None


def test_search_by_prefix_filter_and_page_and_namespace_listing(memories: ChatkeepStore) -> None:
    for n in range(5):
        memories.put(("docs", "team-a"), f"a{n}", {"kind": "report" if n % 2 else "note", "n": n})
    memories.put(("docs", "team-b"), "b0", {"kind": "report", "n": 10})
    memories.put(("other",), "x", {"kind": "report", "n": 20})

    assert {i.key for i in memories.search(("docs",), limit=10)} == {"a0", "a1", "a2", "a3", "a4", "b0"}
    reports = memories.search(("docs",), filter={"kind": "report"}, limit=10)
    assert sorted(i.key for i in reports) == ["a1", "a3", "b0"]
    assert sorted(i.key for i in memories.search(("docs",), filter={"n": {"$gte": 3}}, limit=10)) == ["a3", "a4", "b0"]
    pages = [memories.search(("docs", "team-a"), limit=2, offset=offset) for offset in (0, 2, 4)]
    assert [len(page) for page in pages] == [2, 2, 1]
    assert sorted(i.key for page in pages for i in page) == ["a0", "a1", "a2", "a3", "a4"]

    assert memories.list_namespaces() == [("docs", "team-a"), ("docs", "team-b"), ("other",)]
    assert memories.list_namespaces(prefix=("docs",), max_depth=1) == [("docs",)]
    assert memories.list_namespaces(suffix=("team-b",)) == [("docs", "team-b")]
    with pytest.raises(InvalidArgumentError, match="Pass \\$eq"):
        memories.search(("docs",), filter={"n": {"$near": 3}})


def indexed(view: SyncHistoryStore) -> bool:
    """Whether the store indexed what was stored (a PostgreSQL without pgvector has the class, not the server)."""
    store = view.store
    if not isinstance(store, SupportsSearch):
        return False
    try:
        return view.run(store.index_info()) is not None
    except SearchUnsupportedError:
        return False


def test_a_query_is_ranked_by_recall_where_the_store_can_search(
    memories: ChatkeepStore, view: SyncHistoryStore
) -> None:
    memories.put(("facts",), "food", {"text": "Ada loves Italian food, pasta above all"})
    memories.put(("facts",), "job", {"text": "Ada works as a pilot"})
    memories.put(("elsewhere",), "food", {"text": "Italian pasta recipes"})

    found = memories.search(("facts",), query="what pasta does Ada like?")
    if indexed(view):
        assert [i.key for i in found][:1] == ["food"]
        assert found[0].score is not None
        assert found[0].namespace == ("facts",)
    else:  # as LangGraph's stores without an index: the prefix's items, unranked
        assert sorted(i.key for i in found) == ["food", "job"]
        assert all(i.score is None for i in found)


def test_an_expired_item_is_gone_and_a_read_restarts_its_ttl(memories: ChatkeepStore) -> None:
    memories.put(("s",), "short", {"v": 1}, ttl=0.02)  # 1.2 s
    memories.put(("s",), "kept", {"v": 2}, ttl=0.02)
    memories.put(("s",), "forever", {"v": 3})
    time.sleep(0.7)
    assert memories.get(("s",), "kept") is not None  # read: its ttl starts again
    time.sleep(0.7)
    assert memories.get(("s",), "short") is None
    assert memories.get(("s",), "kept", refresh_ttl=False) is not None
    assert {i.key for i in memories.search(("s",), refresh_ttl=False)} == {"kept", "forever"}


class Turn(TypedDict):
    user: str
    seen: list[str]


def test_a_graph_node_reads_and_writes_the_store_langgraph_hands_it(memories: ChatkeepStore) -> None:
    def remember(state: Turn, *, store: BaseStore) -> dict[str, Any]:
        namespace = ("memories", state["user"])
        store.put(namespace, str(len(store.search(namespace))), {"said": "hello"})
        return {"seen": [item.key for item in store.search(namespace, limit=10)]}

    builder = StateGraph(Turn)
    builder.add_node("remember", remember)
    builder.add_edge(START, "remember")
    graph = builder.compile(store=memories)
    assert graph.invoke({"user": "ada", "seen": []})["seen"] == ["0"]
    assert sorted(graph.invoke({"user": "ada", "seen": []})["seen"]) == ["0", "1"]
