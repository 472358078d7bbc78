"""LangGraph's own checkpointers beside ChatkeepSaver, on the same servers, in one run.

Run with ``python -m benchmarks interop-langgraph [--quick] [--backends redis,sqlite,postgresql] [--sizes 10,1000]``
after installing the pins of ``INTEROP["langgraph"]`` in noxfile.py (``nox -s "interop_bench(framework='langgraph')"``).

The turn is what a graph's run asks of its checkpointer per super-step, cut to its storage: read the thread's latest
checkpoint (``get_tuple`` without a checkpoint id, as a run starts), write the next checkpoint (``put``) and a task's
writes to it (``put_writes``). The state is the same small one at every size (a counter and the last two
messages), so the table shows what the thread's length costs, not its state's size. Each path's threads are seeded
with the size's prior steps (a checkpoint and its writes each) through the saver itself.

Checkpointers compared (LangGraph's own, as installed by the pins):

* SQLite file: ``langgraph-checkpoint-sqlite`` ``SqliteSaver`` (sqlite3, one connection).
* PostgreSQL: ``langgraph-checkpoint-postgres`` ``PostgresSaver`` (psycopg 3, one connection).
* Redis: ``langgraph-checkpoint-redis`` ``RedisSaver`` needs the RedisJSON and RediSearch modules; on a Redis
  without them (``MODULE LIST`` shows neither) it is left out and the run says so. ChatkeepSaver runs there anyway.
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, Checkpoint
from langgraph.checkpoint.base.id import uuid6

from benchmarks._common import Result, analyze_schema, interleaved_rounds, round_robin
from benchmarks._sync_adapters import Backend, plan, postgres_schema, redis_cleanup, run, scratch_folder
from chatkeep.core import open_store
from chatkeep.interop.langgraph import ChatkeepSaver

__all__ = ["main"]

SIZES = (10, 1_000, 10_000)
TENANT = "lgbench"
TEXT = "The quick brown fox jumps over the lazy dog. " * 4  # ~180 characters: a typical short chat message
REDIS_URL = os.environ.get("CHATKEEP_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
PG_URL = os.environ.get("CHATKEEP_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
ADAPTER = "ChatkeepSaver"
ADAPTER_ASYNC = "ChatkeepSaver, async methods"
CHANNELS = ("counter", "messages")


def _checkpoint(saver: BaseCheckpointSaver[Any], step: int, previous: Checkpoint | None) -> tuple[Checkpoint, Any]:
    """The checkpoint of ``step`` after ``previous``: both channels updated, with the saver's next versions."""
    old = previous["channel_versions"] if previous else {}
    versions = {channel: saver.get_next_version(old.get(channel), None) for channel in CHANNELS}
    checkpoint: Checkpoint = {
        "v": 4,
        "id": str(uuid6(clock_seq=step)),
        "ts": datetime.now(timezone.utc).isoformat(),
        "channel_values": {
            "counter": step,
            "messages": [HumanMessage(f"{step}: {TEXT}"), AIMessage(f"{step}: {TEXT}")],
        },
        "channel_versions": versions,
        "versions_seen": {"agent": dict(old)},
        "updated_channels": list(CHANNELS),
    }
    return checkpoint, versions


def _step(
    saver: BaseCheckpointSaver[Any], config: RunnableConfig, previous: Checkpoint | None, step: int
) -> tuple[RunnableConfig, Checkpoint]:
    """Put the checkpoint of ``step`` and a task's write to it; returns its config and the checkpoint."""
    checkpoint, versions = _checkpoint(saver, step, previous)
    stored = saver.put(config, checkpoint, {"source": "loop", "step": step, "parents": {}}, versions)
    saver.put_writes(stored, [("counter", step + 1)], str(uuid.uuid4()))
    return stored, checkpoint


