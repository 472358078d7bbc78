"""The OpenAI Agents SDK's own sessions beside ``ChatkeepSession``, on the same backend, measured in the same run.

The turn is what the SDK's runner does with a session per run: ``get_items(limit=20)``, then ``add_items`` of
the turn's 2 new items (a user message and an assistant message, ~200 and ~600 bytes of JSON). Pairs, each on
the same place:

* SQLite: the SDK's ``SQLiteSession`` (``sqlite3`` in a worker thread) and ``ChatkeepSession`` on
  ``sqlite:///``, a file each in the same folder; once with chatkeep's default durability
  (``synchronous=normal``: a commit survives a crash of the process) and once with the SDK's (SQLite's
  default, ``full``: it survives a power loss too, for an fsync per commit).
* PostgreSQL: the SDK's ``SQLAlchemySession`` (asyncpg) and ``ChatkeepSession`` on ``postgresql+asyncpg://``,
  in one schema of this run's own, whose tables are analyzed after seeding (as autovacuum would soon do):
  without statistics, plans cached while the tables were empty made chatkeep's append 2-3x slower at 10,000.
* Redis: the SDK's ``RedisSession`` and ``ChatkeepSession`` on ``redis://``, each under a key prefix of this run.

Beside each pair runs the floor: the raw async driver doing the least any session can do for the turn (one
read of the newest 21 JSON items and their ``json.loads``, one atomic insert of the 2 new ones), with no session
row, no idempotency and no counters. The SDK's turn divided by the floor's is the most any store could gain over
the SDK on that backend: where it is under 3, the issue's "3x faster at 10,000" is out of every store's reach.

Between the two runs "raw + chatkeep's guarantees": the same raw driver running chatkeep's own statements on
chatkeep's own tables or keys (SQLite's ``BEGIN IMMEDIATE``, upsert, idempotent insert, ``COMMIT``; PostgreSQL's
one-statement append; Redis's append script), with records built by ``json.dumps`` and read by ``json.loads``:
the guarantees without the library (no validation, no message objects, no pool, no window rule). The SDK's turn
divided by it is the most a store keeping chatkeep's guarantees could gain; chatkeep's turn over it is what the
library costs.

Sessions of 10, 1,000 and 10,000 items, each seeded through the session itself in ``add_items`` calls of 10
items (as turns with tool calls grow a history: the SDK's SQLAlchemy session orders by the insert time). The four
paths of a size take turns, one turn each, so a busy machine slows them alike. The ratio column is the SDK
session's median turn divided by chatkeep's: above 1, chatkeep is faster.

Run with ``python -m benchmarks interop-openai-agents [--quick] [--only sqlite,sqlite-full,postgresql,redis]`` (the nox
session ``interop_bench(framework='openai-agents')`` installs the SDK with its ``sqlalchemy`` and ``redis`` extras).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import os
import sqlite3
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from benchmarks._common import (
    INTEROP_TARGETS,
    Result,
    analyze_schema,
    measure_pairs,
    pair_arguments,
    speedup,
    target_line,
    times,
)
from chatkeep.core.backend import write_stamp
from chatkeep.redis import _layout as redis_layout
from chatkeep.redis._scripts import APPEND as REDIS_APPEND
from chatkeep.sql._ops import append_params
from chatkeep.sql._schema import key_hash, message_hash, tenant_hash
from chatkeep.sql._sql import Statements

__all__ = ["main"]

SIZES = (10, 1_000, 10_000)
WINDOW = 20
SEED_BATCH = 10
PG_URL = os.environ.get("CHATKEEP_BENCH_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("CHATKEEP_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
USER_TEXT, ANSWER_TEXT = "x" * 160, "y" * 520


def _turn_items() -> list[Any]:
    return [
        {"role": "user", "content": USER_TEXT},
        {
            "id": "msg_0123456789",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": ANSWER_TEXT, "annotations": [], "logprobs": []}],
        },
    ]


class _RawSQLite:
    """The floor on SQLite: ``sqlite3`` on the loop's thread, a table of JSON items, one transaction per add."""

    def __init__(self, connection: sqlite3.Connection, session_id: str) -> None:
        self._db, self._id = connection, session_id

    async def get_items(self, limit: int) -> list[Any]:
        rows = self._db.execute(
            "SELECT data FROM items WHERE session = ? ORDER BY id DESC LIMIT ?", (self._id, limit + 1)
        ).fetchall()
        return [json.loads(row[0]) for row in reversed(rows)]

    async def add_items(self, items: list[Any]) -> None:
        with self._db:
            self._db.executemany(
                "INSERT INTO items (session, data) VALUES (?, ?)", [(self._id, json.dumps(i)) for i in items]
            )

    async def clear_session(self) -> None:
        with self._db:
            self._db.execute("DELETE FROM items WHERE session = ?", (self._id,))


