"""Forks, windowed reads on forks and tag listing, on any store that implements them (memory:// by default).

Three tables, each measured in one run on one store:

* ``fork``: ``store.fork(source, new_target)`` of sessions of 10, 10,000 and 100,000 messages; the ratio is to the
  fork of the 10-message session (flat means the cost does not grow with the history: nothing is copied);
* ``load(last=20)``: on a plain session of 100,000 messages and on a fork of a fork of a fork of one (each fork
  with 5 messages of its own); the ratio is to the plain session;
* ``list_sessions``: one page of 20 over 100,000 sessions of a tenant, unfiltered and with a tag 1 in 100 of them
  carry (``tag=``); and one session's entry: ``session_info`` of the oldest session (read by key), and the walk
  of the listing's pages of 500 that finds it without ``session_info`` (what the base's default does, and what
  ``chatkeep ui`` did); the ratio is to the unfiltered page.

Run with ``python -m benchmarks forks [--url URL] [--iterations N]``.
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Iterator

from benchmarks._common import Result, format_table, measure_async
from chatkeep.core import HistoryStore, Message, SessionInfo, SessionKey, open_store

__all__ = ["main"]

SIZES = (10, 10_000, 100_000)
SESSIONS, TAGGED_EVERY, PAGE, WINDOW, WALK_PAGE = 100_000, 100, 20, 20, 500
TEXT = "The quick brown fox jumps over the lazy dog. " * 4


async def _seed(store: HistoryStore, key: SessionKey, size: int) -> list[Message]:
    last: list[Message] = []
    for start in range(0, size, 1_000):
        last = [Message(role="user", text=f"{n}: {TEXT}") for n in range(start, min(size, start + 1_000))]
        await store.append(key, last)
    return last


async def _forks(store: HistoryStore, tenant: str, iterations: int) -> list[Result]:
    results = []
    for size in SIZES:
        source = SessionKey(tenant, f"source-{size}")
        await _seed(store, source, size)
        targets = (SessionKey(tenant, f"fork-{size}-{n}") for n in range(10**9))

        async def fork(source: SessionKey = source, targets: Iterator[SessionKey] = targets) -> None:
            await store.fork(source, next(targets))

        results.append(await measure_async("fork", size, fork, iterations=iterations))
    return results


async def _windows(store: HistoryStore, tenant: str, iterations: int) -> list[Result]:
    plain = SessionKey(tenant, "plain")
    await _seed(store, plain, SIZES[-1])
    chain = plain
    for depth in range(3):
        fork = SessionKey(tenant, f"chain-{depth}")
        await store.fork(chain, fork)
        await store.append(fork, [Message(role="user", text=f"{depth}-{n}: {TEXT}") for n in range(5)])
        chain = fork
    return [
        await measure_async("plain session", SIZES[-1], lambda: store.load(plain, last=WINDOW), iterations=iterations),
        await measure_async(
            "fork of a fork of a fork", SIZES[-1] + 15, lambda: store.load(chain, last=WINDOW), iterations=iterations
        ),
    ]


async def _walk(store: HistoryStore, key: SessionKey) -> SessionInfo:
    """``key``'s entry found by paging the listing, as a store without ``session_info`` finds it."""
    cursor: str | None = None
    while True:
        page = await store.list_sessions(key.tenant, limit=WALK_PAGE, cursor=cursor)
        for info in page.items:
            if info.session_id == key.session_id:
                return info
        assert page.next_cursor is not None, f"{key} is not listed"
        cursor = page.next_cursor


async def _listing(store: HistoryStore, tenant: str, iterations: int) -> list[Result]:
    for n in range(SESSIONS):
        key = SessionKey(tenant, f"s{n:06}")
        await store.append(key, [Message(role="user", text=TEXT)])
        if n % TAGGED_EVERY == 0:
            await store.update_info(key, tags={"billing"})
    oldest = SessionKey(tenant, "s000001")  # s000000 carries a tag, so its update moved it up
    assert await store.session_info(oldest) == await _walk(store, oldest)
    return [
        await measure_async(
            "unfiltered", SESSIONS, lambda: store.list_sessions(tenant, limit=PAGE), iterations=iterations
        ),
        await measure_async(
            "tag=billing (1 in 100)",
            SESSIONS,
            lambda: store.list_sessions(tenant, tag="billing", limit=PAGE),
            iterations=iterations,
        ),
        await measure_async(
            "session_info (oldest)", SESSIONS, lambda: store.session_info(oldest), iterations=iterations
        ),
        await measure_async(
            f"walk of pages of {WALK_PAGE} (oldest)", SESSIONS, lambda: _walk(store, oldest), iterations=3, warmup=1
        ),
    ]


async def _run(url: str, iterations: int) -> None:
    run = uuid.uuid4().hex[:8]
    async with open_store(url) as store:
        forks = await _forks(store, f"forkbench-{run}-f", iterations)
        print(format_table(f"fork, {url}", forks, lambda _: forks[0], versus="10 messages"))
        print()
        windows = await _windows(store, f"forkbench-{run}-w", iterations)
        print(format_table(f"load(last={WINDOW}), {url}", windows, lambda _: windows[0], versus="plain"))
        print()
        listing = await _listing(store, f"forkbench-{run}-l", max(iterations // 10, 10))
        print(format_table(f"list_sessions page of {PAGE}, {url}", listing, lambda _: listing[0], versus="unfiltered"))
        print()
        for tenant in ("f", "w", "l"):
            await store.delete_tenant(f"forkbench-{run}-{tenant}")


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks forks")
    parser.add_argument("--url", default="memory://forkbench", help="the store (default: %(default)s)")
    parser.add_argument("--iterations", type=int, default=200)
    args = parser.parse_args(argv)
    await _run(args.url, args.iterations)
    return 0
