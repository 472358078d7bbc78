"""ChatkeepSessionService beside Google ADK's own DatabaseSessionService, on the same backend, in the same run.

The turn is what ADK's runner does per run with its session service: ``get_session`` with the newest 20 events
(``GetSessionConfig(num_recent_events=20)``), then ``append_event`` of the turn's 2 events (the user's message
and the model's answer, each with a session-state delta), the second appended to the session object the first
returned. Pairs, each on the same place: a SQLite file each, in one folder (ADK on ``sqlite+aiosqlite``,
chatkeep on ``sqlite:///``), and one PostgreSQL server, in a schema of this run's own (ADK on
``postgresql+asyncpg``, chatkeep on the same URL), whose tables are analyzed after seeding (as autovacuum soon
would).

Beside them runs the floor: the raw driver doing the least any session store can do for the turn (``sqlite3``
on the loop's thread; asyncpg, one statement per read and per append), with no stale check, no shared state and
no idempotency. ADK's turn over the floor's is the most any store could gain over ADK on that backend.

Sessions of 10, 1,000 and 10,000 prior events, seeded through each path's own appends. The paths of a size take
turns, one turn each, so a busy machine slows them alike. The ratio is ADK's median turn divided by the path's:
above 1, the path is faster.

Run with ``python -m benchmarks interop-adk [--quick] [--only sqlite,postgresql]`` (the nox session
``interop_bench(framework='adk')`` installs ADK and aiosqlite).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import os
import shutil
import sqlite3
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from google.adk.events import Event, EventActions
from google.adk.sessions import DatabaseSessionService
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types

from benchmarks._common import (
    Result,
    analyze_schema,
    measure_pairs,
    own_schema,
    pair_arguments,
    speedup,
    speedup_table,
    target_line,
)
from chatkeep.core import open_store
from chatkeep.interop.adk import ChatkeepSessionService

__all__ = ["main"]

SIZES = (10, 1_000, 10_000)
WINDOW = 20
APP, USER = "bench-app", "bench-user"
PG_URL = os.environ.get("CHATKEEP_BENCH_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
USER_TEXT, ANSWER_TEXT = "x" * 160, "y" * 520
FLOOR = "floor (raw driver: the least a turn can do)"
TITLE = "Google ADK: one turn (get_session with the newest 20 events + 2 append_event)"


def _events(n: int) -> list[Event]:
    """A turn's two events: the user's message and the model's answer, each with a session-state delta."""
    now = time.time()
    return [
        Event(
            invocation_id=f"inv-{n}",
            author="user",
            timestamp=now,
            content=types.Content(role="user", parts=[types.Part(text=USER_TEXT)]),
            actions=EventActions(state_delta={"turns": n}),
        ),
        Event(
            invocation_id=f"inv-{n}",
            author="assistant",
            timestamp=now + 1e-6,
            content=types.Content(role="model", parts=[types.Part(text=ANSWER_TEXT)]),
            actions=EventActions(state_delta={"answered": n}),
        ),
    ]


@dataclass
class _Read:
    """What the floor's read returns: the session's id, its state and its newest events' JSON (no ADK objects)."""

    id: str
    state: dict[str, Any]
    events: list[Any]


class _FloorSQLite:
    """The floor on SQLite: ``sqlite3`` on the loop's thread; a read is two ``SELECT``s, an append one
    transaction (the session's state ``UPDATE`` and the event's ``INSERT``). No stale check, no shared state."""

    def __init__(self, path: str) -> None:
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # chatkeep's default durability
        self._db.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, state TEXT NOT NULL)")
        self._db.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY, sid TEXT NOT NULL, data TEXT NOT NULL)")
        self._db.execute("CREATE INDEX events_sid ON events (sid, seq)")

    async def create_session(self, *, app_name: str, user_id: str, session_id: str) -> _Read:
        self._db.execute("INSERT INTO sessions VALUES (?, '{}')", (session_id,))
        return _Read(session_id, {}, [])

    async def get_session(self, *, app_name: str, user_id: str, session_id: str, config: GetSessionConfig) -> _Read:
        (state,) = self._db.execute("SELECT state FROM sessions WHERE id = ?", (session_id,)).fetchone()
        rows = self._db.execute(
            "SELECT data FROM events WHERE sid = ? ORDER BY seq DESC LIMIT ?", (session_id, config.num_recent_events)
        ).fetchall()
        return _Read(session_id, json.loads(state), [json.loads(row[0]) for row in reversed(rows)])

    async def append_event(self, session: _Read, event: Event) -> None:
        session.state.update(event.actions.state_delta)
        self._db.execute("BEGIN")
        self._db.execute("UPDATE sessions SET state = ? WHERE id = ?", (json.dumps(session.state), session.id))
        self._db.execute("INSERT INTO events (sid, data) VALUES (?, ?)", (session.id, event.model_dump_json()))
        self._db.execute("COMMIT")

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        self._db.execute("DELETE FROM events WHERE sid = ?", (session_id,))
        self._db.execute("DELETE FROM sessions WHERE id = ?", (session_id,))

    def close(self) -> None:
        self._db.close()