class _RawPostgres:
    """The floor on PostgreSQL: one asyncpg connection, a ``SELECT`` and an atomic ``executemany``."""

    def __init__(self, connection: Any, session_id: str) -> None:
        self._db, self._id = connection, session_id

    async def get_items(self, limit: int) -> list[Any]:
        rows = await self._db.fetch(
            "SELECT data FROM raw_items WHERE session = $1 ORDER BY id DESC LIMIT $2", self._id, limit + 1
        )
        return [json.loads(row[0]) for row in reversed(rows)]

    async def add_items(self, items: list[Any]) -> None:
        await self._db.executemany(
            "INSERT INTO raw_items (session, data) VALUES ($1, $2)", [(self._id, json.dumps(i)) for i in items]
        )

    async def clear_session(self) -> None:
        await self._db.execute("DELETE FROM raw_items WHERE session = $1", self._id)


# -- raw + chatkeep's guarantees: the raw driver running chatkeep's own statements ---------------------------

GUARDED_TENANT = "guarded"  # its own tenant, beside chatkeep's session of the same id in the same tables


def _record(item: Any) -> tuple[str, str]:
    """``(message_id, record)``: a chatkeep record of an SDK item as ``ChatkeepSession`` writes it (the readable
    rendering's text beside the item in its envelope), built with ``json.dumps``: no validation, no objects."""
    content = item.get("content")
    text = content if isinstance(content, str) else "".join(part.get("text", "") for part in content or [])
    message_id = str(uuid.uuid4())
    record = {
        "v": 1,
        "message_id": message_id,
        "role": item.get("role", "assistant"),
        "contents": [{"type": "text", "text": text}] if text else [],
        "author_name": None,
        "created_at": "2026-12-02T00:00:00Z",
        "additional_properties": {"chatkeep.interop": {"format": "openai-agents", "item": item}},
    }
    return message_id, json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def _item(record: str | bytes) -> Any:
    return json.loads(record)["additional_properties"]["chatkeep.interop"]["item"]


def _head(session_id: str) -> tuple[bytes, bytes, bytes, bytes]:
    return (
        key_hash(GUARDED_TENANT, session_id),
        tenant_hash(GUARDED_TENANT),
        GUARDED_TENANT.encode(),
        session_id.encode(),
    )


