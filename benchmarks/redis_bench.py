"""chatkeep-redis beside raw redis-py: the agent turn, 16 concurrent clients, a whole-history load, memory.

Run with ``python -m benchmarks redis [--quick] [--url redis://127.0.0.1:6379/0]``. Every path runs in the
same process against the same server, interleaved round by round so a busy machine slows them alike.

``wait_replicas`` (Redis ``WAIT`` after each write) is measured on a private master and replica the benchmark
starts itself on free ports, and on the replicated cluster of ``scripts/redis-cluster up --replicas``
(``--replicated-cluster-url``, default ``redis+cluster://127.0.0.1:7100``; skipped when it does not answer):
the turn with ``wait_replicas=0`` and ``1`` beside raw redis-py doing the same read, then the same write with
(or without) ``WAIT 1`` on its connection.

chatkeep runs on each of its transports: ``resp`` (its own small asyncio connection, hiredis parsing; the default
on a standalone server) and ``redis-py`` (redis-py's asyncio client; the only one on a cluster).

The turn is what an agent does per run: ``load(last=20)`` then ``append`` of 2 new messages. The raw paths
pipeline ``LRANGE key -20 -1`` and ``RPUSH`` in one round trip and decode/encode JSON themselves; they have
no idempotency, no atomic index or TTL upkeep. "raw redis-py asyncio, chatkeep's statements" is raw redis-py
sending exactly what chatkeep sends (``LRANGE`` of its key, then ``EVALSHA`` of its append script with its keys
and arguments, records built by ``Message.to_record``): what the guarantees cost without the library, the
baseline of the last ratio column; "raw redis-py sync, chatkeep's statements" is the same on the blocking
client. With ``--cluster-url`` (default ``redis+cluster://127.0.0.1:7000``; skipped
when nothing answers) the same pair is timed on a Redis Cluster, where an append also updates the tenant's
indexes (two ``ZADD`` on other nodes) first. "raw sync, idempotent Lua append" adds a minimal idempotent Lua
append to the raw sync pipeline. "read then write (2 round
trips)" is the raw sync driver doing the turn as an agent must: the read before the model call, the write after
its answer, so they cannot share a round trip as the pipelined paths do.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import redis
import redis.asyncio as aredis

from benchmarks._common import Result, format_table, measure, measure_async, ratio
from chatkeep.core import Message, SessionKey
from chatkeep.core.backend import write_stamp
from chatkeep.redis import RedisHistoryStore, open_store
from chatkeep.redis._layout import session_keys, tags_map, usage_key
from chatkeep.redis._scripts import APPEND, TOUCH_TENANT
from chatkeep.redis._transport import TRANSPORTS
from chatkeep.testing.faults import free_port

__all__ = ["main"]

SIZES = (10, 1_000, 100_000)
WINDOW = 20
TWO_TRIPS = "raw redis-py sync, read then write (2 round trips)"
STATEMENTS = "raw redis-py asyncio, chatkeep's statements"
STATEMENTS_SYNC = "raw redis-py sync, chatkeep's statements"
TEXT = "The quick brown fox jumps over the lazy dog. " * 4  # ~180 characters: a typical short chat message

# The guarantee the raw "with guarantees" path pays for: skip ids already stored, append, in one script.
IDEMPOTENT_APPEND = """
local added = 0
for k = 1, #ARGV, 2 do
  if redis.call('SADD', KEYS[2], ARGV[k]) == 1 then
    redis.call('RPUSH', KEYS[1], ARGV[k + 1])
    added = added + 1
  end
