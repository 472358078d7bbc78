"""``python -m soak [--minutes N] [--backends a,b] [--processes 4] [--writers 8] [--seed S]`` (``nox -s soak``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from chatkeep.core import open_store
from soak._checker import Verdict, check
from soak._targets import TARGETS, Target, clean

MIN_WRITER_AGE = 8.0  # seconds a writer process runs before it may be killed
SESSIONS = 4  # sessions every writer of a backend shares, so appends of many writers interleave in each


class Run:
    """One backend's soak: its worker processes, the faults injected, and the windows they covered."""

    def __init__(self, target: Target, options: argparse.Namespace, rng: random.Random) -> None:
        self.target = target
        self.options = options
        self.rng = rng
        self.tenant = f"soak-{uuid.uuid4().hex[:10]}"
        self.logs = target.workdir / "logs"
        self.logs.mkdir(parents=True)
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.started: dict[int, float] = {}
        self.incarnations: Counter[int] = Counter()
        self.faults: Counter[str] = Counter()
        self.windows: list[tuple[float, float]] = []

    def spawn(self, slot: int) -> None:
        name = f"p{slot}i{self.incarnations[slot]}"
        self.incarnations[slot] += 1
        command = [
            sys.executable, "-m", "soak._worker", "--url", self.target.url, "--name", name, "--tenant", self.tenant,
            "--sessions", str(SESSIONS), "--writers", str(self.options.writers),
            "--log", str(self.logs / f"{name}.log"), "--seed", str(self.rng.randrange(2**31)),
        ]  # fmt: skip
        self.processes[slot] = subprocess.Popen(command, env={**os.environ, **self.target.env})
        self.started[slot] = time.monotonic()

    async def inject_faults(self, until: float) -> None:
        kinds = ["kill-writer", *self.target.faults]
        while time.monotonic() < until:
            await asyncio.sleep(self.rng.uniform(2.0, 6.0))
            if time.monotonic() >= until:
                break
            kind = self.rng.choice(kinds)
            started = time.time()
            if kind == "kill-writer":
                # Only a process that has been writing for a while: killing one still importing tests nothing.
                grown = [s for s, t in self.started.items() if time.monotonic() - t > MIN_WRITER_AGE]
                if not grown:
                    continue
                slot = self.rng.choice(grown)
                self.processes[slot].send_signal(signal.SIGKILL)  # mid-append, wherever it is
                self.processes[slot].wait()
                self.spawn(slot)
            else:
                await self.target.inject(kind, self.rng.uniform(0.5, 3.0))
            self.faults[kind] += 1
            self.windows.append((started, time.time() + 1.0))  # a second after healing still counts as the fault's

    async def run(self) -> Verdict:
        for slot in range(self.options.processes):
            self.spawn(slot)
        await self.inject_faults(time.monotonic() + self.options.minutes * 60)
        for process in self.processes.values():
            process.terminate()  # the writers finish (or give up on) the append in hand, then exit
        for process in self.processes.values():
            try:
                await asyncio.to_thread(process.wait, 90)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        os.environ.update({**self.target.env, **self.target.check_env})
        async with open_store(self.target.check_url) as store:
            return await check(store, self.tenant, SESSIONS, str(self.logs))


def p99(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000:.0f}"


def report(name: str, run: Run, verdict: Verdict) -> list[str]:
    during = [end - start for start, end in verdict.latencies if any(s <= end and start <= e for s, e in run.windows)]
    calm = [end - start for start, end in verdict.latencies if not any(s <= end and start <= e for s, e in run.windows)]
    faults = ", ".join(f"{kind} {count}" for kind, count in sorted(run.faults.items())) or "-"
    return [
        name,
        str(verdict.acknowledged + verdict.reads),
        faults,
        str(verdict.acknowledged),
        str(len(verdict.lost)),
        str(len(verdict.duplicated)),
        str(len(verdict.reordered)),
        str(len(verdict.torn) + len(verdict.vanished)),
        str(sum(verdict.errors.values())),
        str(len(verdict.unexpected)),
        p99(during),
        p99(calm),
    ]


HEADER = ["backend", "operations", "faults injected", "acknowledged", "lost", "duplicated", "reordered",
          "torn/vanished", "retried errors", "unexpected errors", "p99 ms in faults", "p99 ms otherwise"]  # fmt: skip


def table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


async def soak(options: argparse.Namespace) -> int:
    rng = random.Random(options.seed)
    rows: list[list[str]] = []
    failed = False
    for name in options.backends:
        workdir = Path(tempfile.mkdtemp(prefix=f"chatkeep-soak-{name}-"))
        target = TARGETS[name](workdir)
        print(f"soak: {name} for {options.minutes:g} min, {options.processes} processes x {options.writers} writers",
              flush=True)  # fmt: skip
        await target.start()
        try:
            run = Run(target, options, rng)
            verdict = await run.run()
        finally:
            await target.stop()
        rows.append(report(name, run, verdict))
        print(table(rows[-1:]), flush=True)
        for label, found in (("lost", verdict.lost), ("duplicated", verdict.duplicated),
                             ("reordered", verdict.reordered), ("torn", verdict.torn),
                             ("vanished", verdict.vanished), ("unexpected", verdict.unexpected)):  # fmt: skip
            if found:
                print(f"  {label}: {len(found)}, e.g. {found[:5]}", flush=True)
        if verdict.ok:
            clean(workdir)
        else:
            failed = True
            print(f"  logs kept in {workdir}", flush=True)
    print("\n" + table(rows))
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=5.0, help="how long each backend is soaked (default 5)")
    parser.add_argument("--backends", default=",".join(TARGETS), help=f"comma-separated, of {', '.join(TARGETS)}")
    parser.add_argument("--processes", type=int, default=4, help="writer processes per backend (default 4)")
    parser.add_argument("--writers", type=int, default=8, help="writers per process (default 8)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the fault schedule (default: random)")
    options = parser.parse_args(argv)
    options.backends = [b.strip() for b in options.backends.split(",") if b.strip()]
    unknown = [b for b in options.backends if b not in TARGETS]
    if unknown:
        parser.error(f"unknown backend {unknown[0]!r}; choose from {', '.join(TARGETS)}")
    if options.seed is None:
        options.seed = random.randrange(2**31)
    print(f"soak: seed {options.seed} (rerun the same fault schedule with --seed {options.seed})", flush=True)
    return asyncio.run(soak(options))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
