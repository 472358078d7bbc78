"""What ChatkeepSaver owes beyond LangGraph's conformance suite, on memory, SQLite, PostgreSQL and Redis.

Windowed reads (the latest checkpoint and ``list(limit=k)`` read what they return, not the thread), the serializer's
bytes kept exactly, ``copy_thread`` as a chatkeep fork, tenants, sessions the saver did not write, sync calls made
inside a running event loop, and the store's life cycle.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

from chatkeep.core import (
    ConcurrencyConflictError,
    InvalidArgumentError,
    Message,
    MessageFormatError,
    SessionKey,
    SyncHistoryStore,
    UnsupportedOperationError,
)
from chatkeep.core.backend import SupportsReadProbe
from chatkeep.interop._envelope import unwrap
from chatkeep.interop.langgraph import FORMAT, ChatkeepSaver
from chatkeep.memory import MemoryHistoryStore

SaverFactory = Callable[..., ChatkeepSaver]  # the ``saver`` fixture


def put_chain(saver: ChatkeepSaver, thread_id: str, n: int, *, writes: bool = True, ns: str = "") -> list[str]:
    """``n`` checkpoints, each the parent of the next and followed by a task's write; returns their ids."""
    ids: list[str] = []
    parent: str | None = None
    for step in range(n):
        config = generate_config(thread_id, checkpoint_ns=ns, checkpoint_id=parent)
        checkpoint = generate_checkpoint(channel_values={"step": step}, channel_versions={"step": step + 1})
        stored = saver.put(config, checkpoint, generate_metadata(step=step), {"step": step + 1})
        if writes:
            saver.put_writes(stored, [("step", step + 1)], f"task-{step}")
        parent = checkpoint["id"]
        ids.append(parent)
    return ids


def test_the_latest_checkpoint_and_a_listed_page_read_only_the_newest_records(
    saver: SaverFactory, view: SyncHistoryStore
) -> None:
    probe = view.store
    if not isinstance(probe, SupportsReadProbe):
        pytest.skip(f"{type(probe).__name__} does not count the records it reads")
    lg = saver()
    ids = put_chain(lg, "long", 150)  # 300 records: a checkpoint and its writes, 150 times

    before = probe.messages_read
    latest = lg.get_tuple(generate_config("long"))
    assert latest is not None
    assert latest.checkpoint["id"] == ids[-1]
    assert latest.pending_writes == [("task-149", "step", 150)]
    assert probe.messages_read - before == 4  # the latest two checkpoints and their writes, in one read

    for k in (1, 5, 40):
        before = probe.messages_read
        page = list(lg.list(generate_config("long"), limit=k))
        assert [t.checkpoint["id"] for t in page] == ids[::-1][:k]
        assert probe.messages_read - before == 2 * k + 2, f"list(limit={k}) read more than its window"

    before = probe.messages_read
    older = lg.get_tuple(generate_config("long", checkpoint_id=ids[-3]))
    assert older is not None
    assert older.checkpoint["channel_values"] == {"step": 147}
    assert older.pending_writes == [("task-147", "step", 148)]
    assert probe.messages_read - before == 4 + 16, "a recent checkpoint was not found in the second window"


def test_writes_that_reach_the_store_before_their_checkpoint_still_belong_to_it(saver: SaverFactory) -> None:
    # LangGraph puts a checkpoint in the background while the next step's tasks run: a fast task's writes can
    # be stored first.
    lg = saver()
    first = lg.put(generate_config("race"), generate_checkpoint(), generate_metadata(step=0), {})
    second = generate_checkpoint()
    lg.put_writes(generate_config("race", checkpoint_id=second["id"]), [("ch", "early")], "fast-task")
    lg.put(first, second, generate_metadata(step=1), {})
    lg.put_writes(generate_config("race", checkpoint_id=second["id"]), [("ch", "late")], "slow-task")

    latest = lg.get_tuple(generate_config("race"))
    assert latest is not None
    assert latest.checkpoint["id"] == second["id"]
    assert latest.pending_writes == [("fast-task", "ch", "early"), ("slow-task", "ch", "late")]
    assert [t.pending_writes for t in lg.list(generate_config("race"))] == [latest.pending_writes, []]


def test_checkpoints_and_writes_keep_the_serializers_bytes(saver: SaverFactory, view: SyncHistoryStore) -> None:
    lg = saver()
    values: dict[str, Any] = {
        "messages": [HumanMessage("héllo 🌍 \x00", id="h1"), AIMessage("", tool_calls=[], id="a1")],
        "when": datetime.datetime(2026, 12, 3, 18, 30, tzinfo=datetime.timezone.utc),
        "raw": b"\x00\xff bytes",
        "nested": {"set": {1, 2}, "list": [1, "two", None]},
    }
    checkpoint = generate_checkpoint(channel_values=values, channel_versions=dict.fromkeys(values, 1))
    stored = lg.put(generate_config("exact"), checkpoint, generate_metadata(score=0.5), dict.fromkeys(values, 1))
    lg.put_writes(stored, [("raw", b"\x01"), ("when", values["when"])], "task")

    found = lg.get_tuple(stored)
    assert found is not None
    assert found.checkpoint == checkpoint
    assert found.metadata["score"] == 0.5
    assert found.pending_writes == [("task", "raw", b"\x01"), ("task", "when", values["when"])]

    records = [unwrap(message, format=FORMAT) for message in view.load(SessionKey(lg.tenant, "exact"))]
    first = records[0]
    assert first is not None
    kind, data = lg.serde.dumps_typed(checkpoint)
    stored_kind, stored_data = first["checkpoint"]
    assert (stored_kind, base64.b64decode(stored_data)) == (kind, data), "not LangGraph's own bytes"