class _GuardedSQLite:
    """chatkeep's SQLite statements on ``sqlite3`` on the loop's thread: ``BEGIN IMMEDIATE``, the session upsert
    that reserves the sequence range, the insert that skips stored ids, ``COMMIT``; then the windowed read."""

    def __init__(self, connection: sqlite3.Connection, session_id: str) -> None:
        self._db, self._sql, self._head = connection, Statements("sqlite", "qmark"), _head(session_id)

    async def get_items(self, limit: int) -> list[Any]:
        rows = self._db.execute(self._sql.load_last, (self._head[0], limit + 1)).fetchall()
        return [_item(row[0]) for row in reversed(rows)]

    async def add_items(self, items: list[Any]) -> None:
        rows = [(message_hash(message_id), record) for message_id, record in map(_record, items)]
        now, n = time.time_ns() // 1000, len(rows)
        self._db.execute(self._sql.begin)
        session_ref, next_seq = self._db.execute(self._sql.upsert, (*self._head, now, now, n, n)).fetchone()[:2]
        params: list[Any] = []
        for seq, (message_hash_, record) in enumerate(rows, next_seq - n):
            params += (session_ref, seq, message_hash_, record, None)  # None: the message's token usage
        self._db.execute(self._sql.insert_messages(n), params)
        self._db.execute("COMMIT")

    async def clear_session(self) -> None:
        self._db.execute(self._sql.delete, (self._head[0],))


class _GuardedPostgres:
    """chatkeep's PostgreSQL statements on one asyncpg connection: the one-statement idempotent append (upsert and
    lock of the session row, ids already stored skipped) and the windowed read."""

    def __init__(self, connection: Any, session_id: str) -> None:
        self._db, self._sql, self._head = connection, Statements("postgresql", "numeric_dollar"), _head(session_id)

    async def get_items(self, limit: int) -> list[Any]:
        rows = await self._db.fetch(self._sql.load_last, self._head[0], limit + 1)
        return [_item(row[0]) for row in reversed(rows)]

    async def add_items(self, items: list[Any]) -> None:
        rows = [(message_hash(message_id), record) for message_id, record in map(_record, items)]
        now = time.time_ns() // 1000
        batch = [(message_hash_, record, None) for message_hash_, record in rows]  # (no token usage)
        await self._db.fetch(self._sql.pg_append(len(batch), usage=False), *append_params(self._head, now, batch))

    async def clear_session(self) -> None:
        await self._db.execute(self._sql.delete, self._head[0])


class _GuardedRedis:
    """chatkeep's Redis append script (ids, sequence, indexes, in one atomic call) and ``LRANGE`` on the bare
    hiredis connection the floor uses."""

    def __init__(self, connection: Any, prefix: str, session_id: str) -> None:
        self._db, self._id = connection, session_id
        h, m, i, index = redis_layout.session_keys(prefix, GUARDED_TENANT, session_id)
        self._keys, self._messages = (h, m, i, index, f"{prefix}:tenants"), m

    async def get_items(self, limit: int) -> list[Any]:
        return [_item(r) for r in await self._db.call("LRANGE", self._messages, -(limit + 1), -1)]

    async def add_items(self, items: list[Any]) -> None:
        ids, records = zip(*map(_record, items), strict=True)
        args = [write_stamp(), 0, 0, len(records), GUARDED_TENANT, self._id, 0, *ids, *records]
        await self._db.call("EVALSHA", REDIS_APPEND.sha, len(self._keys), *self._keys, *args)

    async def clear_session(self) -> None:
        await self._db.call("DEL", *self._keys[:3])


class _RawRedis:
    """The floor on Redis: an ``LRANGE`` and an ``RPUSH`` on the fastest asyncio client we know.

    That is chatkeep's ``resp`` transport (a bare asyncio protocol, hiredis parsing), about half redis-py's asyncio
    cost per round trip: a floor on redis-py would leave room a faster client could use.
    """

    def __init__(self, connection: Any, key: str) -> None:
        self._db, self._key = connection, key

    async def get_items(self, limit: int) -> list[Any]:
        return [json.loads(r) for r in await self._db.call("LRANGE", self._key, -(limit + 1), -1)]

    async def add_items(self, items: list[Any]) -> None:
        await self._db.call("RPUSH", self._key, *[json.dumps(i) for i in items])

    async def clear_session(self) -> None:
        await self._db.call("DEL", self._key)