end
return added
"""


def _message(n: int) -> Message:
    return Message(role="user" if n % 2 == 0 else "assistant", text=f"{n}: {TEXT}")


def _raw_dict(n: int) -> dict[str, Any]:
    return json.loads(_message(n).to_record())


def _pairs() -> list[Message]:
    return [_message(0), _message(1)]


async def _seed(store: RedisHistoryStore, key: SessionKey, raw: redis.Redis, raw_key: str, size: int) -> None:
    for start in range(0, size, 1_000):
        batch = [_message(n) for n in range(start, min(size, start + 1_000))]
        await store.append(key, batch)
        raw.rpush(raw_key, *[m.to_record() for m in batch])
        raw.sadd(raw_key + ":ids", *[m.message_id for m in batch])


def _raw_turn_sync(client: redis.Redis, raw_key: str) -> None:
    pipe = client.pipeline(transaction=False)
    pipe.lrange(raw_key, -WINDOW, -1)
    pipe.rpush(raw_key, json.dumps(_raw_dict(0)), json.dumps(_raw_dict(1)))
    records, _ = pipe.execute()
    [json.loads(r) for r in records]


def _two_trips_turn_sync(client: redis.Redis, raw_key: str) -> None:
    # What an agent's turn can do: the read happens before the model call and the write after its answer,
    # so the two cannot share a round trip.
    records = client.lrange(raw_key, -WINDOW, -1)
    [json.loads(r) for r in records]
    client.rpush(raw_key, json.dumps(_raw_dict(0)), json.dumps(_raw_dict(1)))


def _guarded_turn_sync(client: redis.Redis, raw_key: str, sha: str) -> None:
    pipe = client.pipeline(transaction=False)
    pipe.lrange(raw_key, -WINDOW, -1)
    a, b = _pairs()
    pipe.evalsha(sha, 2, raw_key, raw_key + ":ids", a.message_id, a.to_record(), b.message_id, b.to_record())
    records, _ = pipe.execute()
    [json.loads(r) for r in records]


async def _raw_turn_async(client: aredis.Redis, raw_key: str) -> None:
    pipe = client.pipeline(transaction=False)
    pipe.lrange(raw_key, -WINDOW, -1)
    pipe.rpush(raw_key, json.dumps(_raw_dict(0)), json.dumps(_raw_dict(1)))
    records, _ = await pipe.execute()
    [json.loads(r) for r in records]


async def _chatkeep_turn(store: RedisHistoryStore, key: SessionKey) -> None:
    await store.load(key, last=WINDOW)
    await store.append(key, _pairs())


class _Statements:
    """Raw redis-py sending chatkeep's own statements for a turn: its load, then its append script.

    The load is an ``LRANGE`` with an ``HMGET`` of the session's hash in one round trip (the hash says whether the
    session is a fork). On a cluster it also sends the two index updates chatkeep's append sends first, as
    chatkeep does (together): a ``ZADD`` and the ``touch_tenant`` script.
    """

    def __init__(self, prefix: str, key: SessionKey, cluster: bool) -> None:
        self.key, self.cluster = key, cluster
        h, m, i, index = session_keys(prefix, key.tenant, key.session_id)
        self.hash, self.messages, self.index, self.tenants = h, m, index, f"{prefix}:tenants"
        self.tags = tags_map(prefix, key.tenant)
        own = (h, m, i, usage_key(h))
        self.keys = own if cluster else (*own, index, self.tenants, self.tags)

    def _append(self, now: int) -> tuple[Any, ...]:
        messages, key = _pairs(), self.key
        args: list[Any] = [now, 0, 0, len(messages), key.tenant, key.session_id, 0]
        args += [m.message_id for m in messages] + [m.to_record() for m in messages] + ["" for _ in messages] + [""]
        return ("EVALSHA", APPEND.sha, len(self.keys), *self.keys, *args)

    def _load(self, pipe: Any) -> None:
        pipe.execute_command("LRANGE", self.messages, -WINDOW, -1)
        pipe.execute_command("HMGET", self.hash, "log", "segs")

    async def turn(self, client: Any) -> None:
        """On redis-py's asyncio client (standalone or cluster)."""
        pipe = client.pipeline(transaction=False)
        self._load(pipe)
        records, _ = await pipe.execute()
        [json.loads(r) for r in records]
        now = write_stamp()
        if self.cluster:
            await asyncio.gather(
                client.execute_command("ZADD", self.tenants, "GT", now, self.key.tenant),
                client.execute_command("EVALSHA", TOUCH_TENANT.sha, 2, self.index, self.tags, now, self.key.session_id),
            )
        await client.execute_command(*self._append(now))

    def turn_sync(self, client: redis.Redis) -> None:
        """On redis-py's blocking client (standalone)."""
        pipe = client.pipeline(transaction=False)
        self._load(pipe)
        records, _ = pipe.execute()
        [json.loads(r) for r in records]
        client.execute_command(*self._append(write_stamp()))


