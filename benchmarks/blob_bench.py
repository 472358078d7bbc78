"""chatkeep-blob beside raw azure-storage-blob on Azurite: the agent turn on sessions of 10, 1,000 and 100,000 messages.

Run with ``python -m benchmarks blob [--quick]`` (Azurite from ``scripts/azurite up``, or the account in
``CHATKEEP_BENCH_BLOB_CONNECTION_STRING``). Both paths run in the same process against the same service,
interleaved round by round, each on a container of this run that is deleted at the end.

The turn is what an agent does per run: ``load(last=20)`` then ``append`` of 2 new messages. The raw path is
the fewest SDK calls that do that work on one append blob: one ranged GET of the last 20 records' bytes (it
knows their size, as a real client could not without an index) and one Append Block. It has no
idempotency, no concurrency control, no roll-over, no session index: chatkeep adds a metadata GET (for the
load) and a conditional metadata PUT (for the append) to those two requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import uuid
from typing import Any

from azure.storage.blob.aio import BlobServiceClient

from benchmarks._common import Result, format_table, measure_async, ratio
from chatkeep.blob import BlobHistoryStore, open_store
from chatkeep.core import Message, SessionKey

__all__ = ["main"]

SIZES = (10, 1_000, 100_000)
WINDOW = 20
TEXT = "The quick brown fox jumps over the lazy dog. " * 4  # ~180 characters: a typical short chat message
AZURITE = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
    "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
    "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
)
CHATKEEP = "chatkeep load(last=20) + append 2"
RAW = "raw SDK: ranged GET + Append Block"


def _message(n: int) -> Message:
    return Message(role="user" if n % 2 == 0 else "assistant", text=f"{n}: {TEXT}")


async def _seed(store: BlobHistoryStore, key: SessionKey, raw: Any, size: int) -> None:
    await raw.create_append_blob()
    for start in range(0, size, 1_000):
        batch = [_message(n) for n in range(start, min(size, start + 1_000))]
        await store.append(key, batch)
        await raw.append_block(b"".join(m.to_record().encode() + b"\n" for m in batch))


async def _chatkeep_turn(store: BlobHistoryStore, key: SessionKey) -> None:
    await store.load(key, last=WINDOW)
    await store.append(key, [_message(0), _message(1)])


async def _raw_turn(raw: Any, state: dict[str, int]) -> None:
    # The raw path keeps the blob's size itself (from its last append), so the read needs no HEAD first.
    offset = max(state["size"] - (WINDOW + 1) * state["record"], 0)
    lines = (await (await raw.download_blob(offset=offset)).readall()).split(b"\n")[:-1]
    [json.loads(line) for line in (lines[1:] if offset else lines)[-WINDOW:]]  # a cut first line is dropped
    block = b"".join(m.to_record().encode() + b"\n" for m in (_message(0), _message(1)))
    result = await raw.append_block(block)
    state["size"] = int(result["blob_append_offset"]) + len(block)


async def _turns(conn: str, rounds: int, iterations: int) -> tuple[list[Result], dict[int, int]]:
    container = f"ckbench-{uuid.uuid4().hex[:10]}"
    service = BlobServiceClient.from_connection_string(conn)
    store = open_store(f"azblob://{container}", connection_string=conn)
    results: dict[tuple[str, int], list[Result]] = {}
    bytes_per_turn: dict[int, int] = {}
    try:
        await service.create_container(container)
        for size in SIZES:
            key = SessionKey("bench", f"turn-{size}")
            raw = service.get_blob_client(container, f"raw/{size}")
            await _seed(store, key, raw, size)
            # The blob's size, and the largest record of the turn's two (they alternate in length).
            state = {"size": (await raw.get_blob_properties()).size, "record": len(_message(1).to_record()) + 1}
            before = store.bytes_read
            await _chatkeep_turn(store, key)
            bytes_per_turn[size] = store.bytes_read - before

            async def ours(key: SessionKey = key) -> None:
                await _chatkeep_turn(store, key)

            async def theirs(raw: Any = raw, state: dict[str, int] = state) -> None:
                await _raw_turn(raw, state)

            for _ in range(rounds):
                for result in (
                    await measure_async(CHATKEEP, size, ours, iterations=iterations, warmup=5),
                    await measure_async(RAW, size, theirs, iterations=iterations, warmup=5),
                ):
                    results.setdefault((result.name, size), []).append(result)
    finally:
        await store.close()
        await service.get_container_client(container).delete_container()
        await service.close()
    merged = [Result(parts[0].name, parts[0].size, [s for r in parts for s in r.samples]) for parts in results.values()]
    return merged, bytes_per_turn


def main(argv: list[str]) -> int:
    """Run the blob benchmark and print Markdown tables (synchronous: it runs its own event loop)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks blob", description=__doc__.splitlines()[0])
    parser.add_argument("--connection-string", default=os.environ.get("CHATKEEP_BENCH_BLOB_CONNECTION_STRING", AZURITE))
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run, noisy numbers)")
    args = parser.parse_args(argv)
    rounds, iterations = (2, 40) if args.quick else (5, 100)
    turns, downloaded = asyncio.run(_turns(args.connection_string, rounds, iterations))

    def raw_of(row: Result) -> Result:
        return next(r for r in turns if r.name == RAW and r.size == row.size)

    print(format_table("The turn: load(last=20) + append 2 messages (Azurite)", turns, raw_of))
    print()
    print("### Targets")
    print()
    ours = {r.size: r for r in turns if r.name == CHATKEEP}
    for size, result in ours.items():
        print(f"- turn at {size:,}: {ratio(result, raw_of(result)):.2f}x the raw SDK path; "
              f"segment bytes downloaded by one turn: {downloaded[size]:,}")  # fmt: skip
    growth = ours[SIZES[-1]].p50 / ours[SIZES[0]].p50
    verdict = "met" if growth <= 1.2 else "missed"
    print(f"- p50 at {SIZES[-1]:,} / p50 at {SIZES[0]:,}: {growth:.2f}x (target 1.2x): {verdict}")
    return 0
