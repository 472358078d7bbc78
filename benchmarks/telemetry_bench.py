"""What OpenTelemetry costs a store call, on memory (where it weighs most) and a SQLite file, measured in one run.

The operation is a turn, what an agent does per user message: ``load(key, last=20)`` then ``append`` of two
messages, on a session of 10 and of 1,000 messages. Paths:

* ``uninstrumented``: the same two calls without the telemetry wrapper (``HistoryStore.load.__wrapped__``), the
  baseline;
* ``tracing off``: the calls as shipped, with no OpenTelemetry SDK configured (the API's no-op tracer and meter:
  what every application that configures nothing pays);
* ``tracing on``: an SDK tracer provider exporting every span to memory (``SimpleSpanProcessor``) and an SDK
  meter provider recording the duration histogram (``InMemoryMetricReader``).

The SDK cannot be installed and removed in one process, so the ``tracing on`` path swaps chatkeep's tracer and
instruments for ones of a private SDK provider while it runs. Every path runs once per round, in a rotating
order; the table reports each path's median and 99th percentile and its p50 ratio to ``uninstrumented``.
Run with ``python -m benchmarks telemetry [--rounds N] [--iterations N] [--only memory,sqlite]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from benchmarks._common import Result, format_table
from chatkeep.core import HistoryStore, Message, SessionKey, open_store
from chatkeep.core import _telemetry as telemetry

__all__ = ["main"]

SIZES = (10, 1_000)
WINDOW = 20
TEXT = "The quick brown fox jumps over the lazy dog. " * 4
BARE, OFF, ON = "uninstrumented", "tracing off (no SDK)", "tracing on (SDK, in-memory export)"
PATHS = (BARE, OFF, ON)

Turn = Callable[[HistoryStore, SessionKey, list[Message]], Awaitable[Any]]


async def _bare_turn(store: HistoryStore, key: SessionKey, pair: list[Message]) -> None:
    await HistoryStore.load.__wrapped__(store, key, last=WINDOW)  # type: ignore[attr-defined]
    await HistoryStore.append.__wrapped__(store, key, pair)  # type: ignore[attr-defined]


async def _turn(store: HistoryStore, key: SessionKey, pair: list[Message]) -> None:
    await store.load(key, last=WINDOW)
    await store.append(key, pair)


class _Sdk:
    """A private SDK tracer and meter provider, swapped into chatkeep's telemetry module while ``on()`` lasts."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        meter = MeterProvider(metric_readers=[self.reader]).get_meter("chatkeep")
        self.swapped = {
            "_tracer": tracer_provider.get_tracer("chatkeep"),
            "_duration": meter.create_histogram("db.client.operation.duration", unit="s"),
            "_retries": meter.create_counter("chatkeep.client.operation.retries"),
        }

    @contextlib.contextmanager
    def on(self) -> Iterator[None]:
        kept = {name: getattr(telemetry, name) for name in self.swapped}
        for name, value in self.swapped.items():
            setattr(telemetry, name, value)
        try:
            yield
        finally:
            for name, value in kept.items():
                setattr(telemetry, name, value)
            self.spans.clear()


async def _timed(turn: Turn, store: HistoryStore, key: SessionKey, iterations: int) -> list[float]:
    pairs = [
        [Message(role="user", text=f"question: {TEXT}"), Message(role="assistant", text=f"answer: {TEXT}")]
        for _ in range(iterations)
    ]
    samples = []
    for pair in pairs:
        start = time.perf_counter()
        await turn(store, key, pair)
        samples.append(time.perf_counter() - start)
    return samples


async def _run(url: str, rounds: int, iterations: int) -> list[Result]:
    sdk = _Sdk()
    samples: dict[tuple[str, int], list[float]] = defaultdict(list)
    async with open_store(url) as store:
        keys = {(path, size): SessionKey("telemetrybench", f"{path}-{size}") for path in PATHS for size in SIZES}
        for (_, size), key in keys.items():
            for start in range(0, size, 500):
                batch = range(start, min(size, start + 500))
                await store.append(key, [Message(role="user", text=f"{n}: {TEXT}") for n in batch])
        for n in range(rounds):
            for size in SIZES:
                for path in PATHS[n % len(PATHS) :] + PATHS[: n % len(PATHS)]:
                    key = keys[path, size]
                    if path == ON:
                        with sdk.on():
                            samples[path, size] += await _timed(_turn, store, key, iterations)
                    else:
                        samples[path, size] += await _timed(
                            _bare_turn if path == BARE else _turn, store, key, iterations
                        )
    return [Result(path, size, samples[path, size]) for size in SIZES for path in PATHS]


def _bare_of(results: list[Result]) -> Callable[[Result], Result]:
    """Each row's baseline: the uninstrumented row of the same size."""
    baselines = {result.size: result for result in results if result.name == BARE}
    return lambda result: baselines[result.size]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks telemetry")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--iterations", type=int, default=300, help="turns per path per round")
    parser.add_argument("--only", default="memory,sqlite", help="comma-separated: memory,sqlite")
    args = parser.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="chatkeep-telemetrybench-")
    urls = {
        "memory": ("memory", f"memory://telemetrybench-{uuid.uuid4().hex[:8]}"),
        "sqlite": ("SQLite file", f"sqlite:///{folder}/bench.db"),
    }
    try:
        for name in args.only.split(","):
            label, url = urls[name.strip()]
            results = asyncio.run(_run(url, args.rounds, args.iterations))
            title = f"OpenTelemetry cost per load last {WINDOW} + append 2, {label}"
            print(format_table(title, results, _bare_of(results), versus="uninstrumented"))
            print()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0