def _merge(results: list[Result]) -> Result:
    return Result(results[0].name, results[0].size, [s for r in results for s in r.samples])


async def _turns(url: str, prefix: str, rounds: int, iterations: int) -> list[Result]:
    sync_client = redis.Redis.from_url(url)
    async_client = aredis.Redis.from_url(url)
    stores = {transport: open_store(url, prefix=prefix, transport=transport) for transport in TRANSPORTS}
    sha = sync_client.script_load(IDEMPOTENT_APPEND)
    sync_client.script_load(APPEND.source)
    results: dict[tuple[str, int], list[Result]] = {}
    try:
        for size in SIZES:
            key = SessionKey("bench", f"turn-{size}")
            raw_key = f"{prefix}:raw:{size}"
            await _seed(stores["resp"], key, sync_client, raw_key, size)
            statements = _Statements(prefix, key, cluster=False)
            n = iterations

            def chatkeep_turn(store: RedisHistoryStore, key: SessionKey = key) -> Any:
                return lambda: _chatkeep_turn(store, key)

            def raw_async(raw_key: str = raw_key) -> Any:
                return _raw_turn_async(async_client, raw_key)

            for _ in range(rounds):
                for result in (
                    *[
                        await measure_async(f"chatkeep, transport={name}", size, chatkeep_turn(store), iterations=n)
                        for name, store in stores.items()
                    ],
                    await measure_async(STATEMENTS, size, lambda s=statements: s.turn(async_client), iterations=n),
                    measure(STATEMENTS_SYNC, size, lambda s=statements: s.turn_sync(sync_client), iterations=n),
                    measure(
                        "raw redis-py sync (pipelined)",
                        size,
                        lambda k=raw_key: _raw_turn_sync(sync_client, k),
                        iterations=n,
                    ),
                    await measure_async("raw redis-py asyncio (pipelined)", size, raw_async, iterations=n),
                    measure(
                        TWO_TRIPS,
                        size,
                        lambda k=raw_key: _two_trips_turn_sync(sync_client, k),
                        iterations=n,
                    ),
                    measure(
                        "raw sync, idempotent Lua append",
                        size,
                        lambda k=raw_key: _guarded_turn_sync(sync_client, k, sha),
                        iterations=n,
                    ),
                ):
                    results.setdefault((result.name, size), []).append(result)
            await stores["resp"].delete(key)
            sync_client.delete(raw_key, raw_key + ":ids")
    finally:
        for store in stores.values():
            await store.close()
        await async_client.aclose()
        sync_client.close()
    return [_merge(r) for r in results.values()]


async def _cluster_turns(url: str, prefix: str, rounds: int, iterations: int) -> list[Result]:
    """The turn on a Redis Cluster: chatkeep (redis-py) beside raw redis-py's cluster client sending its statements."""
    store = open_store(url, prefix=prefix)
    client = aredis.RedisCluster.from_url("redis://" + url.split("://", 1)[1].split(",")[0])
    results: dict[tuple[str, int], list[Result]] = {}
    try:
        await client.initialize()  # the slot table, for aiming SCRIPT LOAD at the session's node
        for size in (10, 1_000):
            key = SessionKey("bench", f"cluster-turn-{size}")
            await store.append(key, [_message(n) for n in range(size)])
            h = session_keys(prefix, key.tenant, key.session_id)[0]
            await client.execute_command("SCRIPT", "LOAD", APPEND.source, target_nodes=client.get_node_from_key(h))
            index = session_keys(prefix, key.tenant, key.session_id)[3]
            await client.execute_command(
                "SCRIPT", "LOAD", TOUCH_TENANT.source, target_nodes=client.get_node_from_key(index)
            )
            statements = _Statements(prefix, key, cluster=True)
            for _ in range(rounds):
                for result in (
                    await measure_async(
                        f"chatkeep, cluster, transport={store.transport}",
                        size,
                        lambda key=key: _chatkeep_turn(store, key),
                        iterations=iterations,
                    ),
                    await measure_async(
                        f"{STATEMENTS}, cluster", size, lambda s=statements: s.turn(client), iterations=iterations
                    ),
                ):
                    results.setdefault((result.name, size), []).append(result)
            await store.delete(key)
    finally:
        await store.close()
        await client.aclose()
    return [_merge(r) for r in results.values()]


