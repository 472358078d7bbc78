"""ChatkeepConversationStore beside Pydantic AI's own InMemoryConversationStore, and on each chatkeep backend.

Run with ``python -m benchmarks interop-pydantic-ai [--quick]``, in a venv with the pins of
``nox -s "interop_bench(framework='pydantic-ai')"``.

Pydantic AI ships one conversation store, ``InMemoryConversationStore`` (in process, for tests and examples):
it is the baseline, beside the adapter on ``memory://`` (the same place) and on SQLite, PostgreSQL and Redis
(where Pydantic AI has nothing to compare). The turn is what an app does around ``agent.run``: ``load`` the
conversation, add a request and a response, ``save`` it. Two loads: the whole history (``load(id)``, what
Pydantic AI's docs show) and the newest 20 messages (``load(id, limit=20)``, for a run that needs only the
recent turns). Each timed turn meets a conversation of exactly the stated size: it is deleted and stored again
between turns (untimed).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import time
import uuid

from pydantic_ai.conversation import Conversation
from pydantic_ai.conversation_store import ConversationStore, InMemoryConversationStore
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from benchmarks._common import Result, speedup, speedup_table, target_line
from chatkeep.interop.pydantic_ai import ChatkeepConversationStore

__all__ = ["main"]

SIZES = (10, 1_000, 10_000)
WINDOW = 20
TEXT = "The quick brown fox jumps over the lazy dog. " * 4  # ~180 characters: a typical short chat message
TITLE = "Pydantic AI: one turn (load, add a request and a response, save)"
BASELINE = "pydantic-ai InMemoryConversationStore"


def _messages(start: int, count: int) -> list[ModelMessage]:
    out: list[ModelMessage] = []
    for n in range(start, start + count):
        if n % 2 == 0:
            out.append(ModelRequest(parts=[UserPromptPart(content=f"{n}: {TEXT}")]))
        else:
            out.append(ModelResponse(parts=[TextPart(f"{n}: {TEXT}")]))
    return out


class _Path:
    def __init__(self, name: str, store: ConversationStore, limit: int | None) -> None:
        self.name, self.store, self.limit = name, store, limit

    async def seed(self, cid: str, size: int) -> None:
        await self.store.save(Conversation(conversation_id=cid, messages=_messages(0, size)))

    async def turn(self, cid: str, n: int) -> None:
        conversation = await self.store.load(cid, limit=self.limit)
        assert conversation is not None
        conversation.messages += _messages(n, 2)
        await self.store.save(conversation)


def _paths(urls: dict[str, str], tenant: str) -> list[_Path]:
    paths = [_Path(BASELINE, InMemoryConversationStore(), None)]
    for backend, url in urls.items():
        store = ChatkeepConversationStore(url, tenant=tenant)
        paths.append(_Path(f"ChatkeepConversationStore on {backend}", store, None))
        paths.append(_Path(f"ChatkeepConversationStore on {backend}, limit={WINDOW}", store, WINDOW))
    return paths


async def _run(urls: dict[str, str], rounds: int, iterations: dict[int, int]) -> list[Result]:
    tenant = f"ckbench-pai-{uuid.uuid4().hex[:8]}"
    paths = _paths(urls, tenant)
    samples: dict[tuple[str, int], list[float]] = {}
    counter = 0
    try:
        for size in SIZES:
            for _ in range(rounds):
                for i in range(2 + iterations[size]):  # two warm-up turns
                    for path in paths:  # the paths take turns one turn at a time: a busy machine slows them alike
                        cid = f"bench-{size}-{counter}"
                        counter += 1
                        await path.seed(cid, size)
                        gc.collect()
                        start = time.perf_counter()
                        await path.turn(cid, size)
                        elapsed = time.perf_counter() - start
                        await path.store.delete(cid)
                        if i >= 2:
                            samples.setdefault((path.name, size), []).append(elapsed)
    finally:
        for path in paths:
            if isinstance(path.store, ChatkeepConversationStore) and not path.store.store.closed:
                await path.store.store.delete_tenant(tenant)
                await path.store.close()
    return [Result(name, size, timed) for (name, size), timed in samples.items()]


def _report(results: list[Result]) -> str:
    def find(name: str, size: int) -> Result:
        return next(r for r in results if r.name == name and r.size == size)

    ours = f"ChatkeepConversationStore on memory, limit={WINDOW}"
    lines = [
        speedup_table(f"{TITLE}, beside {BASELINE}", results, [(BASELINE, lambda row: find(BASELINE, row.size))]),
        "",
        f"### Targets ({ours})",
        "",
    ]
    for size, which in ((SIZES[-1], "largest"), (SIZES[0], "smallest")):
        speed = speedup(find(ours, size), find(BASELINE, size))
        lines.append(target_line(f"memory, against {BASELINE},", size, speed, which))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Run the benchmark and print Markdown tables (synchronous: it runs its own event loop)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks interop-pydantic-ai")
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run, noisy numbers)")
    parser.add_argument("--sqlite", default="sqlite:///{tmp}/pydantic-ai-bench.db")
    parser.add_argument(
        "--postgres",
        default=os.environ.get("CHATKEEP_BENCH_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"),
    )
    parser.add_argument("--redis", default=os.environ.get("CHATKEEP_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args(argv)
    import tempfile

    rounds = 1 if args.quick else 3
    iterations = {10: 20, 1_000: 5, 10_000: 2} if args.quick else {10: 60, 1_000: 15, 10_000: 4}
    with tempfile.TemporaryDirectory() as tmp:
        urls = {
            "memory": "memory://",
            "SQLite": args.sqlite.format(tmp=tmp),
            "PostgreSQL": args.postgres,
            "Redis": args.redis,
        }
        results = asyncio.run(_run(urls, rounds, iterations))
    print(_report(results))
    print()
    return 0
