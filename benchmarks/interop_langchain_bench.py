"""LangChain's own chat histories beside ChatkeepChatMessageHistory, on the same servers, in one run.

Run with ``python -m benchmarks interop-langchain [--quick] [--backends redis,sqlite,postgresql] [--sizes 10,1000]``
after installing the pins of ``INTEROP["langchain"]`` in noxfile.py (``nox -s "interop_bench(framework='langchain')"``).

The turn is what ``RunnableWithMessageHistory`` asks of a history per run: read the history the prompt gets
(the newest 20 messages), then ``add_messages`` of the question and the answer. LangChain's stores have no
window, so their turn reads ``messages`` (the whole history) and keeps the newest 20: that is their real cost.
The adapter reads ``max_messages=20`` from the store. Both are called through LangChain's sync methods (what
``invoke`` uses); the adapter's async methods (what ``ainvoke`` uses) are a row of their own.

Stores compared (LangChain's own, as installed by the pins):

* Redis: ``langchain_community`` ``RedisChatMessageHistory`` (a list, ``LPUSH`` per message, ``LRANGE 0 -1``).
  ``langchain-redis``'s history needs the RedisJSON and RediSearch modules, which a plain Redis lacks.
* SQLite file and PostgreSQL: ``langchain_community`` ``SQLChatMessageHistory`` (SQLAlchemy, sync engine).
* PostgreSQL: ``langchain_postgres`` ``PostgresChatMessageHistory`` (psycopg 3, one connection).

Each path gets sessions seeded with the size's messages; timed turns go round the sessions so a session grows by
at most a fifth of its size (or 4 messages) while it is measured. Paths are interleaved round by round so a
busy machine slows them alike.
"""

from __future__ import annotations

import asyncio
import math
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from benchmarks._common import Result, analyze_schema, interleaved_rounds, round_robin
from benchmarks._sync_adapters import Backend, plan, postgres_schema, redis_cleanup, run, scratch_folder
from chatkeep.core import SyncHistoryStore, open_store
from chatkeep.interop.langchain import ChatkeepChatMessageHistory

__all__ = ["main"]