class _FloorPostgres:
    """The floor on PostgreSQL: one asyncpg connection; a read is one statement (the state and the newest events'
    JSON), an append one (the state's ``UPDATE`` and the event's ``INSERT`` in one CTE). No stale check."""

    def __init__(self, connection: Any) -> None:
        self._db = connection

    @classmethod
    async def made(cls, dsn: str, schema: str) -> _FloorPostgres:
        import asyncpg

        connection = await asyncpg.connect(dsn, server_settings={"search_path": schema})
        await connection.execute("CREATE TABLE floor_sessions (id text PRIMARY KEY, state text NOT NULL)")
        await connection.execute(
            "CREATE TABLE floor_events (seq bigserial PRIMARY KEY, sid text NOT NULL, data text NOT NULL)"
        )
        await connection.execute("CREATE INDEX floor_events_sid ON floor_events (sid, seq)")
        return cls(connection)

    async def create_session(self, *, app_name: str, user_id: str, session_id: str) -> _Read:
        await self._db.execute("INSERT INTO floor_sessions VALUES ($1, '{}')", session_id)
        return _Read(session_id, {}, [])

    async def get_session(self, *, app_name: str, user_id: str, session_id: str, config: GetSessionConfig) -> _Read:
        state, events = await self._db.fetchrow(
            "SELECT state, ARRAY(SELECT data FROM floor_events WHERE sid = $1 ORDER BY seq DESC LIMIT $2) "
            "FROM floor_sessions WHERE id = $1",
            session_id,
            config.num_recent_events,
        )
        return _Read(session_id, json.loads(state), [json.loads(data) for data in reversed(events)])

    async def append_event(self, session: _Read, event: Event) -> None:
        session.state.update(event.actions.state_delta)
        await self._db.execute(
            "WITH updated AS (UPDATE floor_sessions SET state = $2 WHERE id = $1) "
            "INSERT INTO floor_events (sid, data) VALUES ($1, $3)",
            session.id,
            json.dumps(session.state),
            event.model_dump_json(),
        )

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        await self._db.execute("DELETE FROM floor_events WHERE sid = $1", session_id)
        await self._db.execute("DELETE FROM floor_sessions WHERE id = $1", session_id)

    async def close(self) -> None:
        await self._db.close()


@dataclass
class Pair:
    """One backend: ADK's service, chatkeep's and the floor, and how to clean up."""

    family: str
    services: dict[str, Any]
    close: Callable[[], Awaitable[None]]
    seeded: Callable[[], Awaitable[None]] | None = None


@asynccontextmanager
async def _sqlite() -> AsyncIterator[Pair]:
    folder = tempfile.mkdtemp(prefix="chatkeep-bench-adk-")
    adk = DatabaseSessionService(f"sqlite+aiosqlite:///{folder}/adk.db")
    store = open_store(f"sqlite:///{folder}/chatkeep.db")
    chatkeep = ChatkeepSessionService(store, tenant="bench")

    floor = _FloorSQLite(f"{folder}/floor.db")

    async def close() -> None:
        await adk.close()
        await store.close()
        floor.close()
        shutil.rmtree(folder, ignore_errors=True)

    services = {"DatabaseSessionService": adk, "ChatkeepSessionService": chatkeep, FLOOR: floor}
    yield Pair("SQLite file", services, close)


