"""The SQL backend beside the raw drivers, on SQLite, PostgreSQL and MariaDB/MySQL, measured in the same run.

A turn is what an agent does per user message: ``load(last=20)`` then ``append`` of two messages (~200 and
~600 bytes). Paths, per database and session size (10, 1,000 and 100,000 messages):

* ``raw sync``: the plain driver (``sqlite3``, ``psycopg``, ``pymysql``): the two statements, autocommit, a
  client-side sequence counter (one writer assumed: no locking, no idempotency), ``json`` decode of the 20.
* ``raw sync + guarantees``: the same driver doing what an idempotent, contiguous append needs, in the fewest
  round trips we know: on PostgreSQL chatkeep's one autocommitted statement (data-modifying CTEs: the upsert
  of the session row reserving the sequence range under its lock, ``INSERT ... ON CONFLICT DO NOTHING``); on
  SQLite and MariaDB a transaction (``BEGIN [IMMEDIATE]``, the upsert ``RETURNING`` the range, the idempotent
  insert, ``COMMIT``). It reads the newest 20 with chatkeep's own statement (the session found by its key's
  hash), where ``raw sync`` reads by a row id it keeps.
* ``raw + guarantees, off the loop`` (SQLite only): the same, each call (the read, the append) in a worker
  thread through ``asyncio.to_thread``, as an async program must run a blocking driver (the OpenAI Agents SDK's
  ``SQLiteSession`` does this); the 20 records are decoded on the loop. chatkeep's SQLite store hops the same way.
* ``raw async + guarantees`` (PostgreSQL and MariaDB): chatkeep's own async driver (``asyncpg``, ``asyncmy``) on one
  connection of its own, running chatkeep's statements exactly as ``raw sync + guarantees`` does, and ``json``
  decode of the 20. chatkeep over this path is what the library adds to its driver (pool lease, deadlines,
  retries, error translation, pydantic messages); this path over ``raw sync + guarantees`` is what running the
  same round trips on an event loop, through that driver, costs.
* ``SQLAlchemy Core sync`` and ``SQLAlchemy async``: the two plain statements through SQLAlchemy's engines.
* ``chatkeep``: ``SQLHistoryStore.load(key, last=20)`` then ``append`` (pydantic messages in and out).

Every path runs once per round, in a rotating order (the machine is shared: load spikes hit all paths
alike); the tables report each path's median and 99th percentile. Also the load of a whole 10,000-message
history: chatkeep's ``load(key)`` beside the raw fetch plus ``json`` decode. A last table splits the raw paths'
turns and chatkeep's into their parts (read and decode the last 20, make the two new messages, append them),
timed inside the same turns.
SQLite runs twice, at ``synchronous=normal`` (chatkeep's default) and ``synchronous=full``: every path of a run
uses the same setting (chatkeep's ``?synchronous=``, the raw and SQLAlchemy connections' ``PRAGMA``), and a last
table puts both settings side by side. PostgreSQL and MariaDB run with the server's own settings.
Run with ``python -m benchmarks sql [--iterations N] [--only sqlite,postgresql,mysql] [--synchronous normal,full]``.
"""

# Each closure below is timed inside the loop iteration that defines it, so late binding cannot bite.
# ruff: noqa: B023

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from benchmarks._common import Result, format_table
from chatkeep.core import Message, SessionKey
from chatkeep.sql import SQLHistoryStore
from chatkeep.sql._ops import append_params
from chatkeep.sql._schema import key_hash, message_hash, tenant_hash
from chatkeep.sql._sql import Statements

__all__ = ["main"]