SIZES = (10, 1_000, 10_000)
WINDOW = 20
TENANT = "lcbench"
TEXT = "The quick brown fox jumps over the lazy dog. " * 4  # ~180 characters: a typical short chat message
PAIR = [HumanMessage(f"next question: {TEXT}"), AIMessage(f"next answer: {TEXT}")]
REDIS_URL = os.environ.get("CHATKEEP_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
PG_URL = os.environ.get("CHATKEEP_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
ADAPTER = "ChatkeepChatMessageHistory"
ADAPTER_ASYNC = "ChatkeepChatMessageHistory, async methods"


def _message(n: int) -> BaseMessage:
    return HumanMessage(f"{n}: {TEXT}") if n % 2 == 0 else AIMessage(f"{n}: {TEXT}")


def _framework_turn(history: BaseChatMessageHistory) -> None:
    history.messages[-WINDOW:]  # their whole history is read: that is the cost measured
    history.add_messages(PAIR)


def _adapter_turn(history: BaseChatMessageHistory) -> None:
    history.messages  # noqa: B018 - max_messages=20: the store reads only those
    history.add_messages(PAIR)


async def _adapter_async_turn(history: BaseChatMessageHistory) -> None:
    await history.aget_messages()
    await history.aadd_messages(PAIR)


@dataclass
class Path:
    """One history class on one backend: how to make a session's history, and which turn it runs."""

    name: str
    make: Callable[[str], BaseChatMessageHistory]
    turn: Callable[[BaseChatMessageHistory], Any]
    uuid_ids: bool = False  # langchain-postgres takes only UUIDs as session ids


def _adapter_paths(view: SyncHistoryStore) -> list[Path]:
    def make(session_id: str) -> BaseChatMessageHistory:
        return ChatkeepChatMessageHistory(session_id, view, tenant=TENANT, max_messages=WINDOW)

    return [Path(ADAPTER, make, _adapter_turn), Path(ADAPTER_ASYNC, make, _adapter_async_turn)]


def _redis(run_id: str) -> Backend[Path]:
    from langchain_community.chat_message_histories import RedisChatMessageHistory

    prefix = f"lcbench-{run_id}"
    view = open_store(REDIS_URL, prefix=f"{prefix}-ck").sync()

    def community(session_id: str) -> BaseChatMessageHistory:
        return RedisChatMessageHistory(session_id, url=REDIS_URL, key_prefix=f"{prefix}-lc:")

    backend = Backend("Redis", [Path("langchain-community RedisChatMessageHistory", community, _framework_turn)])
    backend.paths += _adapter_paths(view)
    backend.closers += [redis_cleanup(REDIS_URL, prefix), view.close]
    return backend


def _sqlite(run_id: str) -> Backend[Path]:
    from sqlalchemy import create_engine

    folder, remove = scratch_folder("chatkeep-lcbench-")
    engine = create_engine(f"sqlite:///{folder}/langchain.db")
    view = open_store(f"sqlite:///{folder}/chatkeep.db").sync()
    backend = Backend(
        "SQLite file",
        [Path("langchain-community SQLChatMessageHistory", _sql_history(engine, run_id), _framework_turn)],
    )
    backend.paths += _adapter_paths(view)
    backend.closers += [remove, engine.dispose, view.close]
    return backend


def _sql_history(engine: Any, run_id: str) -> Callable[[str], BaseChatMessageHistory]:
    from langchain_community.chat_message_histories import SQLChatMessageHistory

    def make(session_id: str) -> BaseChatMessageHistory:
        # One table per size (the session id says which), so no table holds more than one size's sessions.
        table = f"lc_{run_id}_{session_id.split('-')[0]}"
        return SQLChatMessageHistory(session_id, table_name=table, connection=engine)

    return make


def _postgresql(run_id: str) -> Backend[Path]:
    import psycopg
    from langchain_postgres import PostgresChatMessageHistory
    from sqlalchemy import create_engine

    schema = f"ck_lcbench_{run_id}"
    drop = postgres_schema(PG_URL, schema)
    engine = create_engine(
        PG_URL.replace("postgresql://", "postgresql+psycopg://", 1), connect_args={"options": f"-csearch_path={schema}"}
    )
    connection = psycopg.connect(PG_URL, autocommit=True, options=f"-csearch_path={schema}")
    PostgresChatMessageHistory.create_tables(connection, "lc_postgres")
    view = open_store(f"{PG_URL}?schema={schema}").sync()

    def langchain_postgres(session_id: str) -> BaseChatMessageHistory:
        return PostgresChatMessageHistory("lc_postgres", session_id, sync_connection=connection)

    backend = Backend(
        "PostgreSQL",
        [
            Path("langchain-community SQLChatMessageHistory", _sql_history(engine, run_id), _framework_turn),
            Path("langchain-postgres PostgresChatMessageHistory", langchain_postgres, _framework_turn, uuid_ids=True),
        ],
    )

    backend.paths += _adapter_paths(view)
    backend.seeded = lambda: asyncio.run(analyze_schema(PG_URL, schema))
    backend.closers += [drop, engine.dispose, connection.close, view.close]
    return backend


BACKENDS: dict[str, Callable[[str], Backend[Path]]] = {"redis": _redis, "sqlite": _sqlite, "postgresql": _postgresql}


ITERATIONS = {10: 200, 1_000: 100, 10_000: 30}  # per round, before --quick: LangChain's stores are slow at 10,000


def _sessions(path: Path, size: int, count: int) -> list[BaseChatMessageHistory]:
    """``count`` histories of ``size`` messages each, seeded through the history itself."""
    histories = []
    for _ in range(count):
        session_id = str(uuid.uuid4()) if path.uuid_ids else f"s{size}-{uuid.uuid4().hex[:12]}"
        history = path.make(session_id)
        for start in range(0, size, 1_000):
            history.add_messages([_message(n) for n in range(start, min(size, start + 1_000))])
        histories.append(history)
    return histories


def _run_backend(backend: Backend[Path], sizes: tuple[int, ...], rounds: int, quick: bool) -> list[Result]:
    results: list[Result] = []
    for size in sizes:
        iterations, warmup = plan(ITERATIONS, size, quick)
        turns_per_path = rounds * (iterations + warmup)
        turns_per_session = max(2, size // 10)  # each turn adds 2 messages: growth of at most a fifth
        count = math.ceil(turns_per_path / turns_per_session)
        turns = {path.name: round_robin(_sessions(path, size, count)) for path in backend.paths}
        if backend.seeded is not None:
            backend.seeded()
        rows = [(path.name, path.turn, turns[path.name]) for path in backend.paths]
        results += interleaved_rounds(rows, size, rounds=rounds, iterations=iterations, warmup=warmup)
    return results


def main(argv: list[str]) -> int:
    """Run the benchmark and print a Markdown table per backend, then the targets."""
    return run(
        argv,
        prog="python -m benchmarks interop-langchain",
        description=__doc__.splitlines()[0],
        backends=BACKENDS,
        sizes=SIZES,
        measure=_run_backend,
        title=lambda backend: f"{backend.name}: the turn (read the newest {WINDOW}, add_messages of 2)",
        adapter=ADAPTER,
        stores="LangChain store",
        framework="langchain",
        needs=("langchain_community", "langchain_postgres"),
    )
