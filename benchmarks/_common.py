"""Timing and reporting shared by the benchmarks: the same clock, statistics and table for every backend."""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, cast

__all__ = [
    "RECORDED",
    "Result",
    "adapter_targets",
    "format_table",
    "interleaved_rounds",
    "measure",
    "measure_async",
    "measure_pairs",
    "measure_turn",
    "own_schema",
    "pair_arguments",
    "ratio",
    "round_robin",
    "speedup",
    "speedup_table",
    "times",
    "versus_frameworks",
]

T = TypeVar("T")

#: Every row of every table printed in this run, as ``(table title, result, p50 ratio to the row's baseline)``,
#: for ``python -m benchmarks --chart FILE`` (the chart is drawn from what the tables say, never measured again).
RECORDED: list[tuple[str, Result, float]] = []


@dataclass
class Result:
    """Latencies of one benchmarked path (seconds per operation)."""

    name: str
    size: int
    samples: list[float]

    @property
    def p50(self) -> float:
        return statistics.median(self.samples)

    @property
    def p99(self) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]

    @property
    def per_second(self) -> float:
        return len(self.samples) / sum(self.samples)


def measure(name: str, size: int, operation: Callable[[], object], *, iterations: int, warmup: int = 20) -> Result:
    """Time a synchronous operation ``iterations`` times after ``warmup`` untimed runs."""
    for _ in range(warmup):
        operation()
    gc.collect()
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        operation()
        samples.append(time.perf_counter() - start)
    return Result(name, size, samples)


async def measure_async(
    name: str, size: int, operation: Callable[[], Awaitable[object]], *, iterations: int, warmup: int = 20
) -> Result:
    """Time an async operation ``iterations`` times after ``warmup`` untimed runs, on the running loop."""
    for _ in range(warmup):
        await operation()
    gc.collect()
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        await operation()
        samples.append(time.perf_counter() - start)
    await asyncio.sleep(0)
    return Result(name, size, samples)


def ratio(result: Result, baseline: Result) -> float:
    """How many times slower ``result`` is than ``baseline`` at p50 (1.0 = as fast)."""
    return result.p50 / baseline.p50


def speedup(result: Result, baseline: Result) -> float:
    """How many times faster ``result`` is than ``baseline`` at p50 (above 1: faster), as the adapter tables say."""
    return baseline.p50 / result.p50


def times(value: float) -> str:
    """A ratio as the tables print it: two decimals, or two significant digits below 0.1 (``0.0021x``, not 0.00x)."""
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.2g}x"


def speedup_table(
    title: str, results: list[Result], baselines: Sequence[tuple[str, Callable[[Result], Result | None]]]
) -> str:
    """A Markdown table of an adapter benchmark: p50/p99 in ms, turns per second, and a speed-up column per baseline.

    Each baseline is a heading (``speed-up vs {heading}``) and the row it compares a row with (``None`` leaves the
    cell empty). The first baseline is the one the chart records.
    """
    heads = "".join(f" speed-up vs {heading} |" for heading, _ in baselines)
    lines = [
        f"### {title}",
        "",
        f"| path | messages in session | p50 ms | p99 ms | turns/s |{heads}",
        "|---|---:|---:|---:|---:|" + "---:|" * len(baselines),
    ]
    for result in results:
        cells = []
        for n, (_, find) in enumerate(baselines):
            base = find(result)
            if base is not None and n == 0:
                RECORDED.append((title, result, ratio(result, base)))
            cells.append(f" {times(speedup(result, base))} |" if base is not None else " |")
        lines.append(
            f"| {result.name} | {result.size:,} | {result.p50 * 1e3:.3f} | {result.p99 * 1e3:.3f} | "
            f"{result.per_second:,.0f} |{''.join(cells)}"
        )
    return "\n".join(lines)


# Issue 11's targets for a framework adapter: at least 3x faster than the framework's own store at the largest
# history, and no slower at the smallest.
INTEROP_TARGETS = {"largest": 3.0, "smallest": 1.0}


def target_line(label: str, size: int, speedup: float, which: str) -> str:
    """One line of an adapter benchmark's targets: ``speedup`` (framework p50 / adapter p50) against its target."""
    target = INTEROP_TARGETS[which]
    verdict = "met" if round(speedup, 2) >= target else "missed"  # judged at the precision printed
    return f"- {label} at {size:,}: {speedup:.2f}x faster (target {target:g}x): {verdict}"


def versus_frameworks(title: str, results: list[Result], adapter: str) -> str:
    """An adapter benchmark's table for one backend: every row against each framework store's row of its size.

    The framework stores are the rows whose name does not start with ``adapter`` (the adapter's rows, sync and
    async, all do).
    """

    def against(name: str) -> Callable[[Result], Result | None]:
        return lambda row: next((r for r in results if r.name == name and r.size == row.size), None)

    frameworks = sorted({r.name for r in results if not r.name.startswith(adapter)})
    return speedup_table(title, results, [(name, against(name)) for name in frameworks])


def adapter_targets(backend: str, results: list[Result], adapter: str, sizes: Sequence[int]) -> list[str]:
    """The target lines of one backend: the ``adapter`` row against each framework store at the smallest and
    largest of ``sizes``."""
    lines = []
    ours = {r.size: r for r in results if r.name == adapter}
    for base in (r for r in results if not r.name.startswith(adapter)):
        which = {sizes[-1]: "largest", sizes[0]: "smallest"}.get(base.size)
        if which is not None:
            lines.append(
                target_line(f"{backend}, against {base.name},", base.size, speedup(ours[base.size], base), which)
            )
    return lines