SIZES = (10, 1_000, 100_000)
WHOLE = 10_000
PG_URL = os.environ.get("CHATKEEP_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("CHATKEEP_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
OFF_LOOP = "raw + guarantees, off the loop"
RAW_ASYNC = "raw async + guarantees"
SHORT, LONG = "x" * 130, "y" * 530  # with the record's other fields: ~200 and ~600 bytes


def _turn_messages() -> list[Message]:
    return [Message(role="user", text=SHORT), Message(role="assistant", text=LONG)]


def _raw_records() -> list[tuple[bytes, str]]:
    """What a raw client stores per turn: its own JSON (same sizes), keyed by a fresh id."""
    out = []
    for role, text in (("user", SHORT), ("assistant", LONG)):
        message_id = str(uuid.uuid4())
        record = json.dumps(
            {"v": 1, "message_id": message_id, "role": role, "contents": [{"type": "text", "text": text}]}
        )
        out.append((message_hash(message_id), record))
    return out


class _Database:
    """One database under test: where chatkeep's tables live, and the raw statements on them."""

    def __init__(self, family: str, synchronous: str = "normal") -> None:
        self.family = family
        self.synchronous = synchronous  # SQLite only: every path's connections use it
        self.name = f"ck_bench_{uuid.uuid4().hex[:10]}"
        self.tmp = tempfile.mkdtemp(prefix="chatkeep-bench-")

    # -- set-up ------------------------------------------------------------------------------------

    def store_url(self) -> str:
        if self.family == "sqlite":
            return f"sqlite:///{self.tmp}/bench.db?synchronous={self.synchronous}"
        if self.family == "postgresql":
            return f"{PG_URL}?schema={self.name}"
        return f"{MYSQL_URL.rsplit('/', 1)[0]}/{self.name}"

    def sync_connect(self) -> Any:
        if self.family == "sqlite":
            conn = sqlite3.connect(f"{self.tmp}/bench.db", isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous.upper()}")
            return conn
        if self.family == "postgresql":
            import psycopg

            conn = psycopg.connect(PG_URL.replace("postgresql://", "postgresql://", 1), autocommit=True)
            conn.execute(f'SET search_path TO "{self.name}"')
            return conn
        import pymysql

        host = MYSQL_URL.split("@", 1)[1].split("/", 1)[0]
        return pymysql.connect(
            host=host.split(":")[0],
            port=int(host.split(":")[1]),
            user="root",
            database=self.name,
            autocommit=True,
            charset="utf8mb4",
        )

    def create(self) -> None:
        if self.family == "postgresql":
            import psycopg

            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(f'CREATE SCHEMA "{self.name}"')
        elif self.family == "mysql":
            self._mysql_admin(f"CREATE DATABASE `{self.name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")

    def drop(self) -> None:
        if self.family == "postgresql":
            import psycopg

            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{self.name}" CASCADE')
        elif self.family == "mysql":
            self._mysql_admin(f"DROP DATABASE IF EXISTS `{self.name}`")

    def _mysql_admin(self, statement: str) -> None:
        import pymysql

        host = MYSQL_URL.split("@", 1)[1].split("/", 1)[0]
        conn = pymysql.connect(host=host.split(":")[0], port=int(host.split(":")[1]), user="root", autocommit=True)
        with conn.cursor() as cur:
            cur.execute(statement)
        conn.close()

    def sqlalchemy_urls(self) -> tuple[str, str]:
        """(sync URL, async URL) for SQLAlchemy's engines."""
        if self.family == "sqlite":
            return f"sqlite:///{self.tmp}/bench.db", f"sqlite+aiosqlite:///{self.tmp}/bench.db"
        if self.family == "postgresql":
            base = PG_URL.split("://", 1)[1]
            return f"postgresql+psycopg://{base}", f"postgresql+asyncpg://{base}"
        base = f"{MYSQL_URL.split('://', 1)[1].rsplit('/', 1)[0]}/{self.name}?charset=utf8mb4"
        return f"mysql+pymysql://{base}", f"mysql+asyncmy://{base}"

    # -- statements (qmark style; converted per driver) ------------------------------------------

    def q(self, sql: str) -> str:
        return sql if self.family == "sqlite" else sql.replace("?", "%s")

    def insert(self) -> str:
        """The raw path's plain two-row INSERT (no idempotency)."""
        return self.q(
            "INSERT INTO chatkeep_messages (session_ref, seq, message_hash, record) VALUES (?, ?, ?, ?), (?, ?, ?, ?)"
        )

    def select_last(self) -> str:
        return self.q("SELECT record FROM chatkeep_messages WHERE session_ref = ? ORDER BY seq DESC LIMIT 20")

    def select_all(self) -> str:
        return self.q("SELECT record FROM chatkeep_messages WHERE session_ref = ? ORDER BY seq")


def _session_ref(conn: Any, db: _Database, key: SessionKey) -> tuple[int, int]:
    cur = conn.cursor()
    cur.execute(
        db.q("SELECT id, next_seq FROM chatkeep_sessions WHERE key_hash = ?"), (key_hash(key.tenant, key.session_id),)
    )
    row = cur.fetchall()[0]
    return int(row[0]), int(row[1])


#: Where the turns spend their time: (session size, path, part) -> the part's duration in each turn.
_PARTS: dict[tuple[int, str, str], list[float]] = defaultdict(list)
_PART_NAMES = ("read the last 20 and decode them", "make the 2 new messages", "append them")


def _laps(size: int, path: str) -> Callable[[str], None]:
    """A stopwatch for one turn: each call records the time since the previous call under a part's name."""
    last = [time.perf_counter()]

    def lap(part: str) -> None:
        now = time.perf_counter()
        _PARTS[(size, path, part)].append(now - last[0])
        last[0] = now

    return lap


def _raw_turn(conn: Any, db: _Database, ref: int, seq: list[int], lap: Callable[[str], None]) -> None:
    cur = conn.cursor()
    cur.execute(db.select_last(), (ref,))
    [json.loads(row[0]) for row in cur.fetchall()]
    lap(_PART_NAMES[0])
    (h1, r1), (h2, r2) = _raw_records()
    lap(_PART_NAMES[1])
    cur.execute(db.insert(), (ref, seq[0], h1, r1, ref, seq[0] + 1, h2, r2))
    seq[0] += 2
    lap(_PART_NAMES[2])


def _guarded_turn(conn: Any, db: _Database, key: SessionKey, lap: Callable[[str], None]) -> None:
    cur = conn.cursor()
    # chatkeep's own read: by the key's hash (a cached row id would go stale when a session is re-created).
    cur.execute(_STATEMENTS[db.family].load_last, (key_hash(key.tenant, key.session_id), 20))
    [json.loads(row[0]) for row in cur.fetchall()]
    lap(_PART_NAMES[0])
    (h1, r1), (h2, r2) = _raw_records()
    lap(_PART_NAMES[1])
    _guarded_append(cur, db, key, (h1, r1), (h2, r2))
    lap(_PART_NAMES[2])


async def _guarded_turn_off_loop(conn: Any, db: _Database, key: SessionKey, lap: Callable[[str], None]) -> None:
    """``_guarded_turn`` as an async program runs a blocking driver: each call in a worker thread."""

    def read() -> list[Any]:
        cur = conn.cursor()
        cur.execute(_STATEMENTS[db.family].load_last, (key_hash(key.tenant, key.session_id), 20))
        return cur.fetchall()

    [json.loads(row[0]) for row in await asyncio.to_thread(read)]
    lap(_PART_NAMES[0])
    records = _raw_records()
    lap(_PART_NAMES[1])
    await asyncio.to_thread(lambda: _guarded_append(conn.cursor(), db, key, *records))
    lap(_PART_NAMES[2])


def _guarded_append(cur: Any, db: _Database, key: SessionKey, *records: tuple[bytes, str]) -> None:
    (h1, r1), (h2, r2) = records
    head = (key_hash(key.tenant, key.session_id), tenant_hash(key.tenant), key.tenant.encode(), key.session_id.encode())
    now = int(uuid.uuid1().time)  # any increasing number will do here
    if db.family == "postgresql":
        # One statement: reserve the range under the session row's lock and insert only new ids (autocommit).
        cur.execute(_PG_APPEND, append_params(head, now, [(h1, r1, None), (h2, r2, None)]))
        cur.fetchall()
        return
    sql = _STATEMENTS[db.family]
    cur.execute(sql.begin)
    cur.execute(sql.upsert, (*head, now, now, 2, 2))
    ref, next_seq = cur.fetchall()[0][:2]  # (and the session's fork base)
    cur.execute(sql.insert_messages(2), (ref, next_seq - 2, h1, r1, None, ref, next_seq - 1, h2, r2, None))
    cur.execute("COMMIT")


class _RawAsync:
    """chatkeep's own async driver on one connection, running chatkeep's own statements (``RAW_ASYNC``)."""

    def __init__(self, family: str, conn: Any) -> None:
        self.family = family
        self.conn = conn
        # The statements as chatkeep's transports send them: asyncpg's $1 placeholders, asyncmy's %s.
        self.sql = (
            Statements("postgresql", "numeric_dollar")
            if family == "postgresql"
            else Statements("mysql", "format", is_mariadb=True, found_rows=False)
        )

    @classmethod
    async def connect(cls, db: _Database) -> _RawAsync:
        if db.family == "postgresql":
            import asyncpg  # type: ignore[import-untyped]

            return cls(db.family, await asyncpg.connect(PG_URL, server_settings={"search_path": db.name}))
        import asyncmy  # type: ignore[import-untyped]

        host, port = MYSQL_URL.split("@", 1)[1].split("/", 1)[0].split(":")
        conn = await asyncmy.connect(
            host=host, port=int(port), user="root", database=db.name, autocommit=True, charset="utf8mb4"
        )
        return cls(db.family, conn)

    async def close(self) -> None:
        if self.family == "postgresql":
            await self.conn.close()
        else:
            self.conn.close()

    async def turn(self, key: SessionKey, lap: Callable[[str], None]) -> None:
        key_bytes = key_hash(key.tenant, key.session_id)
        sql = self.sql
        if self.family == "postgresql":
            rows = await self.conn.fetch(sql.load_last, key_bytes, 20)
        else:
            async with self.conn.cursor() as cur:
                await cur.execute(sql.load_last, (key_bytes, 20))
                rows = await cur.fetchall()
        [json.loads(row[0]) for row in rows]
        lap(_PART_NAMES[0])
        (h1, r1), (h2, r2) = _raw_records()
        lap(_PART_NAMES[1])
        head = (key_bytes, tenant_hash(key.tenant), key.tenant.encode(), key.session_id.encode())
        now = int(uuid.uuid1().time)
        if self.family == "postgresql":
            await self.conn.fetch(
                sql.pg_append(2, usage=False), *append_params(head, now, [(h1, r1, None), (h2, r2, None)])
            )
        else:
            async with self.conn.cursor() as cur:
                await cur.execute(sql.begin)
                await cur.execute(sql.upsert, (*head, now, now, 2, 2))
                ref, next_seq = (await cur.fetchall())[0][:2]  # (and the session's fork base)
                await cur.execute(
                    sql.insert_messages(2), (ref, next_seq - 2, h1, r1, None, ref, next_seq - 1, h2, r2, None)
                )
                await cur.execute("COMMIT")
        lap(_PART_NAMES[2])


_ref_cache: dict[SessionKey, int] = {}
_STATEMENTS = {
    "sqlite": Statements("sqlite", "qmark"),
    "postgresql": Statements("postgresql", "format"),
    # The bench's MySQL server is MariaDB (the upsert returns the range); pymysql connects without FOUND_ROWS.
    "mysql": Statements("mysql", "format", is_mariadb=True, found_rows=False),
}
_PG_APPEND = _STATEMENTS["postgresql"].pg_append(2, usage=False)


async def _interleaved(
    size: int, paths: dict[str, Callable[[], Any]], *, iterations: int, warmup: int = 20
) -> list[Result]:
    """Time every path once per round, in a rotating order, so a noisy (shared) machine slows them alike."""
    import gc
    import inspect

    names = list(paths)

    async def once(name: str) -> float:
        start = time.perf_counter()
        outcome = paths[name]()
        if inspect.isawaitable(outcome):
            await outcome
        return time.perf_counter() - start

    for _ in range(warmup):
        for name in names:
            await once(name)
    gc.collect()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(iterations):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(await once(name))
    return [Result(name, size, samples[name]) for name in names]


async def _seed(store: SQLHistoryStore, key: SessionKey, n: int) -> None:
    for start in range(0, n, 1000):
        await store.append(
            key,
            [
                Message(role="user" if i % 2 == 0 else "assistant", text=SHORT if i % 2 == 0 else LONG)
                for i in range(start, min(n, start + 1000))
            ],
        )


async def _bench_database(family: str, iterations: int, synchronous: str) -> tuple[list[Result], list[Result]]:
    db = _Database(family, synchronous)
    db.create()
    results: list[Result] = []
    whole: list[Result] = []
    store = SQLHistoryStore(db.store_url())
    try:
        keys = {size: SessionKey("bench", f"s{size}-{uuid.uuid4().hex[:6]}") for size in SIZES}
        for size, key in keys.items():
            await _seed(store, key, size)
        whole_key = SessionKey("bench", f"whole-{uuid.uuid4().hex[:6]}")
        await _seed(store, whole_key, WHOLE)

        # Each path has a connection of its own: on SQLite a connection keeps its page cache only while no other
        # connection wrote, so two paths sharing one would run warm where every other path runs cold.
        conn, guarded_conn, offloop_conn = db.sync_connect(), db.sync_connect(), db.sync_connect()
        raw_async = await _RawAsync.connect(db) if family != "sqlite" else None
        from sqlalchemy import create_engine, text
        from sqlalchemy.ext.asyncio import create_async_engine

        sync_url, async_url = db.sqlalchemy_urls()
        sync_engine = create_engine(sync_url)
        async_engine = create_async_engine(async_url)
        # What each SQLAlchemy connection runs first: the schema (PostgreSQL), the run's synchronous (SQLite).
        setup = {"postgresql": f'SET search_path TO "{db.name}"', "sqlite": f"PRAGMA synchronous={synchronous}"}
        if family in setup:
            from sqlalchemy import event

            for target in (sync_engine, async_engine.sync_engine):

                @event.listens_for(target, "connect")
                def _setup(dbapi_connection: Any, _record: Any) -> None:
                    cursor = dbapi_connection.cursor()
                    cursor.execute(setup[family])
                    cursor.close()

        sel = text("SELECT record FROM chatkeep_messages WHERE session_ref = :ref ORDER BY seq DESC LIMIT 20")
        ins = text(
            "INSERT INTO chatkeep_messages (session_ref, seq, message_hash, record) "
            "VALUES (:ref, :s1, :h1, :r1), (:ref, :s2, :h2, :r2)"
        )
        # Raw paths write to sessions of their own (same sizes), so every path appends to a session it owns.
        raw_keys = {}
        for size in SIZES:
            for label in ("raw", "guarded", "offloop", "rawasync", "core", "async"):
                raw_key = SessionKey("bench", f"{label}{size}-{uuid.uuid4().hex[:6]}")
                raw_keys[(label, size)] = raw_key
                await _seed(store, raw_key, size)
        counters: dict[tuple[str, int], list[int]] = {}
        for (label, size), raw_key in raw_keys.items():
            ref, next_seq = _session_ref(conn, db, raw_key)
            _ref_cache[raw_key] = ref
            counters[(label, size)] = [next_seq + 1_000_000]  # raw writers skip the counter: keep clear of it

        for size in SIZES:
            ref = _ref_cache[raw_keys[("raw", size)]]
            guarded_key = raw_keys[("guarded", size)]
            core_ref, core_seq = _ref_cache[raw_keys[("core", size)]], counters[("core", size)]

            def core_turn() -> None:
                with sync_engine.begin() as c:
                    [json.loads(r[0]) for r in c.execute(sel, {"ref": core_ref}).all()]
                    (h1, r1), (h2, r2) = _raw_records()
                    c.execute(
                        ins,
                        {
                            "ref": core_ref,
                            "s1": core_seq[0],
                            "h1": h1,
                            "r1": r1,
                            "s2": core_seq[0] + 1,
                            "h2": h2,
                            "r2": r2,
                        },
                    )
                    core_seq[0] += 2

            async_ref, async_seq = _ref_cache[raw_keys[("async", size)]], counters[("async", size)]

            async def async_turn() -> None:
                async with async_engine.begin() as c:
                    [json.loads(r[0]) for r in (await c.execute(sel, {"ref": async_ref})).all()]
                    (h1, r1), (h2, r2) = _raw_records()
                    await c.execute(
                        ins,
                        {
                            "ref": async_ref,
                            "s1": async_seq[0],
                            "h1": h1,
                            "r1": r1,
                            "s2": async_seq[0] + 1,
                            "h2": h2,
                            "r2": r2,
                        },
                    )
                    async_seq[0] += 2

            key = keys[size]

            async def chatkeep_turn() -> None:
                lap = _laps(size, "chatkeep")
                await store.load(key, last=20)
                lap(_PART_NAMES[0])
                messages = _turn_messages()
                lap(_PART_NAMES[1])
                await store.append(key, messages)  # encoding them is part of the append here
                lap(_PART_NAMES[2])

            paths: dict[str, Callable[[], Any]] = {
                "raw sync": lambda: _raw_turn(conn, db, ref, counters[("raw", size)], _laps(size, "raw sync")),
                "raw sync + guarantees": lambda: _guarded_turn(
                    guarded_conn, db, guarded_key, _laps(size, "raw sync + guarantees")
                ),
            }
            if family == "sqlite":
                offloop_key = raw_keys[("offloop", size)]
                paths[OFF_LOOP] = lambda: _guarded_turn_off_loop(offloop_conn, db, offloop_key, _laps(size, OFF_LOOP))
            if raw_async is not None:
                raw_async_key = raw_keys[("rawasync", size)]
                paths[RAW_ASYNC] = lambda: raw_async.turn(raw_async_key, _laps(size, RAW_ASYNC))
            paths |= {"SQLAlchemy Core sync": core_turn, "SQLAlchemy async": async_turn, "chatkeep": chatkeep_turn}
            results += await _interleaved(size, paths, iterations=iterations)

        whole_ref, _ = _session_ref(conn, db, whole_key)

        def raw_whole() -> None:
            cur = conn.cursor()
            cur.execute(db.select_all(), (whole_ref,))
            [json.loads(row[0]) for row in cur.fetchall()]

        whole += await _interleaved(
            WHOLE,
            {"raw fetch + json decode": raw_whole, "chatkeep load()": lambda: store.load(whole_key)},
            iterations=max(10, iterations // 20),
            warmup=3,
        )
        conn.close()
        guarded_conn.close()
        offloop_conn.close()
        if raw_async is not None:
            await raw_async.close()
        sync_engine.dispose()
        await async_engine.dispose()
    finally:
        await store.close()
        db.drop()
    return results, whole


def _fastest_raw(results: list[Result]) -> Callable[[Result], Result]:
    def baseline(result: Result) -> Result:
        raws = [r for r in results if r.size == result.size and r.name != "chatkeep"]
        return min(raws, key=lambda r: r.p50)

    return baseline


def _parts_table(family: str, size: int) -> str:
    """The p50 of each part of a turn, per path, at one session size (the parts' p50s need not add up)."""
    every = ("raw sync", "raw sync + guarantees", OFF_LOOP, RAW_ASYNC, "chatkeep")
    paths = tuple(path for path in every if (size, path, _PART_NAMES[0]) in _PARTS)
    lines = [
        f"### {family}: where a turn's time goes, sessions of {size:,} messages (p50 of each part, µs)",
        "",
        "| part | " + " | ".join(paths) + " |",
        "|---|" + "---:|" * len(paths),
    ]
    for part in _PART_NAMES:
        cells = [f"{statistics.median(_PARTS[(size, path, part)]) * 1e6:.0f}" for path in paths]
        lines.append(f"| {part} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _guarded(results: list[Result]) -> Callable[[Result], Result | None]:
    """The raw driver doing what chatkeep's guarantees need, at the row's size: what the library adds on top."""

    def baseline(result: Result) -> Result | None:
        return next((r for r in results if r.size == result.size and r.name == "raw sync + guarantees"), None)

    return baseline


def _reachable(family: str) -> str | None:
    try:
        db = _Database(family)
        if family == "postgresql":
            import psycopg

            psycopg.connect(PG_URL, connect_timeout=3).close()
        elif family == "mysql":
            db._mysql_admin("SELECT 1")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _settings_table(by_setting: dict[str, list[Result]]) -> str:
    """SQLite at each ``synchronous`` setting: chatkeep's p50 beside the raw paths' at the same setting."""
    lines = [
        "### sqlite: one turn at each synchronous setting (p50 ms; every path at the row's setting)",
        "",
        "| synchronous | messages in session | raw sync | raw sync + guarantees | raw + guarantees, off the loop | "
        "chatkeep | chatkeep vs raw | chatkeep vs raw + guarantees | chatkeep vs raw + guarantees off the loop | "
        "chatkeep vs chatkeep at normal |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for setting, results in by_setting.items():
        for size in SIZES:
            row = {r.name: r for r in results if r.size == size}
            raw, guarded, off, chatkeep = row["raw sync"], row["raw sync + guarantees"], row[OFF_LOOP], row["chatkeep"]
            normal = next((r for r in by_setting.get("normal", []) if r.size == size and r.name == "chatkeep"), None)
            vs_normal = f"{chatkeep.p50 / normal.p50:.2f}x" if normal is not None else ""
            lines.append(
                f"| {setting} | {size:,} | {raw.p50 * 1e3:.3f} | {guarded.p50 * 1e3:.3f} | {off.p50 * 1e3:.3f} | "
                f"{chatkeep.p50 * 1e3:.3f} | {chatkeep.p50 / raw.p50:.2f}x | {chatkeep.p50 / guarded.p50:.2f}x | "
                f"{chatkeep.p50 / off.p50:.2f}x | {vs_normal} |"
            )
    return "\n".join(lines)


async def _main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks sql")
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--only", default="sqlite,postgresql,mysql")
    parser.add_argument("--synchronous", default="normal,full", help="SQLite's settings to run, in order")
    args = parser.parse_args(argv)
    by_setting: dict[str, list[Result]] = {}
    for family in args.only.split(","):
        problem = _reachable(family)
        if problem:
            print(f"### {family}: skipped ({problem})\n")
            continue
        for synchronous in args.synchronous.split(",") if family == "sqlite" else ["normal"]:
            label = f"sqlite synchronous={synchronous}" if family == "sqlite" else family
            _PARTS.clear()
            results, whole = await _bench_database(family, args.iterations, synchronous)
            if family == "sqlite":
                by_setting[synchronous] = results
            print(
                format_table(
                    f"{label}: one turn (load last 20 + append 2)",
                    results,
                    _fastest_raw(results),
                    also=("raw + guarantees", _guarded(results)),
                )
            )
            print()
            chatkeep = {r.size: r for r in results if r.name == "chatkeep"}
            print(f"chatkeep p50 at 100,000 vs 10 messages: {chatkeep[100_000].p50 / chatkeep[10].p50:.2f}x")
            raw_async = {r.size: r for r in results if r.name == RAW_ASYNC}
            if raw_async:
                ratios = ", ".join(f"{size:,}: {chatkeep[size].p50 / raw_async[size].p50:.2f}x" for size in SIZES)
                print(f"chatkeep p50 vs its own driver running its statements ({RAW_ASYNC}): {ratios}")
            print()
            print(_parts_table(label, 1_000))
            print()
            print(format_table(f"{label}: load a whole {WHOLE:,}-message history", whole, lambda r: whole[0]))
            print()
    if by_setting:
        print(_settings_table(by_setting))
        print()


def main(argv: list[str]) -> None:
    """Run the SQL benchmark (synchronous entry point: it runs its own event loop)."""
    asyncio.run(_main(argv))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
