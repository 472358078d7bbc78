"""ChatkeepSessionService beside Google ADK's own DatabaseSessionService, on the same backend, in the same run.

The turn is what ADK's runner does per run with its session service: ``get_session`` with the newest 20 events
(``GetSessionConfig(num_recent_events=20)``), then ``append_event`` of the turn's 2 events (the user's message
and the model's answer, each with a session-state delta), the second appended to the session object the first
returned. Pairs, each on the same place: a SQLite file each, in one folder (ADK on ``sqlite+aiosqlite``,
chatkeep on ``sqlite:///``), and one PostgreSQL server, in a schema of this run's own (ADK on
``postgresql+asyncpg``, chatkeep on the same URL), whose tables are analyzed after seeding (as autovacuum soon
would).

Sessions of 10, 1,000 and 10,000 prior events, seeded through each service's own ``append_event``. The two
paths of a size take turns, one turn each, so a busy machine slows them alike. The ratio is ADK's median turn
divided by chatkeep's: above 1, chatkeep is faster.

Run with ``python -m benchmarks interop-adk [--quick] [--only sqlite,postgresql]`` (the nox session
``interop_bench(framework='adk')`` installs ADK and aiosqlite).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from google.adk.events import Event, EventActions
from google.adk.sessions import BaseSessionService, DatabaseSessionService
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
class Pair:
    """One backend: ADK's service and chatkeep's, and how to clean up."""

    family: str
    services: dict[str, BaseSessionService]
    close: Callable[[], Awaitable[None]]
    seeded: Callable[[], Awaitable[None]] | None = None


@asynccontextmanager
async def _sqlite() -> AsyncIterator[Pair]:
    folder = tempfile.mkdtemp(prefix="chatkeep-bench-adk-")
    adk = DatabaseSessionService(f"sqlite+aiosqlite:///{folder}/adk.db")
    store = open_store(f"sqlite:///{folder}/chatkeep.db")
    chatkeep = ChatkeepSessionService(store, tenant="bench")

    async def close() -> None:
        await adk.close()
        await store.close()

    yield Pair("SQLite file", {"DatabaseSessionService": adk, "ChatkeepSessionService": chatkeep}, close)


@asynccontextmanager
async def _postgresql() -> AsyncIterator[Pair]:
    async with own_schema(PG_URL, "ck_bench_adk") as (schema, dsn):
        adk = DatabaseSessionService(PG_URL, connect_args={"server_settings": {"search_path": schema}})
        store = open_store(f"{PG_URL}?schema={schema}")
        chatkeep = ChatkeepSessionService(store, tenant="bench")

        async def close() -> None:
            await adk.close()
            await store.close()

        yield Pair(
            "PostgreSQL",
            {"DatabaseSessionService (asyncpg)": adk, "ChatkeepSessionService": chatkeep},
            close,
            seeded=functools.partial(analyze_schema, dsn, schema),
        )


PAIRS: dict[str, Callable[[], Any]] = {"sqlite": _sqlite, "postgresql": _postgresql}


async def _seed(service: BaseSessionService, session_id: str, size: int) -> None:
    session = await service.create_session(app_name=APP, user_id=USER, session_id=session_id)
    for n in range(size // 2):
        for event in _events(n):
            await service.append_event(session, event)


async def _turn(service: BaseSessionService, session_id: str, n: int) -> None:
    session = await service.get_session(
        app_name=APP, user_id=USER, session_id=session_id, config=GetSessionConfig(num_recent_events=WINDOW)
    )
    assert session is not None
    for event in _events(n):
        await service.append_event(session, event)


async def _alternating(
    services: dict[str, BaseSessionService], session_id: str, turns: int, warmup: int = 10
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
    """ADK's row of the size, to compare chatkeep's row with (ADK's own rows are compared with nothing)."""
    return theirs[result.size] if result.name == "ChatkeepSessionService" else None


def main(argv: list[str]) -> int:
    """Run the benchmark and print one Markdown table per backend, then the targets."""
    chosen, quick = pair_arguments("python -m benchmarks interop-adk", __doc__.splitlines()[0], list(PAIRS), argv)
    turns = 50 if quick else 300

    results = asyncio.run(measure_pairs(PAIRS, chosen, functools.partial(_measure, turns=turns)))
    targets = ["### Targets", ""]
    for family, rows in results.items():
        flat = [result for _, by_name in rows for result in by_name.values()]
        theirs = {size: next(r for n, r in by_name.items() if n != "ChatkeepSessionService") for size, by_name in rows}
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
            gained = speedup(by_name["ChatkeepSessionService"], theirs[size])
            targets.append(target_line(family, size, gained, which))
    print("\n".join(targets))
    return 0