async def _concurrent(url: str, prefix: str, clients: int, turns: int) -> list[Result]:
    store = open_store(url, prefix=prefix)
    async_client = aredis.Redis.from_url(url)
    out: list[Result] = []
    try:
        keys = [SessionKey("bench", f"concurrent-{n}") for n in range(clients)]
        raw_keys = [f"{prefix}:rawc:{n}" for n in range(clients)]
        for key, raw_key in zip(keys, raw_keys, strict=True):
            await store.append(key, [_message(n) for n in range(1_000)])
            await async_client.rpush(raw_key, *[_message(n).to_record() for n in range(1_000)])

        async def run(name: str, turn: Any, targets: list[Any]) -> Result:
            samples: list[float] = []

            async def client(target: Any) -> None:
                for _ in range(turns):
                    start = time.perf_counter()
                    await turn(target)
                    samples.append(time.perf_counter() - start)

            started = time.perf_counter()
            await asyncio.gather(*(client(t) for t in targets))
            result = Result(name, 1_000, samples)
            result.wall = time.perf_counter() - started  # type: ignore[attr-defined]
            return result

        for _ in range(2):
            name = f"chatkeep (transport={store.transport}), {clients} clients"
            out.append(await run(name, lambda k: _chatkeep_turn(store, k), keys))
            out.append(
                await run(f"raw asyncio, {clients} clients", lambda k: _raw_turn_async(async_client, k), raw_keys)
            )
        for key in keys:
            await store.delete(key)
        await async_client.delete(*raw_keys)
    finally:
        await store.close()
        await async_client.aclose()
    merged: dict[str, list[Result]] = {}
    for result in out:
        merged.setdefault(result.name, []).append(result)
    final = []
    for parts in merged.values():
        result = _merge(parts)
        result.wall = sum(p.wall for p in parts)  # type: ignore[attr-defined]
        final.append(result)
    return final


async def _whole_load(url: str, prefix: str, size: int, rounds: int, iterations: int) -> list[Result]:
    stores = {transport: open_store(url, prefix=prefix, transport=transport) for transport in TRANSPORTS}
    sync_client = redis.Redis.from_url(url)
    async_client = aredis.Redis.from_url(url)
    key, raw_key = SessionKey("bench", "whole"), f"{prefix}:raw:whole"
    results: dict[str, list[Result]] = {}
    try:
        await _seed(stores["resp"], key, sync_client, raw_key, size)
        # Many short rounds: a load takes ~0.2 s, so the machine's load changes between rounds, not within.
        for _ in range(rounds):
            for result in (
                *[
                    await measure_async(
                        f"chatkeep load(), transport={name}",
                        size,
                        lambda store=store: store.load(key),
                        iterations=iterations,
                        warmup=3,
                    )
                    for name, store in stores.items()
                ],
                measure(
                    "raw sync LRANGE + json.loads each",
                    size,
                    lambda: [json.loads(r) for r in sync_client.lrange(raw_key, 0, -1)],
                    iterations=iterations,
                    warmup=3,
                ),
                await measure_async(
                    "raw asyncio LRANGE + json.loads each",
                    size,
                    lambda: _decode_all(async_client, raw_key),
                    iterations=iterations,
                    warmup=3,
                ),
            ):
                results.setdefault(result.name, []).append(result)
        await stores["resp"].delete(key)
        sync_client.delete(raw_key, raw_key + ":ids")
    finally:
        for store in stores.values():
            await store.close()
        await async_client.aclose()
        sync_client.close()
    return [_merge(r) for r in results.values()]


async def _decode_all(client: aredis.Redis, raw_key: str) -> list[Any]:
    return [json.loads(r) for r in await client.lrange(raw_key, 0, -1)]


