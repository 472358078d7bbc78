"""LlamaIndex's own chat stores beside ChatkeepChatStore, on the same backends, in one run.

Run with ``python -m benchmarks interop-llama-index [--quick]`` after installing the pins of
``INTEROP["llama-index"]`` in noxfile.py (``nox -s "interop_bench(framework='llama-index')"``).

The turn is the standard one: read the newest 20 messages, then ``add_message`` twice (the question and the
answer, as a memory's ``put`` does). LlamaIndex's chat stores have no window, so their turn is
``get_messages(key)[-20:]``: the whole history is read, that is their cost. ``ChatkeepChatStore`` reads
``get_messages(key, last=20)``; its "whole history" row reads everything as LlamaIndex's ``ChatMemoryBuffer``
does (its token window is computed over the full list, so a memory class does not ask for a window).

Stores compared, each with the chatkeep store on the same backend:

* Redis: ``llama-index-storage-chat-store-redis``'s ``RedisChatStore`` (a list: ``RPUSH`` per message,
  ``LRANGE 0 -1``), sync and async methods, vs ``ChatkeepChatStore("redis://...")``.
* A file: ``SimpleChatStore`` (a dict in memory) made durable with ``persist()`` after each turn, one file per
  session, vs ``ChatkeepChatStore("sqlite:///...")``.
* In memory, for reference: ``SimpleChatStore`` without persisting vs ``ChatkeepChatStore("memory://")``.

The memory turn is what a chat engine does per turn: ``put`` the question, ``get()`` the history, ``put`` the
answer, with LlamaIndex's default token limit (3,000): LlamaIndex's ``ChatMemoryBuffer`` on ``RedisChatStore``
beside ``ChatkeepChatMemoryBuffer`` (``max_messages=100``) on Redis. Both return the same messages (the newest
that fit 3,000 tokens, about 70 here). ``ChatMemoryBuffer.get`` counts the tokens again after each message it
drops, so its turn grows with the square of the history: a few turns at 1,000 (seconds each), none at 10,000
(minutes each).

Timed turns go round several sessions so a session grows by at most a fifth of its size (or 4 messages) while
it is measured, and the paths are interleaved in many short rounds so a busy machine slows them alike. A path
that reads the whole history runs 30 turns at 10,000 messages (seconds each), the others 300.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from itertools import cycle
from pathlib import Path

import redis
from llama_index.core.llms import ChatMessage
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.core.storage.chat_store import SimpleChatStore
from llama_index.storage.chat_store.redis import RedisChatStore

from benchmarks._common import Result, measure, measure_async, speedup, speedup_table, target_line, times
from chatkeep.interop.llama_index import ChatkeepChatMemoryBuffer, ChatkeepChatStore

__all__ = ["main"]

SIZES = (10, 1_000, 10_000)
MAX_MESSAGES = 100  # the windowed memory's window: more than the ~70 messages LlamaIndex's 3,000 tokens hold here
MEMORY_BUFFER = "ChatMemoryBuffer on RedisChatStore (put, get(), put)"
WINDOWED_MEMORY = "ChatkeepChatMemoryBuffer redis:// (put, get(), put; max_messages=100)"
WINDOW = 20
TEXT = "The quick brown fox jumps over the lazy dog. " * 4  # ~180 characters: a typical short chat message
PAIR = [ChatMessage(role="user", content=f"next question: {TEXT}"), ChatMessage(role="assistant", content=TEXT)]
REDIS_URL = os.environ.get("CHATKEEP_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def _history(size: int) -> list[ChatMessage]:
    return [ChatMessage(role="user" if n % 2 == 0 else "assistant", content=f"{n}: {TEXT}") for n in range(size)]


def _sessions(size: int, turns: int) -> int:
    """How many sessions keep each one's growth within a fifth of its size while ``turns`` turns run."""
    return max(1, math.ceil(2 * turns / max(size // 5, 4)))


@dataclass
class Contender:
    """One benchmarked path: its name, its comparison group (a backend), and its turn (sync or async)."""

    name: str
    group: str
    turn: Callable[[], object] | None = None
    aturn: Callable[[], Awaitable[object]] | None = None
    reads_all: bool = False  # its turn reads (and decodes) the whole history
    quadratic: bool = False  # ChatMemoryBuffer: seconds per turn at 1,000, minutes at 10,000


def _framework_turn(
    store: object, keys: cycle[str], persist: Callable[[str], None] | None = None
) -> Callable[[], None]:
    def turn() -> None:
        key = next(keys)
        store.get_messages(key)[-WINDOW:]  # type: ignore[attr-defined]
        for message in PAIR:
            store.add_message(key, message)  # type: ignore[attr-defined]
        if persist is not None:
            persist(key)

    return turn


def _adapter_turn(store: ChatkeepChatStore, keys: cycle[str], *, last: int | None) -> Callable[[], None]:
    def turn() -> None:
        key = next(keys)
        store.get_messages(key, last=last)
        for message in PAIR:
            store.add_message(key, message)

    return turn


def _framework_aturn(store: RedisChatStore, keys: cycle[str]) -> Callable[[], Awaitable[None]]:
    async def turn() -> None:
        key = next(keys)
        (await store.aget_messages(key))[-WINDOW:]
        for message in PAIR:
            await store.async_add_message(key, message)

    return turn


def _adapter_aturn(store: ChatkeepChatStore, keys: cycle[str]) -> Callable[[], Awaitable[None]]:
    async def turn() -> None:
        key = next(keys)
        await store.aget_messages(key, last=WINDOW)
        for message in PAIR:
            await store.async_add_message(key, message)

    return turn


def _memory_turn(memories: cycle[ChatMemoryBuffer]) -> Callable[[], None]:
    def turn() -> None:
        memory = next(memories)
        memory.put(PAIR[0])
        memory.get()
        memory.put(PAIR[1])

    return turn


class _FilePerSession:
    """One SimpleChatStore per session, each persisted to its own file (one shared file would rewrite them all)."""

    def __init__(self, folder: Path, keys: list[str], history: list[ChatMessage]) -> None:
        self.folder = folder
        self.stores = {key: SimpleChatStore(store={key: list(history)}) for key in keys}
        for key in keys:
            self.persist(key)

    def persist(self, key: str) -> None:
        # What SimpleChatStore.persist() writes (the store as JSON), which fails in this llama-index-core with
        # this pydantic: its ChatMessage serializer calls pydantic's handler with an argument newer ones refuse.
        document = {"store": {key: [m.model_dump(mode="json") for m in self.stores[key].get_messages(key)]}}
        (self.folder / f"{key}.json").write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")

    def get_messages(self, key: str) -> list[ChatMessage]:
        return self.stores[key].get_messages(key)

    def add_message(self, key: str, message: ChatMessage) -> None:
        self.stores[key].add_message(key, message)


async def _run(args: argparse.Namespace, folder: Path) -> tuple[list[Result], dict[str, str]]:
    # Many short rounds: on a busy machine the load drifts within seconds, and every path should see the same drift.
    rounds, iterations = (4, 60) if args.quick else (30, 300)
    warmup = rounds
    prefix = f"libench-{uuid.uuid4().hex[:8]}"
    raw = redis.Redis.from_url(REDIS_URL)
    theirs_redis = RedisChatStore(redis_url=REDIS_URL)
    ours = {
        "redis": ChatkeepChatStore(REDIS_URL, tenant=prefix),
        "sqlite": ChatkeepChatStore(f"sqlite:///{folder}/chat.db", tenant=prefix),
        "memory": ChatkeepChatStore("memory://", tenant=prefix),
    }
    results: dict[tuple[str, int], Result] = {}
    try:
        for size in SIZES:
            history = _history(size)
            count = _sessions(size, 2 * (iterations + warmup))  # the sync and the async turns share the sessions
            keys = [f"{prefix}-{size}-{n}" for n in range(count)]
            pipe = raw.pipeline(transaction=False)
            for key in keys:
                pipe.rpush(key, *[m.model_dump_json() for m in history])
            pipe.execute()
            for store in ours.values():
                for key in keys:
                    store.set_messages(key, history)
            simple_memory = SimpleChatStore(store={key: list(history) for key in keys})
            files = _FilePerSession(folder, keys, history)
            paths = [
                Contender(
                    "RedisChatStore (get_messages, newest 20)",
                    "redis",
                    _framework_turn(theirs_redis, cycle(keys)),
                    reads_all=True,
                ),
                Contender(
                    "ChatkeepChatStore redis:// (last=20)",
                    "redis",
                    _adapter_turn(ours["redis"], cycle(keys), last=WINDOW),
                ),
                Contender(
                    "ChatkeepChatStore redis:// (whole history)",
                    "redis",
                    _adapter_turn(ours["redis"], cycle(keys), last=None),
                    reads_all=True,
                ),
                Contender(
                    "RedisChatStore, async methods",
                    "redis-async",
                    aturn=_framework_aturn(theirs_redis, cycle(keys)),
                    reads_all=True,
                ),
                Contender(
                    "ChatkeepChatStore redis://, async methods",
                    "redis-async",
                    aturn=_adapter_aturn(ours["redis"], cycle(keys)),
                ),
                Contender(
                    "SimpleChatStore + persist() per turn (file per session)",
                    "file",
                    _framework_turn(files, cycle(keys), files.persist),
                    reads_all=True,
                ),
                Contender(
                    "ChatkeepChatStore sqlite file (last=20)",
                    "file",
                    _adapter_turn(ours["sqlite"], cycle(keys), last=WINDOW),
                ),
                Contender(
                    "ChatkeepChatStore sqlite file (whole history)",
                    "file",
                    _adapter_turn(ours["sqlite"], cycle(keys), last=None),
                    reads_all=True,
                ),
                Contender(
                    "SimpleChatStore in memory (not durable)", "memory", _framework_turn(simple_memory, cycle(keys))
                ),
                Contender(
                    "ChatkeepChatStore memory:// (last=20)",
                    "memory",
                    _adapter_turn(ours["memory"], cycle(keys), last=WINDOW),
                ),
                Contender(
                    MEMORY_BUFFER,
                    "memory-redis",
                    _memory_turn(
                        cycle([ChatMemoryBuffer.from_defaults(chat_store=theirs_redis, chat_store_key=k) for k in keys])
                    ),
                    reads_all=True,
                    quadratic=True,
                ),
                Contender(
                    WINDOWED_MEMORY,
                    "memory-redis",
                    _memory_turn(
                        cycle(
                            [
                                ChatkeepChatMemoryBuffer.from_defaults(
                                    chat_store=ours["redis"], chat_store_key=k, max_messages=MAX_MESSAGES
                                )
                                for k in keys
                            ]
                        )
                    ),
                ),
            ]
            if size < 10_000:  # ChatMemoryBuffer.get takes minutes at 10,000
                _same_window(keys[0], ours["redis"], theirs_redis)
            for _ in range(rounds):
                for path in paths:
                    # A path that reads the whole history takes seconds per turn at 10,000: fewer turns of it.
                    turns = iterations // rounds if size < 10_000 or not path.reads_all else max(1, 30 // rounds)
                    warm = max(1, warmup // rounds)
                    if path.quadratic:  # ChatMemoryBuffer: one turn per round at 1,000, none at 10,000
                        if size >= 10_000:
                            continue
                        turns, warm = (turns, warm) if size < 1_000 else (1, 0)
                    if path.turn is not None:
                        part = measure(path.name, size, path.turn, iterations=turns, warmup=warm)
                    else:
                        assert path.aturn is not None
                        part = await measure_async(path.name, size, path.aturn, iterations=turns, warmup=warm)
                    results.setdefault((path.name, size), Result(path.name, size, [])).samples.extend(part.samples)
            raw.delete(*keys)
            for store in ours.values():
                for key in keys:
                    store.delete_messages(key)
    finally:
        for store in ours.values():
            store.close()
        raw.close()
    return list(results.values()), {path.name: path.group for path in paths}


def _same_window(key: str, ours: ChatkeepChatStore, theirs: RedisChatStore) -> None:
    """Check the two memories return the same messages for one session (else the comparison is not fair)."""
    theirs_got = ChatMemoryBuffer.from_defaults(chat_store=theirs, chat_store_key=key).get()
    ours_got = ChatkeepChatMemoryBuffer.from_defaults(
        chat_store=ours, chat_store_key=key, max_messages=MAX_MESSAGES
    ).get()
    if [m.content for m in theirs_got] != [m.content for m in ours_got]:
        raise SystemExit(f"the memories disagree on {key}: {len(theirs_got)} vs {len(ours_got)} messages")


def _baseline(results: list[Result], groups: dict[str, str]) -> Callable[[Result], Result]:
    """Each row against LlamaIndex's own store of its group at its size (the first path of the group)."""

    def baseline(row: Result) -> Result:
        return next(r for r in results if groups[r.name] == groups[row.name] and r.size == row.size)

    return baseline


def _memory_table(results: list[Result]) -> list[str]:
    """The memory turn's rows, against ChatMemoryBuffer at the same size where it ran."""
    theirs = {r.size: r for r in results if r.name == MEMORY_BUFFER}
    lines = [
        "### The memory turn: put, get(), put",
        "",
        "| path | messages in session | p50 ms | p99 ms | turns | speed-up vs ChatMemoryBuffer on RedisChatStore |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for size in SIZES:
        for row in (theirs.get(size), next(r for r in results if r.name == WINDOWED_MEMORY and r.size == size)):
            if row is None:
                lines.append(f"| {MEMORY_BUFFER} | {size:,} | not run: minutes per turn | | | |")
                continue
            versus = times(speedup(row, theirs[size])) if size in theirs else "n/a"
            lines.append(
                f"| {row.name} | {size:,} | {row.p50 * 1e3:.3f} | {row.p99 * 1e3:.3f} | {len(row.samples)} | {versus} |"
            )
    return lines


def _report(results: list[Result], groups: dict[str, str]) -> str:
    memory = {MEMORY_BUFFER, WINDOWED_MEMORY}
    results, memory_rows = [r for r in results if r.name not in memory], [r for r in results if r.name in memory]
    base = _baseline(results, groups)
    table = speedup_table("The turn: newest 20 + add_message x2", results, [("LlamaIndex's store", base)])
    lines = [table, "", "### Targets (adapter vs LlamaIndex's own store on the same backend)", ""]
    for name in (
        "ChatkeepChatStore redis:// (last=20)",
        "ChatkeepChatStore redis://, async methods",
        "ChatkeepChatStore sqlite file (last=20)",
    ):
        rows = {r.size: r for r in results if r.name == name}
        for size, which in ((SIZES[-1], "largest"), (SIZES[0], "smallest")):
            lines.append(target_line(name, size, speedup(rows[size], base(rows[size])), which))
    return "\n".join([*lines, "", *_memory_table(memory_rows)])


def main(argv: list[str]) -> int:
    """Run the LlamaIndex chat-store benchmark and print a Markdown table."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks interop-llama-index", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run, noisy numbers)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="libench-") as folder:
        results, groups = asyncio.run(_run(args, Path(folder)))
    print(_report(results, groups))
    return 0
