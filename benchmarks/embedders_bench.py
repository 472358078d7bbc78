"""The offline embedders side by side: ``MiniLMEmbedder`` (the default) and ``WordLlamaEmbedder``.

Run with ``python -m benchmarks embedders [--iterations N]``; it needs no server, only the extras
``chatkeep-core[recall]`` and ``chatkeep-core[wordllama]``. The texts are the 640 chat messages of the testing
kit's recall set (:mod:`chatkeep.testing.recall`). Each embedder is timed embedding one message (what an agent's
turn embeds) and a batch of 64 (what ``reindex`` or an import embeds at a time), through its public async
``embed``, so the worker thread's hand-off is counted. The baseline is WordLlama, the fast static model MiniLM
replaced as the default; the load time (first use in the process) is printed apart. docs/recall.md keeps what
it printed.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Awaitable, Callable

from benchmarks._common import Result, format_table, measure_async
from chatkeep.core import Embedder, MiniLMEmbedder, WordLlamaEmbedder
from chatkeep.testing.recall import load_recall_set

__all__ = ["main"]

_BATCH = 64


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks embedders")
    parser.add_argument("--iterations", type=int, default=60)
    args = parser.parse_args(argv)
    texts = [message.text for message in load_recall_set().messages]
    results: list[Result] = []
    loads: list[str] = []
    embedders: list[WordLlamaEmbedder | MiniLMEmbedder] = [WordLlamaEmbedder(), MiniLMEmbedder()]
    for embedder in embedders:
        began = time.perf_counter()
        type(embedder).load()
        loads.append(f"- {embedder.name}: loaded in {time.perf_counter() - began:.2f} s")
        results.append(
            await measure_async(embedder.name, 1, _one_by_one(embedder, texts), iterations=args.iterations * 4)
        )
        results.append(
            await measure_async(
                embedder.name, _BATCH, _in_batches(embedder, texts), iterations=args.iterations, warmup=3
            )
        )
    baseline = {result.size: result for result in results if result.name == embedders[0].name}
    print(
        format_table(
            "Offline embedders: texts embedded per call (size column), one call per sample",
            results,
            lambda result: baseline[result.size],
            versus="WordLlama",
        )
    )
    print("\n".join(loads))
    for result in results:
        print(f"- {result.name}, {result.size} per call: {result.size / result.p50:,.0f} messages/s at p50")
    return 0


def _one_by_one(embedder: Embedder, texts: list[str]) -> Callable[[], Awaitable[list[list[float]]]]:
    """Each call embeds the next message alone."""
    turn = itertools.count()
    return lambda: embedder.embed([texts[next(turn) % len(texts)]])


def _in_batches(embedder: Embedder, texts: list[str]) -> Callable[[], Awaitable[list[list[float]]]]:
    """Each call embeds the next :data:`_BATCH` messages."""
    batch = itertools.count()

    def embed_next() -> Awaitable[list[list[float]]]:
        start = (next(batch) * _BATCH) % len(texts)
        return embedder.embed((texts[start:] + texts[:start])[:_BATCH])

    return embed_next
