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
import itertools
import math
import os
import random
import struct
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from benchmarks._common import Result, format_table, measure_async
from chatkeep.core import Message, SessionKey, TenantScope, embed_messages
from chatkeep.core.backend import SearchableStore, keyword_terms
from chatkeep.sql import SQLHistoryStore
from chatkeep.sql._config import DEFAULT_MMAP_SIZE
from chatkeep.sql._sqlite_search import LAYOUT as SQLITE_LAYOUT
from chatkeep.testing.embedding import HashingEmbedder

__all__ = ["main"]

SESSION_SIZE = 1_000
BATCH = SESSION_SIZE  # messages per append while filling: a session at a time
K = 5
#: The candidates each ranking gives the fusion for k = 5 (chatkeep's search asks for as many).
CANDIDATES = 50
TENANT = "bench"
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


#: The ``zipf`` corpus's vocabulary, most frequent first: made-up words, with :data:`WORDS` (the questions' words)
#: at every 20th rank from the 20th, so that each question word is in roughly 0.5% to 7% of the messages.
VOCABULARY = [
    WORDS[rank // 20 - 1] if rank % 20 == 0 and rank // 20 <= len(WORDS) else f"w{rank}x" for rank in range(1, 5_001)
]
_ZIPF = list(itertools.accumulate(1 / rank for rank in range(1, len(VOCABULARY) + 1)))


def _text(n: int, corpus: str = "zipf") -> str:
    """Message ``n``'s text: 12 words drawn by Zipf's law from :data:`VOCABULARY`, or (``dense``) from :data:`WORDS`.

    ``dense`` is the worst case for the keyword ranking: every question word is in about 40% of the messages, so
    bm25 / ts_rank score about half of the tenant's messages per search.
    """
    if corpus == "dense":
        picked = [WORDS[(n * 7 + i * 13) % len(WORDS)] for i in range(12)]
    else:
        picked = random.Random(n).choices(VOCABULARY, cum_weights=_ZIPF, k=12)
    return f"message {n}: " + " ".join(picked)


Opened = contextlib.AbstractAsyncContextManager[tuple[SearchableStore, Callable[[list[float], str], Awaitable[Any]]]]


def _kept_name(args: argparse.Namespace) -> str:
    """The name of the database ``--keep`` leaves for the next run (one per size and width)."""
    return f"chatkeep_search_bench_{args.corpus}_{args.messages}x{args.dimensions}"


@contextlib.asynccontextmanager
async def _sqlite_store(
    args: argparse.Namespace,
) -> AsyncIterator[tuple[SearchableStore, Callable[[list[float], str], Awaitable[Any]]]]:
    import apsw
    import sqlite_vec  # type: ignore[import-untyped]

    with contextlib.ExitStack() as stack:
        if args.keep:
            # one file per index layout: a file of an older layout would need a reindex first
            path = os.path.join(tempfile.gettempdir(), f"{_kept_name(args)}-layout{SQLITE_LAYOUT}.db")
        else:
            path = os.path.join(stack.enter_context(tempfile.TemporaryDirectory()), "search-bench.db")
        async with SQLHistoryStore(f"sqlite:///{path}?transport=apsw") as store:
            assert isinstance(store, SearchableStore)
            raw = apsw.Connection(path)  # the same library as the store's: one SQLite in the process
            raw.enable_load_extension(True)
            raw.load_extension(sqlite_vec.loadable_path())
            raw.setbusytimeout(5_000)
            raw.execute(f"PRAGMA mmap_size={DEFAULT_MMAP_SIZE}")  # the file read as the store's connections read it
            tenant: bytes = b""

            async def raw_search(vector: list[float], text: str) -> Any:
                nonlocal tenant
                if not tenant:  # the tenant's key, read once (the store writes it with the first session)
                    found = raw.execute(
                        "SELECT tenant_hash FROM chatkeep_sessions WHERE tenant = ? LIMIT 1", (TENANT.encode(),)
                    )
                    tenant = bytes(found.fetchall()[0][0])
                # What a careful hand-written hybrid search runs: the tenant's nearest rows from its vec0
                # partition (the query at length 1, as the stored vectors are) and its best keyword rows, each
                # ranking limited before it is joined with the records.
                length = math.hypot(*vector)
                blob = struct.pack(f"<{len(vector)}f", *[x / length for x in vector])
                near = raw.execute(
                    "SELECT m.record, v.distance FROM (SELECT session_ref, seq, distance FROM chatkeep_search_vec "
                    "WHERE embedding MATCH ? AND k = ? AND tenant_key = ?) v "
                    "JOIN chatkeep_messages m ON m.session_ref = v.session_ref AND m.seq = v.seq",
                    (blob, CANDIDATES, tenant.hex()),
                ).fetchall()
                words = " OR ".join(f'"{t}"' for t in dict.fromkeys(keyword_terms(text)))
                found = raw.execute(
                    "SELECT m.record, best.r FROM (SELECT x.session_ref, x.seq, bm25(chatkeep_search_fts) AS r "
                    "FROM chatkeep_search_fts f JOIN chatkeep_search x ON x.id = f.rowid "
                    "WHERE chatkeep_search_fts MATCH ? AND x.session_ref IN "
                    "(SELECT id FROM chatkeep_sessions WHERE tenant_hash = ?) ORDER BY r LIMIT ?) best "
                    "JOIN chatkeep_messages m ON m.session_ref = best.session_ref AND m.seq = best.seq",
                    (words, tenant, CANDIDATES),
                ).fetchall()
                return near, found

            try:
                yield store, raw_search
            finally:
                raw.close()


@contextlib.asynccontextmanager
async def _pgvector_store(
    args: argparse.Namespace,
) -> AsyncIterator[tuple[SearchableStore, Callable[[list[float], str], Awaitable[Any]]]]:
    import asyncpg  # type: ignore[import-untyped]

    url = args.pgvector_url
    dsn = url.replace("postgresql+asyncpg://", "postgresql://")
    schema = _kept_name(args) if args.keep else f"ck_bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(dsn)
    await admin.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    try:
        async with SQLHistoryStore(f"{url}?schema={schema}") as store:
            assert isinstance(store, SearchableStore)
            # A careful hand-written search sets the HNSW search's candidates and filtered scan once per connection,
            # and filters on the tenant's sessions as a semi-join (a join before ORDER BY ... LIMIT keeps the
            # planner off the HNSW index), as chatkeep's statement does.
            raw = await asyncpg.connect(
                dsn,
                server_settings={
                    "search_path": f'"{schema}", public',
                    "hnsw.ef_search": str(CANDIDATES * 2),
                    "hnsw.iterative_scan": "relaxed_order",
                },
            )
            tenant: bytes = b""

            async def raw_search(vector: list[float], text: str) -> Any:
                nonlocal tenant
                if not tenant:
                    tenant = await raw.fetchval(
                        "SELECT tenant_hash FROM chatkeep_sessions WHERE tenant = $1 LIMIT 1", TENANT.encode()
                    )
                literal = "[" + ",".join(map(repr, vector)) + "]"
                near = await raw.fetch(
                    "SELECT m.record, best.d FROM (SELECT x.session_ref, x.seq, x.embedding <=> $1::vector AS d "
                    "FROM chatkeep_search x WHERE x.session_ref IN "
                    "(SELECT id FROM chatkeep_sessions WHERE tenant_hash = $2) ORDER BY d LIMIT $3) best "
                    "JOIN chatkeep_messages m ON m.session_ref = best.session_ref AND m.seq = best.seq",
                    literal,
                    tenant,
                    CANDIDATES,
                )
                query = " | ".join(f"'{t}'" for t in dict.fromkeys(keyword_terms(text)))
                found = await raw.fetch(
                    "SELECT m.record, best.r FROM (SELECT x.session_ref, x.seq, ts_rank(x.terms, $1::tsquery) AS r "
                    "FROM chatkeep_search x WHERE x.terms @@ $1::tsquery AND x.session_ref IN "
                    "(SELECT id FROM chatkeep_sessions WHERE tenant_hash = $2) ORDER BY r DESC LIMIT $3) best "
                    "JOIN chatkeep_messages m ON m.session_ref = best.session_ref AND m.seq = best.seq",
                    query,
                    tenant,
                    CANDIDATES,
                )
                return near, found

            try:
                yield store, raw_search
            finally:
                await raw.close()
    finally:
        if not args.keep:
            await admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await admin.close()


async def _fill(
    store: SearchableStore, embedder: HashingEmbedder, tenant: str, count: int, corpus: str, *, indexed: bool
) -> float:
    """Store ``count`` messages in sessions of :data:`SESSION_SIZE`; returns the seconds spent embedding."""
    embedding = 0.0
    for start in range(0, count, BATCH):
        key = SessionKey(tenant, f"s{start // SESSION_SIZE}")
        messages = [
            Message(role="user" if n % 2 == 0 else "assistant", text=_text(n, corpus))
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


class _TimedEmbedder:
    """An embedder that counts the seconds its ``embed`` takes (the same name and width as the one it wraps)."""

    def __init__(self, embedder: HashingEmbedder) -> None:
        self._embedder = embedder
        self.name = embedder.name
        self.dimensions = embedder.dimensions
        self.seconds = 0.0

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        began = time.perf_counter()
        try:
            return await self._embedder.embed(texts)
        finally:
            self.seconds += time.perf_counter() - began


async def _filled(store: SearchableStore, count: int) -> bool:
    """Whether a kept database already holds the searched tenant's ``count`` messages (its last session full)."""
    last = (count - 1) // SESSION_SIZE
    return await store.count(SessionKey(TENANT, f"s{last}")) == count - last * SESSION_SIZE


async def _run(name: str, opened: Opened, args: argparse.Namespace) -> None:
    embedder = HashingEmbedder(args.dimensions)
    iterations = 50 if args.quick else 300
    run = uuid.uuid4().hex[:8]  # the append and reindex tenants of this run (a kept database keeps only TENANT)
    async with opened as (store, raw_search):
        if args.keep and await _filled(store, args.messages):
            print(f"{name}: {args.messages:,} indexed messages kept from an earlier run (--keep)")
        else:
            began = time.perf_counter()
            embedding = await _fill(store, embedder, TENANT, args.messages, args.corpus, indexed=True)
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
            await store.search(TenantScope(TENANT), vectors[q], QUESTIONS[q], K)

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

        pair = [Message(role="user", text=_text(1, args.corpus)), Message(role="assistant", text=_text(2, args.corpus))]
        counter = 0
        appended = f"bench-append-{run}"

        def fresh() -> tuple[SessionKey, list[Message]]:
            nonlocal counter
            counter += 1
            key = SessionKey(appended, f"a{counter}")
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
        reindexed = f"bench-reindex-{run}"
        await _fill(store, embedder, reindexed, count, args.corpus, indexed=False)
        timed = _TimedEmbedder(embedder)
        began = time.perf_counter()
        done = await store.reindex(timed, reindexed)
        seconds = time.perf_counter() - began
        print(
            f"{name}: reindex of {done:,} messages in {seconds:.1f} s: {done / seconds:,.0f} messages/s "
            f"({timed.seconds:.1f} s of it embedding; {done / max(seconds - timed.seconds, 1e-9):,.0f} messages/s "
            "without it)\n"
        )
        if args.keep:
            await store.delete_tenant(appended)
            await store.delete_tenant(reindexed)


async def _main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks search")
    parser.add_argument("--messages", type=int, default=100_000, help="indexed messages in the searched tenant")
    parser.add_argument(
        "--dimensions", type=int, default=384, help="the width of the vectors (384: the offline default embedder's)"
    )
    parser.add_argument(
        "--corpus",
        choices=["zipf", "dense"],
        default="zipf",
        help="zipf: words by Zipf's law over 5,000; dense: 29 words, each question word in 40%% of the messages",
    )
    parser.add_argument("--pgvector-url", default=os.environ.get("CHATKEEP_TEST_PGVECTOR_URL", DEFAULT_PGVECTOR_URL))
    parser.add_argument("--quick", action="store_true", help="fewer iterations and a smaller reindex")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the filled databases (a file in the temporary folder, a schema) and reuse them in the next run",
    )
    parser.add_argument(
        "--database", choices=["sqlite", "postgresql"], action="append", help="only this one (repeatable; default both)"
    )
    args = parser.parse_args(argv)
    databases = args.database or ["sqlite", "postgresql"]
    if "sqlite" in databases:
        await _run("sqlite (apsw + sqlite-vec)", _sqlite_store(args), args)
    if "postgresql" not in databases:
        return
    try:
        import asyncpg

        probe = await asyncpg.connect(args.pgvector_url.replace("postgresql+asyncpg://", "postgresql://"), timeout=3)
        await probe.close()
    except (OSError, asyncio.TimeoutError, ImportError) as exc:
        print(f"pgvector: skipped, {args.pgvector_url} does not answer ({exc}); start it with scripts/pgvector up")
        return
    await _run("postgresql (pgvector)", _pgvector_store(args), args)


def main(argv: list[str]) -> None:
    """Run the search benchmark (synchronous entry point: it runs its own event loop)."""
    asyncio.run(_main(argv))