async def _memory(url: str, prefix: str) -> str:
    store = open_store(url, prefix=prefix)
    client = aredis.Redis.from_url(url)
    key, raw_key = SessionKey("bench", "memory"), f"{prefix}:raw:memory"
    try:
        batch = [_message(n) for n in range(1_000)]
        await store.append(key, batch)
        await client.rpush(raw_key, *[m.to_record() for m in batch])
        h, m, i, _ = session_keys(prefix, key.tenant, key.session_id)
        usage = {
            name: int(await client.memory_usage(k, samples=0) or 0)
            for name, k in (("records", m), ("ids", i), ("meta", h))
        }
        raw = int(await client.memory_usage(raw_key, samples=0) or 0)
        record = len(batch[0].to_record())
        await store.delete(key)
        await client.delete(raw_key)
    finally:
        await store.close()
        await client.aclose()
    total = sum(usage.values())
    return "\n".join(
        [
            f"### Memory per 1,000 messages (MEMORY USAGE, records of about {record} bytes)",
            "",
            "| what | bytes | per message |",
            "|---|---:|---:|",
            *(f"| chatkeep {name} | {value:,} | {value / 1000:.0f} |" for name, value in usage.items()),
            f"| chatkeep total | {total:,} | {total / 1000:.0f} |",
            f"| raw list of the same records | {raw:,} | {raw / 1000:.0f} |",
        ]
    )


WAIT_TIMEOUT_MS = 1000


@contextlib.asynccontextmanager
async def _private_pair() -> AsyncIterator[str | None]:
    """A private redis-server and its replica on free ports (no persistence), stopped afterwards; its URL."""
    if shutil.which("redis-server") is None:
        yield None
        return
    master, replica = free_port(), free_port()
    common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    processes = [
        await asyncio.create_subprocess_exec(
            "redis-server", "--port", str(port), *common, *extra, stdout=asyncio.subprocess.DEVNULL
        )
        for port, extra in ((master, ()), (replica, ("--replicaof", "127.0.0.1", str(master))))
    ]
    try:
        client = aredis.Redis(port=replica, decode_responses=True)
        try:
            for _ in range(200):
                with contextlib.suppress(redis.RedisError):
                    if (await client.info("replication")).get("master_link_status") == "up":
                        break
                await asyncio.sleep(0.05)
            else:
                raise RuntimeError("the private replica did not sync")
        finally:
            await client.aclose()
        yield f"redis://127.0.0.1:{master}/0"
    finally:
        for process in processes:
            process.kill()
            await process.wait()


async def _reachable(url: str) -> bool:
    store = open_store(url, connect_timeout=1)
    try:
        await store.count(SessionKey("bench", "probe"))
        return True
    except Exception:
        return False
    finally:
        await store.close()


async def _replicated_turns(url: str, label: str, prefix: str, rounds: int, iterations: int) -> list[Result]:
    """The turn with and without ``wait_replicas=1``, beside raw redis-py with and without ``WAIT 1``."""
    cluster = url.startswith("redis+cluster://")
    key = SessionKey("bench", "replicated")
    no_wait = open_store(url, prefix=prefix)
    waiting = open_store(url, prefix=prefix, wait_replicas=1, wait_timeout_ms=WAIT_TIMEOUT_MS)
    raw: Any = (
        aredis.RedisCluster.from_url("redis://" + url.split("://", 1)[1].split(",")[0])
        if cluster
        else aredis.Redis.from_url(url)
    )
    raw_key = f"{prefix}:{{rawrep}}:m"
    results: dict[str, list[Result]] = {}
    try:
        await no_wait.append(key, [_message(n) for n in range(1_000)])
        await raw.rpush(raw_key, *[_message(n).to_record() for n in range(1_000)])
        target = {"target_nodes": raw.get_node_from_key(raw_key)} if cluster else {}

        async def raw_turn(wait: bool) -> None:
            # The read before the model call, the write after its answer (with WAIT on the write's connection).
            [json.loads(r) for r in await raw.lrange(raw_key, -WINDOW, -1)]
            pipe = raw.pipeline(transaction=False)
            pipe.execute_command("RPUSH", raw_key, json.dumps(_raw_dict(0)), json.dumps(_raw_dict(1)), **target)
            if wait:
                pipe.execute_command("WAIT", 1, WAIT_TIMEOUT_MS, **target)
            replies = await pipe.execute()
            if wait and replies[-1] < 1:
                raise RuntimeError("the raw WAIT was not confirmed by the replica")

        for _ in range(rounds):
            for result in (
                await measure_async(
                    f"chatkeep, {label}, wait_replicas=0",
                    1_000,
                    lambda: _chatkeep_turn(no_wait, key),
                    iterations=iterations,
                ),
                await measure_async(
                    f"chatkeep, {label}, wait_replicas=1",
                    1_000,
                    lambda: _chatkeep_turn(waiting, key),
                    iterations=iterations,
                ),
                await measure_async(
                    f"raw redis-py asyncio, {label}, no WAIT", 1_000, lambda: raw_turn(False), iterations=iterations
                ),
                await measure_async(
                    f"raw redis-py asyncio, {label}, WAIT 1", 1_000, lambda: raw_turn(True), iterations=iterations
                ),
            ):
                results.setdefault(result.name, []).append(result)
        await no_wait.delete(key)
        await raw.delete(raw_key)
    finally:
        await no_wait.close()
        await waiting.close()
        await raw.aclose()
    return [_merge(r) for r in results.values()]