@dataclass
class Pair:
    """One backend: how to make the SDK's session and chatkeep's for a session id, and how to clean up."""

    family: str
    sdk_name: str
    sdk: Callable[[str], Any]
    chatkeep: Callable[[str], Any]
    raw: Callable[[str], Any]  # the floor: the raw driver doing the least a turn can be
    guarded: Callable[[str], Any]  # the raw driver running chatkeep's own statements (its guarantees, no library)
    close: Callable[[], Awaitable[None]]
    seeded: Callable[[], Awaitable[None]] | None = None  # after seeding, before timing (PostgreSQL: ANALYZE)


@asynccontextmanager
async def _sqlite(synchronous: str) -> AsyncIterator[Pair]:
    from agents import SQLiteSession

    from chatkeep.core import SessionKey, open_store
    from chatkeep.interop.openai_agents import ChatkeepSession

    # One folder, a file each: sharing one file would couple the two through its WAL and its write lock.
    folder = tempfile.mkdtemp(prefix="chatkeep-bench-oa-")
    path = f"{folder}/sdk.db"
    store = open_store(f"sqlite:///{folder}/chatkeep.db?synchronous={synchronous}")
    raw = sqlite3.connect(f"{folder}/raw.db")
    raw.execute("PRAGMA journal_mode=WAL")
    raw.execute(f"PRAGMA synchronous={synchronous}")
    raw.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, session TEXT NOT NULL, data TEXT NOT NULL)")
    raw.execute("CREATE INDEX items_session ON items (session, id)")
    # chatkeep's schema in a file of its own, made by a chatkeep store, then driven by a bare connection.
    schema_maker = open_store(f"sqlite:///{folder}/guarded.db")
    await schema_maker.count(SessionKey(GUARDED_TENANT, "schema"))
    await schema_maker.close()
    guarded = sqlite3.connect(f"{folder}/guarded.db", isolation_level=None)
    for pragma in ("journal_mode=WAL", f"synchronous={synchronous}", "foreign_keys=ON"):
        guarded.execute(f"PRAGMA {pragma}")
    opened: list[Any] = []

    def sdk(session_id: str) -> Any:
        opened.append(SQLiteSession(session_id, path))
        return opened[-1]

    async def close() -> None:
        for session in opened:
            session.close()
        raw.close()
        guarded.close()
        await store.close()

    family = (
        "SQLite file"
        if synchronous == "normal"
        else f"SQLite file, chatkeep and the floor with synchronous={synchronous}"
    )
    yield Pair(
        family,
        "SQLiteSession",
        sdk,
        lambda sid: ChatkeepSession(sid, store=store),
        lambda sid: _RawSQLite(raw, sid),
        lambda sid: _GuardedSQLite(guarded, sid),
        close,
    )


@asynccontextmanager
async def _postgresql() -> AsyncIterator[Pair]:
    import asyncpg  # type: ignore[import-untyped]
    from agents.extensions.memory import SQLAlchemySession
    from sqlalchemy.ext.asyncio import create_async_engine

    from chatkeep.core import SessionKey, open_store
    from chatkeep.interop.openai_agents import ChatkeepSession

    schema = f"ck_bench_oa_{uuid.uuid4().hex[:10]}"
    dsn = PG_URL.replace("postgresql+asyncpg://", "postgresql://", 1)
    admin = await asyncpg.connect(dsn)
    await admin.execute(f'CREATE SCHEMA "{schema}"')
    engine = create_async_engine(PG_URL, connect_args={"server_settings": {"search_path": schema}})
    store = open_store(f"{PG_URL}?schema={schema}")
    raw = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    await raw.execute("CREATE TABLE raw_items (id bigserial PRIMARY KEY, session text NOT NULL, data text NOT NULL)")
    await raw.execute("CREATE INDEX raw_items_session ON raw_items (session, id)")
    await store.count(SessionKey(GUARDED_TENANT, "schema"))  # chatkeep makes its tables; the guarded path uses them
    guarded = await asyncpg.connect(dsn, server_settings={"search_path": schema})

    def sdk(session_id: str) -> Any:
        return SQLAlchemySession(session_id, engine=engine, create_tables=True)

    async def close() -> None:
        await store.close()
        await engine.dispose()
        await raw.close()
        await guarded.close()
        await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await admin.close()

    yield Pair(
        "PostgreSQL",
        "SQLAlchemySession (asyncpg)",
        sdk,
        lambda sid: ChatkeepSession(sid, store=store),
        lambda sid: _RawPostgres(raw, sid),
        lambda sid: _GuardedPostgres(guarded, sid),
        close,
        seeded=functools.partial(analyze_schema, dsn, schema),
    )


