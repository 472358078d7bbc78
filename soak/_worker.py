"""One soak writer process: writers that append numbered batches and readers that record what they saw.

Everything it does goes to a log file, one line per event, written with a single ``write`` on an
``O_APPEND`` descriptor, so a SIGKILL loses at most the line of an append that was never logged (which the
checker then treats as unacknowledged):

* ``A writer seq session n t0 t1``: an append of ``n`` messages was acknowledged (``t0``/``t1``: wall clock).
* ``R session t0 t1 id,id,...``: a reader loaded the newest messages of a session and saw these ids.
* ``E kind t``: a call failed with a ChatkeepError (retried); ``X kind t message``: any other exception.

A message id is ``writer.seq.i.n``: the checker recovers each append's writer, order and size from it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import time
import traceback

from chatkeep.core import ChatkeepError, HistoryStore, Message, SessionKey, open_store

GIVE_UP_AFTER_STOP = 30.0  # seconds a writer keeps retrying its last append once the run has ended


def message_id(writer: str, seq: int, index: int, size: int) -> str:
    """The id of message ``index`` of a writer's append number ``seq`` of ``size`` messages."""
    return f"{writer}.{seq:07d}.{index}.{size}"


def _where(exc: BaseException) -> str:
    """The innermost frames of an unexpected exception, on one line: where to look."""
    frames = traceback.extract_tb(exc.__traceback__)[-4:]
    return "at " + " < ".join(f"{os.path.basename(f.filename)}:{f.lineno}:{f.name}" for f in reversed(frames))


class Log:
    """An append-only event log that survives the process being killed between any two lines."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def line(self, *fields: object) -> None:
        os.write(self._fd, (" ".join(str(f) for f in fields) + "\n").encode())


async def writer(
    store: HistoryStore, name: str, keys: list[SessionKey], log: Log, stop: asyncio.Event, rng: random.Random
) -> None:
    """Append numbered batches, one at a time, retrying each until it is acknowledged."""
    seq = 0
    while not stop.is_set():
        size = rng.randint(1, 3)
        key = rng.choice(keys)
        batch = [
            Message(message_id=message_id(name, seq, i, size), role="user", text=f"{name} append {seq} part {i}")
            for i in range(size)
        ]
        started = time.time()
        deadline = None
        while True:
            try:
                await store.append(key, batch)
                break
            except ChatkeepError as exc:
                log.line("E", type(exc).__name__, f"{time.time():.6f}")
            except Exception as exc:
                log.line("X", type(exc).__name__, f"{time.time():.6f}", repr(str(exc)[:200]), _where(exc))
            if stop.is_set():
                deadline = deadline or time.monotonic() + GIVE_UP_AFTER_STOP
                if time.monotonic() > deadline:
                    return  # never acknowledged: the checker only asks that it is whole or absent
            await asyncio.sleep(rng.uniform(0.02, 0.2))
        log.line("A", name, seq, key.session_id, size, f"{started:.6f}", f"{time.time():.6f}")
        seq += 1
        # SQLite runs short calls inline on the event loop, so a loop of appends alone would never let the
        # readers run; an agent's turn awaits its model in between.
        await asyncio.sleep(0)


async def reader(
    store: HistoryStore, keys: list[SessionKey], log: Log, stop: asyncio.Event, rng: random.Random
) -> None:
    """Load the newest messages of random sessions and log the ids seen."""
    while not stop.is_set():
        key = rng.choice(keys)
        started = time.time()
        try:
            seen = await store.load(key, last=20)
        except ChatkeepError as exc:
            log.line("E", type(exc).__name__, f"{time.time():.6f}")
        except Exception as exc:
            log.line("X", type(exc).__name__, f"{time.time():.6f}", repr(str(exc)[:200]), _where(exc))
        else:
            ids = ",".join(m.message_id for m in seen) or "-"
            log.line("R", key.session_id, f"{started:.6f}", f"{time.time():.6f}", ids)
        await asyncio.sleep(rng.uniform(0.05, 0.25))


async def run(options: argparse.Namespace) -> None:
    rng = random.Random(options.seed)
    log = Log(options.log)
    keys = [SessionKey(options.tenant, f"s{i}") for i in range(options.sessions)]
    stop = asyncio.Event()  # set by SIGTERM: the run is over, finish the append in hand and exit
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    async with open_store(options.url) as store:
        tasks = [
            writer(store, f"{options.name}w{w}", keys, log, stop, random.Random(rng.random()))
            for w in range(options.writers)
        ]
        tasks += [reader(store, keys, log, stop, random.Random(rng.random())) for _ in range(options.readers)]
        await asyncio.gather(*tasks)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m soak._worker")
    parser.add_argument("--url", required=True)
    parser.add_argument("--name", required=True, help="this process's name, unique per incarnation (p0i2)")
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--log", required=True)
    parser.add_argument("--seed", type=int, default=0)
    asyncio.run(run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