def _raw_counterpart(results: list[Result]) -> Any:
    """Each row's raw path with the same WAIT on the same target (a raw row is its own baseline)."""

    def baseline(row: Result) -> Result:
        label, waits = row.name.split(", ")[1], row.name.endswith("=1") or row.name.endswith("WAIT 1")
        return next(
            r
            for r in results
            if r.name.startswith("raw") and r.name.split(", ")[1] == label and r.name.endswith("WAIT 1") == waits
        )

    return baseline


def _without_wait(results: list[Result]) -> Any:
    """The same path and target without WAIT, for the cost of waiting."""

    def baseline(row: Result) -> Result | None:
        if row.name.endswith("wait_replicas=1"):
            return next(r for r in results if r.name == row.name.replace("=1", "=0"))
        if row.name.endswith("WAIT 1"):
            return next(r for r in results if r.name == row.name.replace("WAIT 1", "no WAIT"))
        return None

    return baseline


def _replicated_report(results: list[Result]) -> str:
    table = format_table(
        "The turn with wait_replicas (sessions of 1,000 messages; a replica per master)",
        results,
        _raw_counterpart(results),
        also=("no WAIT", _without_wait(results)),
    )
    # The first ratio column compares each row with raw redis-py doing the same (with or without WAIT).
    return table.replace("| p50 vs fastest raw |", "| p50 vs raw, same WAIT |", 1)


async def _cleanup(url: str, prefix: str) -> None:
    """Remove every key of this run (its own prefix only)."""
    client = aredis.Redis.from_url(url)
    try:
        keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=1000)]
        for start in range(0, len(keys), 500):
            await client.unlink(*keys[start : start + 500])
    finally:
        await client.aclose()


async def _cleanup_cluster(url: str, prefix: str) -> None:
    """Remove this run's keys from every master of a cluster."""
    client = aredis.RedisCluster.from_url("redis://" + url.split("://", 1)[1].split(",")[0])
    try:
        async for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            await client.unlink(key)
    finally:
        await client.aclose()


def _fastest_raw(results: list[Result]) -> Any:
    """The issue's baseline: the fastest plain raw turn (pipelined), not the Lua or two-round-trip variants."""

    def baseline(row: Result) -> Result:
        raws = [
            r
            for r in results
            if r.size == row.size
            and r.name.startswith("raw")
            and "idempotent" not in r.name
            and r.name != TWO_TRIPS
            and "chatkeep's statements" not in r.name
        ]
        return min(raws, key=lambda r: r.p50)

    return baseline


