"""ChatkeepHistoryProvider beside Microsoft Agent Framework's own history providers, on the same backend.

Run with ``python -m benchmarks interop-agent-framework [--quick] [--url redis://127.0.0.1:6379/0]``, in a venv
with the pins of ``nox -s "interop_bench(framework='agent-framework')"`` (agent-framework-redis).

The turn is what the framework's ``Agent`` does per run, through the provider's own hooks: ``before_run``
(loading the history into a ``SessionContext``), then ``after_run`` (storing the new user message and the
answer). ``ChatkeepHistoryProvider`` loads the newest 20 (``load_last=20``); the framework's providers load
the whole history, the only thing they can do (``RedisHistoryProvider.max_messages`` deletes history, it
does not bound a read). Compared on the same Redis server: ``RedisHistoryProvider`` (agent-framework-redis)
and ``ChatkeepHistoryProvider`` on ``redis://``, plus ours with ``load_last=None`` (the same whole-history
read) to separate the window from the rest. In process: ``InMemoryHistoryProvider`` (``session.state``) and
ours on ``memory://``. The session is trimmed back to its size after each timed turn (untimed), so every turn
meets the stated number of messages; the paths take turns one turn at a time, so a busy machine slows them alike.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, cast

from agent_framework import (
    AgentResponse,
    AgentSession,
    HistoryProvider,
    InMemoryHistoryProvider,
    Message,
    SessionContext,
    SupportsAgentRun,
)
from agent_framework_redis import RedisHistoryProvider

from benchmarks._common import Result, speedup, speedup_table, target_line
from chatkeep.interop.agent_framework import ChatkeepHistoryProvider

__all__ = ["main"]

SIZES = (10, 1_000, 10_000)
WINDOW = 20
TEXT = "The quick brown fox jumps over the lazy dog. " * 4  # ~180 characters: a typical short chat message
AGENT = cast(SupportsAgentRun, None)  # the hooks never touch the agent
TITLE = "Agent Framework: one turn (before_run + after_run)"


class _Path:
    """One provider on one session, with the untimed reset that keeps the session at its size."""

    def __init__(
        self, name: str, backend: str, provider: HistoryProvider, trim: Callable[[AgentSession, int], Awaitable[None]]
    ) -> None:
        self.name, self.backend, self.provider, self.trim = name, backend, provider, trim
        self.sessions: dict[int, AgentSession] = {}

    async def seed(self, size: int) -> None:
        session = self.sessions[size] = AgentSession(session_id=f"bench-{uuid.uuid4().hex[:8]}-{size}")
        state = session.state.setdefault(self.provider.source_id, {})
        for start in range(0, size, 1_000):
            batch = [_message(n) for n in range(start, min(size, start + 1_000))]
            await self.provider.save_messages(session.session_id, batch, state=state)

    async def turn(self, size: int, n: int) -> None:
        session = self.sessions[size]
        state = session.state.setdefault(self.provider.source_id, {})
        context = SessionContext(session_id=session.session_id, input_messages=[Message("user", [f"q{n}: {TEXT}"])])
        if self.provider.load_messages:
            await self.provider.before_run(agent=AGENT, session=session, context=context, state=state)
        context._response = AgentResponse(messages=[Message("assistant", [f"a{n}: {TEXT}"])])
        await self.provider.after_run(agent=AGENT, session=session, context=context, state=state)


def _message(n: int) -> Message:
    return Message("user" if n % 2 == 0 else "assistant", [f"{n}: {TEXT}"])


async def _measure(paths: list[_Path], size: int, iterations: int, counter: list[int], warmup: int = 3) -> list[Result]:
    """Time ``iterations`` turns of each path, the paths taking turns one turn at a time (the same load for all)."""
    samples: list[list[float]] = [[] for _ in paths]
    gc.collect()
    for i in range(warmup + iterations):
        for path, timed in zip(paths, samples, strict=True):
            counter[0] += 1
            start = time.perf_counter()
            await path.turn(size, counter[0])
            if i >= warmup:
                timed.append(time.perf_counter() - start)
            await path.trim(path.sessions[size], size)
    return [Result(path.name, size, timed) for path, timed in zip(paths, samples, strict=True)]


def _redis_paths(url: str, prefix: str) -> list[_Path]:
    theirs = RedisHistoryProvider("memory", redis_url=url, key_prefix=prefix, application_id="bench")

    async def trim_theirs(session: AgentSession, size: int) -> None:
        await theirs._redis_client.ltrim(theirs._redis_key(session.session_id), -size, -1)  # type: ignore[misc]

    paths = [_Path("agent-framework RedisHistoryProvider", "Redis", theirs, trim_theirs)]
    for name, load_last in (("ChatkeepHistoryProvider", WINDOW), ("ChatkeepHistoryProvider, whole history", None)):
        ours = ChatkeepHistoryProvider("memory", store=url, store_options={"prefix": prefix}, load_last=load_last)
        paths.append(_Path(name, "Redis", ours, _chatkeep_trim(ours)))
    return paths


def _memory_paths() -> list[_Path]:
    theirs = InMemoryHistoryProvider("memory")

    async def trim_theirs(session: AgentSession, size: int) -> None:
        state = session.state["memory"]
        state["messages"] = state["messages"][-size:]

    ours = ChatkeepHistoryProvider("memory", store="memory://", load_last=WINDOW)
    return [
        _Path("agent-framework InMemoryHistoryProvider", "memory", theirs, trim_theirs),
        _Path("ChatkeepHistoryProvider", "memory", ours, _chatkeep_trim(ours)),
    ]


def _chatkeep_trim(provider: ChatkeepHistoryProvider) -> Callable[[AgentSession, int], Awaitable[None]]:
    async def trim(session: AgentSession, size: int) -> None:
        await provider.store.trim(provider.session_key(session.session_id), keep_last=size)

    return trim


async def _run(url: str, rounds: int, iterations: dict[int, int]) -> list[Result]:
    prefix = f"ckbench-af-{uuid.uuid4().hex[:8]}"
    results: dict[tuple[str, str, int], list[float]] = {}
    counter = [0]
    # One backend at a time, one size at a time, each session deleted after its size: the in-memory provider's
    # 10,000 live messages (and the Redis paths' garbage) never weigh on the other backend's turns.
    for paths in (_redis_paths(url, prefix), _memory_paths()):
        try:
            for size in SIZES:
                for path in paths:
                    await path.seed(size)
                for _ in range(rounds):
                    for path, result in zip(paths, await _measure(paths, size, iterations[size], counter), strict=True):
                        results.setdefault((path.backend, path.name, size), []).extend(result.samples)
                for path in paths:
                    await _forget(path, size)
        finally:
            for path in paths:
                for size in list(path.sessions):
                    await _forget(path, size)
                close = getattr(path.provider, "aclose", None)
                if close is not None:
                    await close()
    out = []
    for (backend, name, size), samples in results.items():
        result = Result(name, size, samples)
        result.backend = backend  # type: ignore[attr-defined]
        out.append(result)
    return out


async def _forget(path: _Path, size: int) -> None:
    session = path.sessions.pop(size)
    if isinstance(path.provider, ChatkeepHistoryProvider):
        await path.provider.clear(session)
    elif isinstance(path.provider, RedisHistoryProvider):
        await path.provider.clear(session.session_id)


def _report(results: list[Result]) -> str:
    def find(backend: str, name: str, size: int) -> Result:
        return next(r for r in results if r.backend == backend and r.name == name and r.size == size)  # type: ignore[attr-defined]

    baselines = {"Redis": "agent-framework RedisHistoryProvider", "memory": "agent-framework InMemoryHistoryProvider"}
    lines = []
    for backend, name in baselines.items():
        rows = [r for r in results if r.backend == backend]  # type: ignore[attr-defined]
        lines += [
            speedup_table(f"{TITLE}, {backend}", rows, [(name, lambda row, b=backend, n=name: find(b, n, row.size))]),
            "",
        ]
    lines += ["### Targets (ChatkeepHistoryProvider, load_last=20)", ""]
    for backend, name in baselines.items():
        for size, which in ((SIZES[-1], "largest"), (SIZES[0], "smallest")):
            ours, theirs = find(backend, "ChatkeepHistoryProvider", size), find(backend, name, size)
            lines.append(target_line(f"{backend}, against {name},", size, speedup(ours, theirs), which))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Run the benchmark and print Markdown tables (synchronous: it runs its own event loop)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks interop-agent-framework")
    parser.add_argument("--url", default=os.environ.get("CHATKEEP_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run, noisy numbers)")
    args = parser.parse_args(argv)
    rounds = 2 if args.quick else 5
    iterations = {10: 60, 1_000: 20, 10_000: 4} if args.quick else {10: 300, 1_000: 40, 10_000: 8}
    results: list[Any] = asyncio.run(_run(args.url, rounds, iterations))
    print(_report(results))
    print()
    return 0
