"""Semantic recall on SQL: search over a tenant beside the raw driver's own query, indexed appends, reindex.

Run with ``python -m benchmarks search [--messages N] [--dimensions D] [--pgvector-url URL] [--quick]``.

For each database that can search (SQLite on the ``apsw`` transport with sqlite-vec, in a temporary file; the
PostgreSQL with pgvector that ``scripts/pgvector up`` starts, in a schema of its own, skipped when it does not
answer), the benchmark fills one tenant with ``--messages`` indexed messages (default 100,000) in sessions of
1,000, then times:

* **search**: ``store.search(TenantScope(tenant), vector, text, k=5)``, hybrid, beside the raw driver running
  just the two nearest-neighbour and keyword queries a hand-written hybrid search needs (no fusion, no decoding);
* **append**: a turn's 2 messages appended with their embeddings, beside the same append without them (the
  vectors are made before timing; the embedding of 2 messages is timed on its own row);
* **reindex**: the throughput of ``store.reindex`` over a second tenant of messages stored without vectors.

Vectors come from :class:`~chatkeep.testing.embedding.HashingEmbedder` (no model: the benchmark measures the
store, not an embedder). Every path runs in the same process against the same database.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import struct
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from benchmarks._common import Result, format_table, measure_async
from chatkeep.core import Message, SessionKey, TenantScope, embed_messages
from chatkeep.core.backend import SearchableStore, keyword_terms
from chatkeep.sql import SQLHistoryStore
from chatkeep.testing.embedding import HashingEmbedder

__all__ = ["main"]

SESSION_SIZE = 1_000
BATCH = 200
K = 5
WORDS = [
    "key",
    "door",
    "kitchen",
    "bicycle",
    "garden",
    "train",
    "meeting",
    "recipe",
    "flour",
    "colour",
    "weather",
    "spring",
    "morning",
    "notes",
    "summary",
    "invoice",
    "holiday",
    "flight",
    "hotel",
    "doctor",
    "appointment",
    "birthday",
    "present",
    "school",
    "homework",
    "piano",
    "lesson",
    "garage",
    "car",
]
QUESTIONS = [
    "where is the spare key of the blue bicycle",
    "when is the doctor appointment",
    "what did we decide about the holiday flight",
    "which recipe needs flour",
]
DEFAULT_PGVECTOR_URL = "postgresql+asyncpg://postgres@127.0.0.1:5433/test"


def _text(n: int) -> str:
    picked = [WORDS[(n * 7 + i * 13) % len(WORDS)] for i in range(12)]
    return f"message {n}: " + " ".join(picked)


@contextlib.asynccontextmanager
async def _sqlite_store() -> AsyncIterator[tuple[SearchableStore, Callable[[list[float], str], Awaitable[Any]]]]:
    import apsw
    import sqlite_vec  # type: ignore[import-untyped]

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "search-bench.db")
        async with SQLHistoryStore(f"sqlite:///{path}?transport=apsw") as store:
            assert isinstance(store, SearchableStore)
            raw = apsw.Connection(path)  # the same library as the store's: one SQLite in the process
            raw.enable_load_extension(True)
            raw.load_extension(sqlite_vec.loadable_path())

            async def raw_search(vector: list[float], text: str) -> Any:
                blob = struct.pack(f"<{len(vector)}f", *vector)
                tenant = raw.execute("SELECT tenant_key FROM chatkeep_search_vec LIMIT 1").fetchall()[0][0]
                near = raw.execute(
                    "SELECT rowid, distance FROM chatkeep_search_vec WHERE embedding MATCH ? AND k = ? "
                    "AND tenant_key = ?",
                    (blob, K * 4, tenant),
                ).fetchall()
                words = " OR ".join(f'"{t}"' for t in keyword_terms(text))
                found = raw.execute(
                    "SELECT rowid FROM chatkeep_search_fts WHERE chatkeep_search_fts MATCH ? ORDER BY rank LIMIT ?",
                    (words, K * 4),
                ).fetchall()
                return near, found

            try:
                yield store, raw_search
            finally:
                raw.close()


@contextlib.asynccontextmanager
async def _pgvector_store(
    url: str,
) -> AsyncIterator[tuple[SearchableStore, Callable[[list[float], str], Awaitable[Any]]]]:
    import asyncpg  # type: ignore[import-untyped]

    dsn = url.replace("postgresql+asyncpg://", "postgresql://")
    schema = f"ck_bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(dsn)
    await admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        async with SQLHistoryStore(f"{url}?schema={schema}") as store:
            assert isinstance(store, SearchableStore)
            raw = await asyncpg.connect(dsn, server_settings={"search_path": f'"{schema}", public'})

            async def raw_search(vector: list[float], text: str) -> Any:
                literal = "[" + ",".join(map(repr, vector)) + "]"
                near = await raw.fetch(
                    "SELECT x.session_ref, x.seq FROM chatkeep_search x JOIN chatkeep_sessions s ON s.id = "
                    "x.session_ref WHERE s.tenant_hash = (SELECT tenant_hash FROM chatkeep_sessions LIMIT 1) "
                    "ORDER BY x.embedding <=> $1::vector LIMIT $2",
                    literal,
                    K * 4,
                )
                query = " | ".join(f"'{t}'" for t in keyword_terms(text))
                found = await raw.fetch(
                    "SELECT session_ref, seq FROM chatkeep_search WHERE terms @@ $1::tsquery "
                    "ORDER BY ts_rank(terms, $1::tsquery) DESC LIMIT $2",
                    query,
                    K * 4,
                )
                return near, found

            try:
                yield store, raw_search
            finally:
                await raw.close()
    finally:
        await admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await admin.close()


async def _fill(store: SearchableStore, embedder: HashingEmbedder, tenant: str, count: int, *, indexed: bool) -> float:
    """Store ``count`` messages in sessions of :data:`SESSION_SIZE`; returns the seconds spent embedding."""
    embedding = 0.0
    for start in range(0, count, BATCH):
        key = SessionKey(tenant, f"s{start // SESSION_SIZE}")
        messages = [
            Message(role="user" if n % 2 == 0 else "assistant", text=_text(n))
            for n in range(start, min(start + BATCH, count))
        ]
        if indexed:
            began = time.perf_counter()
            embeddings = await embed_messages(embedder, messages)
            embedding += time.perf_counter() - began
            await store.append(key, messages, embeddings=embeddings)
        else:
            await store.append(key, messages)
    return embedding


async def _run(
    name: str,
    opened: contextlib.AbstractAsyncContextManager[
        tuple[SearchableStore, Callable[[list[float], str], Awaitable[Any]]]
    ],
    args: argparse.Namespace,
) -> None:
    embedder = HashingEmbedder(args.dimensions)
    iterations = 50 if args.quick else 300
    async with opened as (store, raw_search):
        tenant = "bench"
        began = time.perf_counter()
        embedding = await _fill(store, embedder, tenant, args.messages, indexed=True)
        filled = time.perf_counter() - began
        print(
            f"{name}: {args.messages:,} indexed messages in {filled:.1f} s ({embedding:.1f} s of it embedding, "
            f"{args.messages / max(filled - embedding, 1e-9):,.0f} messages/s stored)"
        )
        vectors = list(await embedder.embed(QUESTIONS))
        turn = 0

        async def search() -> None:
            nonlocal turn
            turn += 1
            q = turn % len(QUESTIONS)
            await store.search(TenantScope(tenant), vectors[q], QUESTIONS[q], K)

        async def raw() -> None:
            nonlocal turn
            turn += 1
            q = turn % len(QUESTIONS)
            await raw_search(vectors[q], QUESTIONS[q])

        results: list[Result] = []
        results.append(
            await measure_async(f"{name}: raw driver, its own 2 queries", args.messages, raw, iterations=iterations)
        )
        results.append(
            await measure_async(
                f"{name}: chatkeep search (hybrid, k={K})", args.messages, search, iterations=iterations
            )
        )
        print(format_table(f"{name}: search over a tenant", results, lambda _: results[0], versus="raw driver"))

        pair = [Message(role="user", text=_text(1)), Message(role="assistant", text=_text(2))]
        counter = 0

        def fresh() -> tuple[SessionKey, list[Message]]:
            nonlocal counter
            counter += 1
            key = SessionKey("bench-append", f"a{counter}")
            return key, [Message(role=m.role, text=m.text) for m in pair]

        prepared = await embed_messages(embedder, pair)

        async def plain() -> None:
            key, messages = fresh()
            await store.append(key, messages)

        async def indexed() -> None:
            key, messages = fresh()
            await store.append(key, messages, embeddings=prepared)

        async def embed_only() -> None:
            await embed_messages(embedder, pair)

        appends = [
            await measure_async(f"{name}: append 2, not indexed", 2, plain, iterations=iterations),
            await measure_async(f"{name}: append 2 with embeddings", 2, indexed, iterations=iterations),
            await measure_async(f"{name}: embed 2 (HashingEmbedder)", 2, embed_only, iterations=iterations),
        ]
        print(
            format_table(
                f"{name}: append with and without indexing", appends, lambda _: appends[0], versus="not indexed"
            )
        )

        count = min(args.messages, 2_000 if args.quick else 20_000)
        await _fill(store, embedder, "bench-reindex", count, indexed=False)
        began = time.perf_counter()
        done = await store.reindex(embedder, "bench-reindex")
        seconds = time.perf_counter() - began
        print(f"{name}: reindex of {done:,} messages in {seconds:.1f} s: {done / seconds:,.0f} messages/s\n")


async def _main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks search")
    parser.add_argument("--messages", type=int, default=100_000, help="indexed messages in the searched tenant")
    parser.add_argument("--dimensions", type=int, default=384, help="the width of the vectors")
    parser.add_argument("--pgvector-url", default=os.environ.get("CHATKEEP_TEST_PGVECTOR_URL", DEFAULT_PGVECTOR_URL))
    parser.add_argument("--quick", action="store_true", help="fewer iterations and a smaller reindex")
    args = parser.parse_args(argv)
    await _run("sqlite (apsw + sqlite-vec)", _sqlite_store(), args)
    try:
        import asyncpg

        probe = await asyncpg.connect(args.pgvector_url.replace("postgresql+asyncpg://", "postgresql://"), timeout=3)
        await probe.close()
    except (OSError, asyncio.TimeoutError, ImportError) as exc:
        print(f"pgvector: skipped, {args.pgvector_url} does not answer ({exc}); start it with scripts/pgvector up")
        return
    await _run("postgresql (pgvector)", _pgvector_store(args.pgvector_url), args)


def main(argv: list[str]) -> None:
    """Run the search benchmark (synchronous entry point: it runs its own event loop)."""
    asyncio.run(_main(argv))