@asynccontextmanager
async def _redis() -> AsyncIterator[Pair]:
    import redis.asyncio as aredis
    from agents.extensions.memory import RedisSession

    from chatkeep.core import open_store
    from chatkeep.interop.openai_agents import ChatkeepSession
    from chatkeep.redis._resp import RespTransport, resp_target

    prefix = f"ckbench-oa-{uuid.uuid4().hex[:8]}"
    client = aredis.Redis.from_url(REDIS_URL)
    store = open_store(REDIS_URL, prefix=prefix)
    try:
        target = resp_target(REDIS_URL)
    except ValueError as exc:
        raise SystemExit(f"the Redis floor cannot run on {REDIS_URL}: {exc}") from None
    fast = RespTransport(target, address=REDIS_URL, socket_timeout=5.0, connect_timeout=5.0)
    await fast.call("SCRIPT", "LOAD", REDIS_APPEND.source)  # for the guarded path's EVALSHA

    def sdk(session_id: str) -> Any:
        return RedisSession(session_id, redis_client=client, key_prefix=f"{prefix}:sdk")

    async def close() -> None:
        await store.close()
        await fast.aclose()
        keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=1000)]
        for start in range(0, len(keys), 500):
            await client.unlink(*keys[start : start + 500])
        await client.aclose()

    yield Pair(
        "Redis",
        "RedisSession",
        sdk,
        lambda sid: ChatkeepSession(sid, store=store),
        lambda sid: _RawRedis(fast, f"{prefix}:raw:{sid}"),
        lambda sid: _GuardedRedis(fast, f"{prefix}:guarded", sid),
        close,
    )


PAIRS: dict[str, Callable[[], Any]] = {
    "sqlite": functools.partial(_sqlite, "normal"),
    # The SDK's SQLiteSession leaves SQLite's default, FULL: an fsync of the WAL at every commit. chatkeep's
    # default, NORMAL, keeps a commit through a crash of the process, not through a power loss.
    "sqlite-full": functools.partial(_sqlite, "full"),
    "postgresql": _postgresql,
    "redis": _redis,
}


