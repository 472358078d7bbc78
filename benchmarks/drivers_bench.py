"""The SQL driver candidates, each running chatkeep's own statements for one turn, measured in the same run.

Issue 19 asked to measure the drivers a transport could use before choosing: ``sqlite3`` (the standard library's,
what the ``sqlite3`` transport uses), ``pysqlite3`` (``pysqlite3-binary``: the same DB-API module built with a
newer SQLite that loads extensions) and ``apsw`` for SQLite; ``asyncpg`` (what chatkeep uses) and ``psqlpy`` for
PostgreSQL. A turn is chatkeep's: the newest 20 records read by the session's key hash and decoded with ``json``,
then an idempotent append of two (SQLite: ``BEGIN IMMEDIATE``, the session upsert returning the range, the
insert, ``COMMIT``; on PostgreSQL only the read, see ``_bench_postgresql``). The SQLite drivers run synchronously (the
statements' cost, without the thread hop every async SQLite path pays alike); the PostgreSQL drivers on asyncio.
Sessions of 1,000 messages; every path once per round, in a rotating order.
Run with ``python -m benchmarks drivers [--iterations N] [--only sqlite,postgresql]``.
"""

# Each closure below is timed inside the loop iteration that defines it, so late binding cannot bite.
# ruff: noqa: B023

from __future__ import annotations

import argparse
import json
import sqlite3
import uuid
from collections.abc import Callable
from typing import Any

from benchmarks._common import Result, format_table
from benchmarks.sql_bench import PG_URL, _Database, _guarded_turn, _interleaved, _reachable, _seed
from chatkeep.core import SessionKey
from chatkeep.sql import SQLHistoryStore
from chatkeep.sql._schema import key_hash, tenant_hash
from chatkeep.sql._sql import Statements

__all__ = ["main"]

SIZE = 1_000
_PG = Statements("postgresql", "numeric_dollar")


def _no_lap(_part: str) -> None:
    """The SQL benchmark's turns time their parts; here only the whole turn counts."""


def _sqlite_connect(driver: str, path: str, synchronous: str) -> tuple[str, Any]:
    """A driver's connection, set up as chatkeep sets up its own (WAL, ``synchronous``, autocommit), and its label."""
    if driver == "apsw":
        import apsw

        conn: Any = apsw.Connection(path)
        label = f"apsw (SQLite {apsw.sqlite_lib_version()})"
    else:
        module: Any = sqlite3
        if driver == "pysqlite3":
            import pysqlite3.dbapi2 as module
        conn = module.connect(path, isolation_level=None, check_same_thread=False)
        label = f"{driver} (SQLite {module.sqlite_version})"
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
    conn.execute("PRAGMA busy_timeout=5000")
    return label, conn


async def _bench_sqlite(iterations: int) -> list[Result]:
    # A file per driver, closed by chatkeep's store before the driver opens it: two copies of the SQLite library
    # in one process must never open the same file (each drops the other's POSIX locks when it closes a file
    # descriptor; pysqlite3 on a file the standard module has open reported "database disk image is malformed").
    paths: dict[str, Callable[[], Any]] = {}
    opened: list[tuple[_Database, Any]] = []
    try:
        for driver in ("sqlite3", "pysqlite3", "apsw"):
            db = _Database("sqlite")
            key = SessionKey("bench", f"{driver}-{uuid.uuid4().hex[:6]}")
            store = SQLHistoryStore(db.store_url())
            try:
                await _seed(store, key, SIZE)
            finally:
                await store.close()
            label, conn = _sqlite_connect(driver, f"{db.tmp}/bench.db", db.synchronous)
            opened.append((db, conn))
            # Every driver's cursor takes the DB-API's execute(sql, params) and fetchall().
            paths[label] = lambda conn=conn, db=db, key=key: _guarded_turn(conn, db, key, _no_lap)
        return await _interleaved(SIZE, paths, iterations=iterations)
    finally:
        for db, conn in opened:
            conn.close()
            db.drop()


def _pg_head(key: SessionKey) -> tuple[bytes, bytes, bytes, bytes]:
    return key_hash(key.tenant, key.session_id), tenant_hash(key.tenant), key.tenant.encode(), key.session_id.encode()


async def _bench_postgresql(iterations: int) -> list[Result]:
    import asyncpg
    import psqlpy

    db = _Database("postgresql")
    db.create()
    store = SQLHistoryStore(db.store_url())
    try:
        settings = {"search_path": f'"{db.name}"'}
        apg = await asyncpg.connect(PG_URL, server_settings=settings)
        pool = psqlpy.ConnectionPool(dsn=PG_URL, max_db_pool_size=2)
        ppy = await pool.connection()
        await ppy.execute(f'SET search_path TO "{db.name}"')
        keys = {}
        for name in ("asyncpg", "psqlpy"):
            keys[name] = SessionKey("bench", f"{name}-{uuid.uuid4().hex[:6]}")
            await _seed(store, keys[name], SIZE)

        # psqlpy cannot run chatkeep's append as written: it binds no bytea[] (its extra_types have no bytes array;
        # a list of bytes arrives mangled) and decodes none. So PostgreSQL compares the turn's read: the newest 20
        # by the key's hash, decoded with json.

        async def asyncpg_read() -> None:
            rows = await apg.fetch(_PG.load_last, _pg_head(keys["asyncpg"])[0], 20)
            [json.loads(row[0]) for row in rows]

        async def psqlpy_read() -> None:
            rows = (await ppy.fetch(_PG.load_last, [_pg_head(keys["psqlpy"])[0], 20])).result()
            [json.loads(row["record"]) for row in rows]

        results = await _interleaved(SIZE, {"asyncpg": asyncpg_read, "psqlpy": psqlpy_read}, iterations=iterations)
        await apg.close()
        ppy.close()
        pool.close()
        return results
    finally:
        await store.close()
        db.drop()


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks drivers")
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--only", default="sqlite,postgresql")
    args = parser.parse_args(argv)
    for family in args.only.split(","):
        problem = _reachable(family)
        if problem:
            print(f"### {family}: skipped ({problem})\n")
            continue
        results = await (_bench_sqlite if family == "sqlite" else _bench_postgresql)(args.iterations)
        first = results[0]
        what = "one turn" if family == "sqlite" else "the turn's read (load the newest 20)"
        print(
            format_table(
                f"{family}: {what} of chatkeep's statements per driver, {SIZE:,}-message sessions",
                results,
                lambda result: first,
                versus=first.name.split()[0],
            )
        )
        print()