def _thread_config(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


def _turn(saver: BaseCheckpointSaver[Any], thread_id: str) -> None:
    latest = saver.get_tuple(_thread_config(thread_id))
    assert latest is not None
    _step(saver, latest.config, latest.checkpoint, int(latest.metadata["step"]) + 1)


async def _aturn(saver: BaseCheckpointSaver[Any], thread_id: str) -> None:
    latest = await saver.aget_tuple(_thread_config(thread_id))
    assert latest is not None
    step = int(latest.metadata["step"]) + 1
    checkpoint, versions = _checkpoint(saver, step, latest.checkpoint)
    stored = await saver.aput(latest.config, checkpoint, {"source": "loop", "step": step, "parents": {}}, versions)
    await saver.aput_writes(stored, [("counter", step + 1)], str(uuid.uuid4()))


@dataclass
class Path:
    """One checkpointer on one backend, and which turn it runs."""

    name: str
    saver: BaseCheckpointSaver[Any]
    turn: Callable[[BaseCheckpointSaver[Any], str], Any]


def _adapter(backend: Backend[Path], url: str, **options: Any) -> None:
    view = open_store(url, **options).sync()
    saver = ChatkeepSaver(view, tenant=TENANT)
    backend.paths += [Path(ADAPTER, saver, _turn), Path(ADAPTER_ASYNC, saver, _aturn)]
    backend.closers.append(view.close)


def _sqlite(run_id: str) -> Backend[Path]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    folder, remove = scratch_folder("chatkeep-lgbench-")
    connection = sqlite3.connect(f"{folder}/langgraph.db", check_same_thread=False)
    backend = Backend("SQLite file", [Path("langgraph-checkpoint-sqlite SqliteSaver", SqliteSaver(connection), _turn)])
    _adapter(backend, f"sqlite:///{folder}/chatkeep.db")
    backend.closers += [remove, connection.close]
    return backend


def _postgresql(run_id: str) -> Backend[Path]:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    schema = f"ck_lgbench_{run_id}"
    drop = postgres_schema(PG_URL, schema)
    connection = psycopg.connect(
        PG_URL, autocommit=True, prepare_threshold=0, row_factory=dict_row, options=f"-csearch_path={schema}"
    )
    theirs = PostgresSaver(connection)  # type: ignore[arg-type]
    theirs.setup()
    backend = Backend("PostgreSQL", [Path("langgraph-checkpoint-postgres PostgresSaver", theirs, _turn)])
    _adapter(backend, f"{PG_URL}?schema={schema}")
    backend.seeded = lambda: asyncio.run(analyze_schema(PG_URL, schema))
    backend.closers += [drop, connection.close]
    return backend


def _redis(run_id: str) -> Backend[Path]:
    import redis

    prefix = f"lgbench-{run_id}"
    client = redis.Redis.from_url(REDIS_URL)
    modules = {str(m.get(b"name", m.get("name", b"")), "utf-8", "replace").lower() for m in client.module_list()}
    client.close()
    backend: Backend[Path] = Backend("Redis", [])
    if {"search", "rejson"} <= modules or {"search", "redisjson"} <= modules:
        from langgraph.checkpoint.redis import RedisSaver

        theirs = RedisSaver(redis_url=REDIS_URL)
        theirs.setup()
        backend.paths.append(Path("langgraph-checkpoint-redis RedisSaver", theirs, _turn))
    else:
        backend.note = (
            "langgraph-checkpoint-redis RedisSaver left out: this Redis has no RediSearch and RedisJSON modules "
            f"(MODULE LIST: {sorted(modules) or 'none'}), which it needs"
        )
    _adapter(backend, REDIS_URL, prefix=f"{prefix}-ck")
    backend.closers.append(redis_cleanup(REDIS_URL, prefix))
    return backend


BACKENDS: dict[str, Callable[[str], Backend[Path]]] = {"sqlite": _sqlite, "postgresql": _postgresql, "redis": _redis}


ITERATIONS = {10: 200, 1_000: 100, 10_000: 50}  # per round, before --quick


def _threads(path: Path, size: int, count: int) -> list[str]:
    """``count`` threads of ``size`` prior steps each, seeded through the saver itself."""
    threads = []
    for _ in range(count):
        thread_id = f"s{size}-{uuid.uuid4().hex[:12]}"
        config = _thread_config(thread_id)
        previous: Checkpoint | None = None
        for step in range(size):
            config, previous = _step(path.saver, config, previous, step)
        threads.append(thread_id)
    return threads


def _run_backend(backend: Backend[Path], sizes: tuple[int, ...], rounds: int, quick: bool) -> list[Result]:
    results: list[Result] = []
    shared: dict[int, list[str]] = {}
    for size in sizes:
        iterations, warmup = plan(ITERATIONS, size, quick)
        turns_per_path = rounds * (iterations + warmup)
        turns_per_thread = max(2, size // 5)  # each turn adds a step: growth of at most a fifth
        count = math.ceil(turns_per_path / turns_per_thread)
        turns: dict[str, Iterator[str]] = {}
        for path in backend.paths:
            # The adapter's sync and async rows share one saver, so they share its threads.
            if path.name == ADAPTER_ASYNC:
                turns[path.name] = round_robin(shared[size])
                continue
            threads = _threads(path, size, count)
            if path.name == ADAPTER:
                shared[size] = threads
            turns[path.name] = round_robin(threads)
        if backend.seeded is not None:
            backend.seeded()
        # functools.partial: an async turn stays a coroutine function.
        rows = [(path.name, functools.partial(path.turn, path.saver), turns[path.name]) for path in backend.paths]
        results += interleaved_rounds(rows, size, rounds=rounds, iterations=iterations, warmup=warmup)
    return results


def main(argv: list[str]) -> int:
    """Run the benchmark and print a Markdown table per backend, then the targets."""
    return run(
        argv,
        prog="python -m benchmarks interop-langgraph",
        description=__doc__.splitlines()[0],
        backends=BACKENDS,
        sizes=SIZES,
        measure=_run_backend,
        title=lambda backend: f"{backend.name}: the turn (get_tuple of the latest checkpoint, put, put_writes)",
        adapter=ADAPTER,
        stores="LangGraph checkpointer",
        framework="langgraph",
        needs=("langgraph.checkpoint.postgres", "langgraph.checkpoint.sqlite"),
    )