async def _seed(session: Any, size: int) -> None:
    for start in range(0, size, SEED_BATCH):
        batch = [item for _ in range(SEED_BATCH // 2) for item in _turn_items()]
        await session.add_items(batch[: min(SEED_BATCH, size - start)])


async def _turn(session: Any) -> None:
    await session.get_items(limit=WINDOW)
    await session.add_items(_turn_items())


async def _alternating(sessions: dict[str, Any], turns: int, warmup: int = 20) -> dict[str, list[float]]:
    """Time ``turns`` turns of each session, one of each in turn (in alternating order), after ``warmup``.

    Turn by turn, not in blocks: on a shared machine the cost of an fsync changes from one second to the next,
    and blocks would hand one path the quiet seconds.
    """
    for _ in range(warmup):
        for session in sessions.values():
            await _turn(session)
    gc.collect()
    samples: dict[str, list[float]] = {name: [] for name in sessions}
    order = list(sessions.items())
    for n in range(turns):
        for name, session in order if n % 2 == 0 else reversed(order):
            start = time.perf_counter()
            await _turn(session)
            samples[name].append(time.perf_counter() - start)
    return samples


@dataclass
class Row:
    """One history size of one backend: the SDK's session, chatkeep's, the guarded raw path and the floor."""

    size: int
    sdk: Result
    chatkeep: Result
    guarded: Result
    floor: Result


async def _measure_pair(pair: Pair, *, turns: int) -> list[Row]:
    rows = []
    for size in SIZES:
        session_id = f"turn-{size}-{uuid.uuid4().hex[:6]}"
        sessions = {
            "sdk": pair.sdk(session_id),
            "chatkeep": pair.chatkeep(session_id),
            "guarded": pair.guarded(session_id),
            "floor": pair.raw(session_id),
        }
        for session in sessions.values():
            await _seed(session, size)
        if pair.seeded is not None:
            await pair.seeded()
        samples = await _alternating(sessions, turns)
        rows.append(
            Row(
                size,
                Result(pair.sdk_name, size, samples["sdk"]),
                Result("ChatkeepSession", size, samples["chatkeep"]),
                Result("raw + chatkeep's guarantees", size, samples["guarded"]),
                Result("floor", size, samples["floor"]),
            )
        )
        for session in sessions.values():
            await session.clear_session()
    return rows


def _table(family: str, rows: list[Row]) -> str:
    lines = [
        f"### {family}: get_items(limit=20) + add_items(2 items)",
        "",
        "| session items | SDK session | SDK p50 ms | ChatkeepSession p50 ms | raw + chatkeep's guarantees p50 ms | "
        "floor p50 ms | SDK p99 ms | chatkeep p99 ms | chatkeep speed-up (SDK p50 / chatkeep p50) | the most a store "
        "with chatkeep's guarantees could gain (SDK p50 / raw + guarantees p50) | the most any store could gain (SDK "
        "p50 / floor p50) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        sdk, chatkeep, guarded, floor = row.sdk, row.chatkeep, row.guarded, row.floor
        lines.append(
            f"| {row.size:,} | {sdk.name} | {sdk.p50 * 1e3:.3f} | {chatkeep.p50 * 1e3:.3f} | {guarded.p50 * 1e3:.3f} | "
            f"{floor.p50 * 1e3:.3f} | {sdk.p99 * 1e3:.3f} | {chatkeep.p99 * 1e3:.3f} | "
            f"{times(speedup(chatkeep, sdk))} | {times(speedup(guarded, sdk))} | {times(speedup(floor, sdk))} |"
        )
    return "\n".join(lines)


def _targets(results: dict[str, list[Row]]) -> str:
    lines = ["### Targets", ""]
    for family, rows in results.items():
        by_size = {row.size: row for row in rows}
        for size, which in ((SIZES[-1], "largest"), (SIZES[0], "smallest")):
            row = by_size[size]
            gained = speedup(row.chatkeep, row.sdk)
            line = target_line(family, size, gained, which)
            reach, guarded = speedup(row.floor, row.sdk), speedup(row.guarded, row.sdk)
            target = INTEROP_TARGETS[which]
            if target > reach:
                line += f" (out of every store's reach here: the floor itself is only {reach:.2f}x faster)"
            elif target > guarded:
                line += f" (out of reach with chatkeep's guarantees: the raw driver keeping them is {guarded:.2f}x)"
            elif target > gained:
                line += (
                    f" (the raw driver keeping chatkeep's guarantees reaches {guarded:.2f}x: the rest is the library)"
                )
            lines.append(line)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Run the benchmark and print one Markdown table per backend, then the targets."""
    chosen, quick = pair_arguments(
        "python -m benchmarks interop-openai-agents", __doc__.splitlines()[0], list(PAIRS), argv
    )
    turns = 100 if quick else 900

    results = asyncio.run(measure_pairs(PAIRS, chosen, functools.partial(_measure_pair, turns=turns)))
    for family, rows in results.items():
        print(_table(family, rows))
        print()
    print(_targets(results))
    return 0