def test_copy_thread_forks_the_thread_and_never_joins_an_existing_one(
    saver: SaverFactory, view: SyncHistoryStore
) -> None:
    lg = saver()
    ids = put_chain(lg, "source", 3)
    lg.copy_thread("source", "copy")

    info = {i.session_id: i for i in view.list_sessions(lg.tenant).items}
    assert info["copy"].forked_from is not None
    assert info["copy"].forked_from.session_id == "source"
    assert [t.checkpoint["id"] for t in lg.list(generate_config("copy"))] == ids[::-1]
    put_chain(lg, "source", 1)  # the source goes on; the copy does not see it
    assert [t.checkpoint["id"] for t in lg.list(generate_config("copy"))] == ids[::-1]

    with pytest.raises(ConcurrencyConflictError, match=r"already exists.*delete_thread it first"):
        lg.copy_thread("source", "copy")
    lg.copy_thread("nothing-here", "copy-of-nothing")
    assert lg.get_tuple(generate_config("copy-of-nothing")) is None


def test_prune_keeps_each_namespaces_latest_checkpoint_with_its_writes(saver: SaverFactory) -> None:
    lg = saver()
    root = put_chain(lg, "t", 4)
    child = put_chain(lg, "t", 3, ns="child:1")
    lg.prune(["t"])
    assert [t.checkpoint["id"] for t in lg.list({"configurable": {"thread_id": "t"}})] == [child[-1], root[-1]]
    latest = lg.get_tuple(generate_config("t"))
    assert latest is not None
    assert latest.pending_writes == [("task-3", "step", 4)]

    with pytest.raises(InvalidArgumentError, match="Pass strategy='keep_latest'"):
        lg.prune(["t"], strategy="keep_some")


def test_tenants_keep_threads_apart_and_list_none_walks_only_threads(
    saver: SaverFactory, view: SyncHistoryStore, tenant: str
) -> None:
    ours, theirs = saver(), saver(tenant=f"{tenant}-other")
    put_chain(ours, "same-id", 2)
    put_chain(theirs, "same-id", 1)
    put_chain(ours, "second", 1)
    view.append(SessionKey(tenant, "a-chat"), [Message(role="user", text="not a LangGraph thread")])

    assert len(list(ours.list(generate_config("same-id")))) == 2
    assert len(list(theirs.list(generate_config("same-id")))) == 1
    everything = list(ours.list(None))
    assert sorted(t.config["configurable"]["thread_id"] for t in everything) == ["same-id", "same-id", "second"]
    assert len(list(ours.list(None, limit=2))) == 2

    with pytest.raises(MessageFormatError, match="not a LangGraph checkpoint or writes record"):
        ours.get_tuple(generate_config("a-chat"))


async def test_sync_methods_work_inside_a_running_event_loop(saver: SaverFactory) -> None:
    lg = saver()
    stored = lg.put(generate_config("mixed"), generate_checkpoint(), generate_metadata(), {})  # a blocking call
    await lg.aput_writes(stored, [("ch", "async")], "t1")
    lg.put_writes(stored, [("ch", "sync")], "t2")
    found = await lg.aget_tuple(stored)
    assert found is not None
    assert [w[2] for w in found.pending_writes or []] == ["async", "sync"]
    assert [t.checkpoint["id"] async for t in lg.alist(generate_config("mixed"))] == [found.checkpoint["id"]]


def test_a_saver_opened_from_a_url_closes_its_store_and_a_passed_view_stays_open(
    store_url: str, view: SyncHistoryStore, tenant: str
) -> None:
    config: RunnableConfig = generate_config("owned")
    with ChatkeepSaver(store_url, tenant=tenant) as owned:
        owned.put(config, generate_checkpoint(), generate_metadata(), {})
    assert owned.store.closed
    with ChatkeepSaver(view, tenant=tenant) as shared:
        if not store_url.startswith("memory"):  # each memory:// URL opens a store of its own
            assert shared.get_tuple(config) is not None
    assert not view.closed


class StoreWithoutForks(MemoryHistoryStore):
    """A store whose plugin predates forks (as Blob's): ``fork`` raises ``UnsupportedOperationError``."""

    async def _fork(self, source: SessionKey, target: SessionKey, through: str | None) -> int:
        raise UnsupportedOperationError("this store cannot fork sessions; copy them instead")


def test_copy_thread_copies_the_records_on_a_store_without_forks(tenant: str) -> None:
    with StoreWithoutForks(f"memory://?namespace={tenant}").sync() as view:
        lg = ChatkeepSaver(view, tenant=tenant)
        ids = put_chain(lg, "source", 3)
        lg.copy_thread("source", "copy")
        copied = list(lg.list(generate_config("copy")))
        assert [t.checkpoint["id"] for t in copied] == ids[::-1]
        assert copied[0].pending_writes == [("task-2", "step", 3)]
        assert all(i.forked_from is None for i in view.list_sessions(tenant).items)