def main(argv: list[str]) -> int:
    """Run the Redis benchmark and print Markdown tables (synchronous: it runs its own event loop)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks redis", description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("CHATKEEP_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run, noisy numbers)")
    parser.add_argument(
        "--replicated-cluster-url",
        default=os.environ.get("CHATKEEP_BENCH_REDIS_REPLICATED_URL", "redis+cluster://127.0.0.1:7100"),
        help="a Redis Cluster with a replica per master (scripts/redis-cluster up --replicas)",
    )
    parser.add_argument(
        "--cluster-url",
        default=os.environ.get("CHATKEEP_BENCH_REDIS_CLUSTER_URL", "redis+cluster://127.0.0.1:7000"),
        help="a Redis Cluster for the cluster turn (scripts/redis-cluster up); skipped when it does not answer",
    )
    parser.add_argument("--only-replicated", action="store_true", help="only the wait_replicas tables")
    args = parser.parse_args(argv)
    rounds, iterations = (2, 200) if args.quick else (5, 600)
    prefix = f"ckbench-{uuid.uuid4().hex[:8]}"

    async def replicated() -> str:
        rows: list[Result] = []
        async with _private_pair() as pair:
            if pair is not None:
                rows += await _replicated_turns(pair, "master + replica", prefix, rounds, iterations)
        if await _reachable(args.replicated_cluster_url):
            try:
                rows += await _replicated_turns(args.replicated_cluster_url, "cluster", prefix, rounds, iterations)
            finally:
                await _cleanup_cluster(args.replicated_cluster_url, prefix)
        else:
            print(f"skipped the replicated cluster: nothing answers at {args.replicated_cluster_url}")
        return _replicated_report(rows) if rows else "(no replicated server: redis-server is not installed)"

    async def run() -> list[str]:
        if args.only_replicated:
            return [await replicated()]
        try:
            turns = await _turns(args.url, prefix, rounds, iterations)
            concurrent = await _concurrent(args.url, prefix, 16, 100 if args.quick else 400)
            whole = await _whole_load(args.url, prefix, 10_000, *((3, 5) if args.quick else (9, 5)))
            memory = await _memory(args.url, prefix)
        finally:
            await _cleanup(args.url, prefix)
        cluster = "(skipped the cluster turn: nothing answers at " + args.cluster_url + ")"
        if await _reachable(args.cluster_url):
            try:
                cluster_rows = await _cluster_turns(args.cluster_url, prefix, rounds, iterations // 2)
            finally:
                await _cleanup_cluster(args.cluster_url, prefix)
            cluster = _cluster_report(cluster_rows)
        return [_report(turns, concurrent, whole), cluster, memory, await replicated()]

    for block in asyncio.run(run()):
        print(block)
        print()
    return 0


def _statements_of(results: list[Result]) -> Any:
    """The fastest raw redis-py client sending chatkeep's own statements, at the row's size and kind of server."""

    def baseline(row: Result) -> Result | None:
        cluster = "cluster" in row.name
        candidates = [
            r
            for r in results
            if "chatkeep's statements" in r.name and r.size == row.size and ("cluster" in r.name) == cluster
        ]
        return min(candidates, key=lambda r: r.p50, default=None)

    return baseline


def _cluster_report(results: list[Result]) -> str:
    table = format_table(
        "The turn on a Redis Cluster: load(last=20) + append 2 messages",
        results,
        lambda row: _statements_of(results)(row) or row,
    )
    return table.replace("| p50 vs fastest raw |", "| p50 vs raw cluster client, chatkeep's statements |", 1)


def _report(turns: list[Result], concurrent: list[Result], whole: list[Result]) -> str:
    statements = _statements_of(turns)
    lines = [
        format_table(
            "The turn: load(last=20) + append 2 messages",
            turns,
            _fastest_raw(turns),
            also=("fastest raw + chatkeep's statements", statements),
        ),
        "",
    ]
    lines += [
        "### 16 concurrent clients (sessions of 1,000 messages)",
        "",
        "| path | p50 ms | p99 ms | turns/s (all clients) |",
        "|---|---:|---:|---:|",
    ]
    for result in concurrent:
        lines.append(
            f"| {result.name} | {result.p50 * 1e3:.3f} | {result.p99 * 1e3:.3f} | "
            f"{len(result.samples) / result.wall:,.0f} |"  # type: ignore[attr-defined]
        )
    lines += ["", format_table("Loading a whole 10,000-message history", whole, _fastest_raw(whole)), ""]
    lines.append("### Targets")
    lines.append("")
    for result in (r for r in turns if r.name.startswith("chatkeep") and r.size in (SIZES[0], SIZES[-1])):
        base = statements(result)
        assert base is not None
        value = ratio(result, base)
        verdict = "met" if value <= 1.15 else "missed"
        lines.append(
            f"- {result.name}, turn at {result.size:,}: {value:.2f}x the fastest raw redis-py running chatkeep's "
            f"statements (target 1.15x): {verdict}"
        )
    for result in (r for r in whole if r.name.startswith("chatkeep")):
        value = ratio(result, _fastest_raw(whole)(result))
        verdict = "met" if value <= 1.3 else "missed"
        lines.append(f"- {result.name}, whole 10,000-message load: {value:.2f}x raw (target 1.3x): {verdict}")
    return "\n".join(lines)
