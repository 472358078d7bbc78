"""Where a SQL turn's time goes above the driver: each layer of chatkeep timed on top of the one below it.

Run with ``python -m benchmarks layers [--iterations N] [--only postgresql,mysql]``.

The turn of ``benchmarks sql`` (load the newest 20, append 2) is rebuilt one layer at a time, on the same
server, in the same run, every layer once per round in a rotating order (a load spike hits them alike):

* ``driver``: chatkeep's own async driver (asyncpg, asyncmy) on one connection of its own, chatkeep's statements,
  ``json.loads`` of the 20 (the same as ``benchmarks sql``'s ``raw async + guarantees``);
* ``+ operations``: the same statements as the store's operations (``_ops``) send them, on a connection of the
  store's pool held for the whole run (chatkeep's connection wrapper, a cursor per statement, the retry loop);
* ``+ statement deadline``: each statement bounded by ``statement_timeout`` (one timer per call);
* ``+ lease``: the connection lent for each call and given back, the driver's errors translated;
* ``+ write shield``: the append run in a task of its own, so that a cancelled caller never leaves a write half
  done (loads have none: the row repeats the one above);
* ``+ records``: the transport, with chatkeep's messages: the 20 decoded into ``Message`` objects, the 2 encoded
  from them (``decode_records``, ``encode_records``);
* ``store hooks``: the store's own ``_load`` and ``_append`` (the key's hashes, the append's write stamp, a
  write's shield against cancellation);
* ``public API``: ``store.load(key, last=20)`` and ``store.append(key, messages)``, what an application calls
  (argument checks, telemetry, the sealed-session check).

The difference between two neighbouring rows is what that layer costs (medians of a noisy machine: re-run, and
read the differences, not the absolute times, as the answer). Every path writes to a session of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks.sql_bench import LONG, SHORT, _Database, _raw_records, _reachable, _seed
from chatkeep.core import Message, SessionKey
from chatkeep.core._messages import decode_records, encode_records
from chatkeep.core.backend import write_stamp
from chatkeep.sql import SQLHistoryStore, _ops
from chatkeep.sql._schema import key_hash, tenant_hash

__all__ = ["main"]

SIZE = 1_000
LAYERS = (
    "driver",
    "+ operations",
    "+ statement deadline",
    "+ lease",
    "+ write shield",
    "+ records",
    "store hooks",
    "public API",
)
PARTS = ("load the newest 20", "append 2")


def _messages() -> list[Message]:
    return [Message(role="user", text=SHORT), Message(role="assistant", text=LONG)]


def _head(key: SessionKey) -> _ops.Head:
    return (key_hash(key.tenant, key.session_id), tenant_hash(key.tenant), key.tenant.encode(), key.session_id.encode())


Turn = Callable[[], Awaitable[tuple[float, float]]]


def _turns(store: SQLHistoryStore, keys: dict[str, SessionKey]) -> dict[str, Turn]:
    """Each layer's turn, returning (load seconds, append seconds).

    Every layer runs on the same server connection (the one the store's pool lends each call, its most recently
    used): a turn on another connection than the one before it pays tens of microseconds for it (the server's
    thread and both sides' caches are cold), which would land on whichever layers change connections. The
    layers below the lease take that connection out of the pool untimed.
    """
    transport: Any = store._transport
    sql = store._sql

    driver_key = keys["driver"]
    driver_digest, driver_head = key_hash(driver_key.tenant, driver_key.session_id), _head(driver_key)
    postgres = store.dialect == "postgresql"

    async def driver() -> tuple[float, float]:
        """The statements of ``+ operations`` on the driver's own API, on the connection the others use."""
        held = await transport._checkout()
        raw = held.lease.driver_connection
        start = time.perf_counter()
        if postgres:
            rows = await raw.fetch(sql.load_last, driver_digest, 20)
        else:
            async with raw.cursor() as cur:
                await cur.execute(sql.load_last, (driver_digest, 20))
                rows = await cur.fetchall()
        [json.loads(row[0]) for row in reversed(rows)]
        loaded = time.perf_counter()
        (h1, r1), (h2, r2) = _raw_records()
        made, now = time.perf_counter(), write_stamp()
        if postgres:
            await raw.fetch(
                sql.pg_append(2, usage=False), *_ops.append_params(driver_head, now, [(h1, r1, None), (h2, r2, None)])
            )
        else:
            async with raw.cursor() as cur:
                await cur.execute(sql.begin)
                await cur.execute(sql.upsert, (*driver_head, now, now, 2, 2))
                ref, next_seq = (await cur.fetchall())[0][:2]
                await cur.execute(
                    sql.insert_messages(2), (ref, next_seq - 2, h1, r1, None, ref, next_seq - 1, h2, r2, None)
                )
                await cur.execute("COMMIT")
        appended = time.perf_counter()
        await transport._checkin(held)
        return loaded - start, appended - made

    def on_held(layer: str, *, deadline: bool) -> Turn:
        key = keys[layer]
        digest, head = key_hash(key.tenant, key.session_id), _head(key)

        async def turn() -> tuple[float, float]:
            held = await transport._checkout()
            held.statement_timeout = transport.statement_timeout if deadline else None
            start = time.perf_counter()
            rows = await held.fetch(sql.load_last, (digest, 20))
            held.end()
            [json.loads(row[0]) for row in reversed(rows)]
            loaded = time.perf_counter()
            pairs = [(h, record, None) for h, record in _raw_records()]
            made, now = time.perf_counter(), write_stamp()
            await _ops.append(held, sql, head, now, pairs)
            held.end()
            appended = time.perf_counter()
            await transport._checkin(held)
            return loaded - start, appended - made

        return turn

    def through_transport(layer: str, *, shield: bool, decode: bool) -> Turn:
        key = keys[layer]
        digest, head = key_hash(key.tenant, key.session_id), _head(key)

        async def turn() -> tuple[float, float]:
            start = time.perf_counter()
            rows = await transport.run(lambda conn: conn.fetch(sql.load_last, (digest, 20)))
            if decode:
                decode_records([row[0] for row in reversed(rows)])
            else:
                [json.loads(row[0]) for row in reversed(rows)]
            loaded = time.perf_counter()
            if decode:  # encoding the new messages is this layer's work (making them is the application's)
                messages = _messages()
                made = time.perf_counter()
                pairs = store._rows(messages, encode_records(messages))  # (hash, record, usage) as the store's
            else:
                pairs = [(h, record, None) for h, record in _raw_records()]
                made = time.perf_counter()
            now = write_stamp()
            await transport.run(lambda conn: _ops.append(conn, sql, head, now, pairs), write=shield)
            return loaded - start, time.perf_counter() - made

        return turn

    async def hooks() -> tuple[float, float]:
        key = keys["store hooks"]
        start = time.perf_counter()
        await store._load(key, 20)
        loaded = time.perf_counter()
        messages = _messages()
        made = time.perf_counter()
        await store._append(key, messages, encode_records(messages))
        return loaded - start, time.perf_counter() - made

    async def public() -> tuple[float, float]:
        key = keys["public API"]
        start = time.perf_counter()
        await store.load(key, last=20)
        loaded = time.perf_counter()
        messages = _messages()
        made = time.perf_counter()
        await store.append(key, messages)
        return loaded - start, time.perf_counter() - made

    return {
        "driver": driver,
        "+ operations": on_held("+ operations", deadline=False),
        "+ statement deadline": on_held("+ statement deadline", deadline=True),
        "+ lease": through_transport("+ lease", shield=False, decode=False),
        "+ write shield": through_transport("+ write shield", shield=True, decode=False),
        "+ records": through_transport("+ records", shield=True, decode=True),
        "store hooks": hooks,
        "public API": public,
    }


async def _bench(family: str, iterations: int) -> dict[str, list[tuple[float, float]]]:
    db = _Database(family)
    db.create()
    store = SQLHistoryStore(db.store_url())
    try:
        keys = {layer: SessionKey("layers", f"{n}-{uuid.uuid4().hex[:6]}") for n, layer in enumerate(LAYERS)}
        for key in keys.values():
            await _seed(store, key, SIZE)
        turns = _turns(store, keys)
        for _ in range(30):
            for turn in turns.values():
                await turn()
        samples: dict[str, list[tuple[float, float]]] = {layer: [] for layer in LAYERS}
        for round_ in range(iterations):
            shift = round_ % len(LAYERS)
            for layer in LAYERS[shift:] + LAYERS[:shift]:
                samples[layer].append(await turns[layer]())
        return samples
    finally:
        await store.close()
        db.drop()


def _table(family: str, samples: dict[str, list[tuple[float, float]]]) -> str:
    lines = [
        f"### {family}: a turn's layers above the driver, sessions of {SIZE:,} messages (p50 µs)",
        "",
        "| layer | load the newest 20 | its cost | append 2 | its cost | turn | its cost |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    previous: tuple[float, float, float] | None = None
    for layer in LAYERS:
        load = statistics.median(s[0] for s in samples[layer]) * 1e6
        append = statistics.median(s[1] for s in samples[layer]) * 1e6
        turn = statistics.median(s[0] + s[1] for s in samples[layer]) * 1e6
        now = (load, append, turn)
        costs = ["" if previous is None else f"{a - b:+.0f}" for a, b in zip(now, previous or now, strict=True)]
        lines.append(f"| {layer} | {load:.0f} | {costs[0]} | {append:.0f} | {costs[1]} | {turn:.0f} | {costs[2]} |")
        previous = now
    first = statistics.median(s[0] + s[1] for s in samples[LAYERS[0]])
    last = statistics.median(s[0] + s[1] for s in samples[LAYERS[-1]])
    lines += ["", f"public API over driver: {last / first:.2f}x"]
    return "\n".join(lines)


async def _main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks layers")
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--only", default="postgresql,mysql")
    args = parser.parse_args(argv)
    for family in args.only.split(","):
        problem = _reachable(family)
        if problem:
            print(f"### {family}: skipped ({problem})\n")
            continue
        print(_table(family, await _bench(family, args.iterations)))
        print()


def main(argv: list[str]) -> None:
    """Run the layers benchmark (synchronous entry point: it runs its own event loop)."""
    asyncio.run(_main(argv))
