"""How long a sync view's one-message append takes on PostgreSQL, and how many turns of the event loop it costs.

A measurement script (like ``measure_deadlines.py``), not a benchmark of the suite: run it on each side of a
change and compare. The turns are counted by wrapping ``BaseEventLoop._run_once``; the time is each round's
median per-call time (the machine is noisy: compare the medians of several runs, not one number).

    python scripts/measure_sync_append.py [URL] [--rounds 5] [--calls 1000]

The default URL is the local test server's schema ``shield_bench``, which must exist. To measure the code before
a change, put that checkout's ``packages/core/src`` and ``packages/sql/src`` first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import chatkeep.core
import chatkeep.sql
from chatkeep.core import Message, SessionKey
from chatkeep.sql import SQLHistoryStore

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test?schema=shield_bench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url", nargs="?", default=DEFAULT_URL)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    view = SQLHistoryStore(args.url).sync()
    key = SessionKey("bench", uuid.uuid4().hex)
    one = [Message(role="user", text="hello")]
    try:
        for _ in range(50):  # warm up: connection, prepared statements
            view.append(key, one)
        turns = 0
        run_once = asyncio.BaseEventLoop._run_once  # type: ignore[attr-defined]

        def counted(loop: asyncio.BaseEventLoop) -> None:
            nonlocal turns
            turns += 1
            run_once(loop)

        asyncio.BaseEventLoop._run_once = counted  # type: ignore[attr-defined]
        try:
            for _ in range(100):
                view.append(key, one)
        finally:
            asyncio.BaseEventLoop._run_once = run_once  # type: ignore[attr-defined]
        print(f"code: {chatkeep.core.__file__}, {chatkeep.sql.__file__}")
        print(f"loop turns per append: {turns / 100:.2f}")
        medians = []
        for _ in range(args.rounds):
            times = []
            for _ in range(args.calls):
                start = time.perf_counter()
                view.append(key, one)
                times.append(time.perf_counter() - start)
            medians.append(statistics.median(times) * 1e3)
        print("median ms per round: " + " ".join(f"{m:.3f}" for m in medians))
        print(f"median of medians: {statistics.median(medians):.3f} ms")
    finally:
        view.delete(key)
        view.close()


if __name__ == "__main__":
    main()