def round_robin(items: Sequence[T]) -> Iterator[T]:
    """``items`` over and over: the sessions a benchmark's timed turns go round."""
    while True:
        yield from items


def measure_turn(
    name: str, size: int, turn: Callable[[T], object], turns: Iterator[T], *, iterations: int, warmup: int
) -> Result:
    """Time ``turn`` on the next of ``turns`` each time; an async ``turn`` runs on a loop of its own."""
    if asyncio.iscoroutinefunction(turn):

        async def run() -> Result:
            coroutine_turn = cast(Callable[[T], Awaitable[object]], turn)
            return await measure_async(
                name, size, lambda: coroutine_turn(next(turns)), iterations=iterations, warmup=warmup
            )

        return asyncio.run(run())
    return measure(name, size, lambda: turn(next(turns)), iterations=iterations, warmup=warmup)


def interleaved_rounds(
    rows: Sequence[tuple[str, Callable[[T], object], Iterator[T]]],
    size: int,
    *,
    rounds: int,
    iterations: int,
    warmup: int,
) -> list[Result]:
    """Time each row's turn (``(name, turn, the sessions it goes round)``) ``rounds`` times, interleaved round by
    round so a busy machine slows them alike; one result per row with every round's samples."""
    merged: dict[str, Result] = {}
    for _ in range(rounds):
        for name, turn, turns in rows:
            result = measure_turn(name, size, turn, turns, iterations=iterations, warmup=warmup)
            merged.setdefault(name, Result(name, size, [])).samples.extend(result.samples)
    return list(merged.values())


def format_table(
    title: str,
    results: list[Result],
    baseline: Callable[[Result], Result],
    *,
    also: tuple[str, Callable[[Result], Result | None]] | None = None,
    versus: str = "fastest raw",
) -> str:
    """A Markdown table: p50/p99 in ms, operations per second, and the p50 ratio to the baseline of each row's size.

    ``versus`` names the baseline in the ratio column's heading. ``also`` adds a column: its heading and a second
    baseline per row (``None`` leaves the cell empty).
    """
    extra_head, extra_rule = (f" p50 vs {also[0]} |", "---:|") if also else ("", "")
    lines = [
        f"### {title}",
        "",
        f"| path | messages in session | p50 ms | p99 ms | ops/s | p50 vs {versus} |{extra_head}",
        f"|---|---:|---:|---:|---:|---:|{extra_rule}",
    ]
    for result in results:
        base = baseline(result)
        RECORDED.append((title, result, ratio(result, base)))
        line = (
            f"| {result.name} | {result.size:,} | {result.p50 * 1e3:.3f} | {result.p99 * 1e3:.3f} | "
            f"{result.per_second:,.0f} | {ratio(result, base):.2f}x |"
        )
        if also:
            other = also[1](result)
            line += f" {ratio(result, other):.2f}x |" if other is not None else " |"
        lines.append(line)
    return "\n".join(lines)


_PairT = TypeVar("_PairT", bound=Any)  # a benchmark's pair: its ``family`` names it, ``close()`` ends it
_RowsT = TypeVar("_RowsT")


def pair_arguments(prog: str, description: str, pairs: Sequence[str], argv: list[str]) -> tuple[list[str], bool]:
    """The backends ``--only`` chose (all of ``pairs`` by default) and ``--quick``, of a pair benchmark's command."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run, noisy numbers)")
    parser.add_argument("--only", default=",".join(pairs), help=f"comma-separated: {', '.join(pairs)}")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(pairs))
    if unknown:
        parser.error(f"--only names no backend {unknown}; choose from {', '.join(pairs)}")
    return chosen, bool(args.quick)


async def measure_pairs(
    pairs: dict[str, Callable[[], AbstractAsyncContextManager[_PairT]]],
    chosen: Sequence[str],
    measure: Callable[[_PairT], Awaitable[_RowsT]],
) -> dict[str, _RowsT]:
    """Each chosen backend's rows (its pair's ``family`` -> ``measure(pair)``), the pair closed after it."""
    results = {}
    for name in chosen:
        async with pairs[name]() as pair:
            try:
                results[pair.family] = await measure(pair)
            finally:
                await pair.close()
    return results


@asynccontextmanager
async def own_schema(url: str, prefix: str) -> AsyncIterator[tuple[str, str]]:
    """A PostgreSQL schema of this run's own on ``url``'s server, dropped afterwards: ``(schema, asyncpg dsn)``."""
    import asyncpg  # type: ignore[import-untyped]

    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    dsn = url.replace("postgresql+asyncpg://", "postgresql://", 1)
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(f'CREATE SCHEMA "{schema}"')
        yield schema, dsn
    finally:
        await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await admin.close()


async def analyze_schema(dsn: str, schema: str) -> None:
    """``ANALYZE`` every table of a PostgreSQL schema a benchmark made, after seeding and before timing.

    The tables are new, so PostgreSQL has no statistics of them yet, and the plans its connections cached while
    they were empty would stay until autovacuum analyzes them (within a minute or so, in a long-running
    service). Analyzing them first times every store in that steady state.
    """
    import asyncpg  # type: ignore[import-untyped]

    connection = await asyncpg.connect(dsn)
    try:
        for (table,) in await connection.fetch("SELECT tablename FROM pg_tables WHERE schemaname = $1", schema):
            await connection.execute(f'ANALYZE "{schema}"."{table}"')
    finally:
        await connection.close()