@asynccontextmanager
async def _postgresql() -> AsyncIterator[Pair]:
    async with own_schema(PG_URL, "ck_bench_adk") as (schema, dsn):
        adk = DatabaseSessionService(PG_URL, connect_args={"server_settings": {"search_path": schema}})
        store = open_store(f"{PG_URL}?schema={schema}")
        chatkeep = ChatkeepSessionService(store, tenant="bench")
        floor = await _FloorPostgres.made(dsn, schema)

        async def close() -> None:
            await adk.close()
            await store.close()
            await floor.close()

        yield Pair(
            "PostgreSQL",
            {"DatabaseSessionService (asyncpg)": adk, "ChatkeepSessionService": chatkeep, FLOOR: floor},
            close,
            seeded=functools.partial(analyze_schema, dsn, schema),
        )


PAIRS: dict[str, Callable[[], Any]] = {"sqlite": _sqlite, "postgresql": _postgresql}


async def _seed(service: Any, session_id: str, size: int) -> None:
    session = await service.create_session(app_name=APP, user_id=USER, session_id=session_id)
    for n in range(size // 2):
        for event in _events(n):
            await service.append_event(session, event)


async def _turn(service: Any, session_id: str, n: int) -> None:
    session = await service.get_session(
        app_name=APP, user_id=USER, session_id=session_id, config=GetSessionConfig(num_recent_events=WINDOW)
    )
    assert session is not None
    for event in _events(n):
        await service.append_event(session, event)


async def _alternating(
    services: dict[str, Any], session_id: str, turns: int, warmup: int = 10
) -> dict[str, list[float]]:
    """Time ``turns`` turns of each service, one of each in turn (in alternating order), after ``warmup``."""
    n = 0
    for _ in range(warmup):
        for service in services.values():
            n += 1
            await _turn(service, session_id, n)
    gc.collect()
    samples: dict[str, list[float]] = {name: [] for name in services}
    order = list(services.items())
    for i in range(turns):
        for name, service in order if i % 2 == 0 else reversed(order):
            n += 1
            start = time.perf_counter()
            await _turn(service, session_id, n)
            samples[name].append(time.perf_counter() - start)
    return samples


async def _measure(pair: Pair, *, turns: int) -> list[tuple[int, dict[str, Result]]]:
    rows = []
    for size in SIZES:
        session_id = f"turn-{size}-{uuid.uuid4().hex[:6]}"
        for service in pair.services.values():
            await _seed(service, session_id, size)
        if pair.seeded is not None:
            await pair.seeded()
        samples = await _alternating(pair.services, session_id, turns)
        rows.append((size, {name: Result(name, size, found) for name, found in samples.items()}))
        for service in pair.services.values():
            await service.delete_session(app_name=APP, user_id=USER, session_id=session_id)
    return rows


def _theirs(theirs: dict[int, Result], result: Result) -> Result | None:
    """ADK's row of the size, to compare the other rows with (ADK's own rows are compared with nothing)."""
    return None if result is theirs[result.size] else theirs[result.size]


def main(argv: list[str]) -> int:
    """Run the benchmark and print one Markdown table per backend, then the targets."""
    chosen, quick = pair_arguments("python -m benchmarks interop-adk", __doc__.splitlines()[0], list(PAIRS), argv)
    turns = 50 if quick else 300

    results = asyncio.run(measure_pairs(PAIRS, chosen, functools.partial(_measure, turns=turns)))
    targets = ["### Targets", ""]
    for family, rows in results.items():
        flat = [result for _, by_name in rows for result in by_name.values()]
        theirs = {size: next(r for n, r in by_name.items() if n.startswith("Database")) for size, by_name in rows}
        print(
            speedup_table(
                f"{TITLE}, {family}",
                flat,
                [("ADK's own", functools.partial(_theirs, theirs))],
            )
        )
        print()
        for size, which in ((SIZES[-1], "largest"), (SIZES[0], "smallest")):
            by_name = dict(rows)[size]
            gained, reach = (
                speedup(by_name["ChatkeepSessionService"], theirs[size]),
                speedup(by_name[FLOOR], theirs[size]),
            )
            targets.append(f"{target_line(family, size, gained, which)} (the floor: {reach:.2f}x)")
    print("\n".join(targets))
    return 0
