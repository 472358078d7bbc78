"""The sync view beside the async store it wraps, on memory and a SQLite file, measured in the same run.

A turn is what an agent does per user message: ``load(key, last=20)`` then ``append`` of two messages. Paths,
per backend and session size (10 and 1,000 messages):

* ``async store``: ``await store.load(...)`` then ``await store.append(...)`` on a running event loop (the
  baseline: what the sync view adds is the cost of a blocking call);
* ``sync view``: ``view.load(...)`` then ``view.append(...)`` from a plain thread (this one, which runs no
  event loop), so each call runs the view's private loop right there, with no handover to another thread;
* ``sync view, one run()``: ``view.run(turn(view.store, key))``, the turn's two calls as one blocking call.

Each path has a store of its own (same backend, same size) and makes its messages before its timer starts.
Every path runs once per round, in a rotating order (the machine is shared: load spikes hit all paths alike);
the tables report each path's median and 99th percentile and its p50 ratio to the async store's.
Run with ``python -m benchmarks sync [--rounds N] [--iterations N] [--only memory,sqlite]``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import shutil
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks._common import Result, format_table
from chatkeep.core import HistoryStore, Message, SessionKey, SyncHistoryStore, open_store

__all__ = ["main"]

SIZES = (10, 1_000)
WINDOW = 20
TEXT = "The quick brown fox jumps over the lazy dog. " * 4  # ~180 characters: a typical short chat message
ASYNC, SYNC, SYNC_RUN = "async store", "sync view", "sync view, one run()"
PATHS = (ASYNC, SYNC, SYNC_RUN)


def _pair() -> list[Message]:
    return [Message(role="user", text=f"question: {TEXT}"), Message(role="assistant", text=f"answer: {TEXT}")]


async def _turn(store: HistoryStore, key: SessionKey, pair: list[Message]) -> None:
    await store.load(key, last=WINDOW)
    await store.append(key, pair)


async def _async_turns(store: HistoryStore, key: SessionKey, pairs: list[list[Message]]) -> list[float]:
    samples = []
    for pair in pairs:
        start = time.perf_counter()
        await store.load(key, last=WINDOW)
        await store.append(key, pair)
        samples.append(time.perf_counter() - start)
    return samples


def _sync_turn(view: SyncHistoryStore, key: SessionKey, pair: list[Message]) -> None:
    view.load(key, last=WINDOW)
    view.append(key, pair)


def _sync_run_turn(view: SyncHistoryStore, key: SessionKey, pair: list[Message]) -> None:
    view.run(_turn(view.store, key, pair))


def _timed(turn: Callable[[list[Message]], object], pairs: list[list[Message]]) -> list[float]:
    samples = []
    for pair in pairs:
        start = time.perf_counter()
        turn(pair)
        samples.append(time.perf_counter() - start)
    return samples


@dataclass
class _Backend:
    """Where the stores live: ``url(tag)`` names a store of its own per tag (the async store's, the view's)."""

    name: str
    url: Callable[[str], str]
    cleanup: Callable[[], None]


def _memory(run_id: str) -> _Backend:
    return _Backend("memory", lambda tag: f"memory://syncbench-{run_id}-{tag}", lambda: None)


def _sqlite(run_id: str) -> _Backend:
    folder = tempfile.mkdtemp(prefix="chatkeep-syncbench-")
    return _Backend(
        "SQLite file",
        lambda tag: f"sqlite:///{folder}/{tag}.db",
        lambda: shutil.rmtree(folder, ignore_errors=True),
    )


BACKENDS = {"memory": _memory, "sqlite": _sqlite}


async def _seed(store: HistoryStore, key: SessionKey, size: int) -> None:
    for start in range(0, size, 500):
        batch = range(start, min(size, start + 500))
        await store.append(key, [Message(role="user", text=f"{n}: {TEXT}") for n in batch])


def _run_backend(backend: _Backend, rounds: int, iterations: int) -> list[Result]:
    loop = asyncio.new_event_loop()  # the async path's loop; this thread runs it only while that path is timed
    store = open_store(backend.url("async"))
    view = open_store(backend.url("sync")).sync()
    keys = {(path, size): SessionKey("syncbench", f"{path}-{size}") for path in PATHS for size in SIZES}
    try:
        for size in SIZES:
            loop.run_until_complete(_seed(store, keys[ASYNC, size], size))
            for path in (SYNC, SYNC_RUN):
                view.run(_seed(view.store, keys[path, size], size))
        samples: dict[tuple[str, int], list[float]] = defaultdict(list)
        for n in range(rounds):
            for size in SIZES:
                for path in PATHS[n % len(PATHS) :] + PATHS[: n % len(PATHS)]:
                    pairs = [_pair() for _ in range(iterations)]
                    key = keys[path, size]
                    if path == ASYNC:
                        samples[path, size] += loop.run_until_complete(_async_turns(store, key, pairs))
                    else:
                        turn = _sync_turn if path == SYNC else _sync_run_turn
                        samples[path, size] += _timed(functools.partial(turn, view, key), pairs)
        return [Result(path, size, samples[path, size]) for size in SIZES for path in PATHS]
    finally:
        view.close()
        loop.run_until_complete(store.close())
        loop.close()
        backend.cleanup()


def _async_of(results: list[Result]) -> Callable[[Result], Result]:
    """Each row's baseline: the async store's row of the same size."""
    baselines = {result.size: result for result in results if result.name == ASYNC}
    return lambda result: baselines[result.size]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks sync")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--iterations", type=int, default=300, help="turns per path per round")
    parser.add_argument("--only", default=",".join(BACKENDS), help="comma-separated: memory,sqlite")
    args = parser.parse_args(argv)
    run_id = uuid.uuid4().hex[:8]
    for name in args.only.split(","):
        backend = BACKENDS[name.strip()](run_id)
        results = _run_backend(backend, args.rounds, args.iterations)
        title = f"Sync view turn (load last {WINDOW}, append 2), {backend.name}"
        print(format_table(title, results, _async_of(results), versus="async store"))
        print()
    return 0
