"""The ``resp`` transport: the store's own pipelined connection to a standalone server (hiredis parsing)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from redis.asyncio import Redis

from chatkeep.core import Message, SessionKey, StoreUnavailableError
from chatkeep.redis import RedisHistoryStore, RedisURLError, open_store
from chatkeep.redis._resp import RespTransport, resp_target

pytest.importorskip("hiredis")

KEY = SessionKey("tenant", "session")


def make_messages(n: int, label: str = "m") -> list[Message]:
    return [Message(role="user", text=f"{label}-{i}") for i in range(n)]


def resp_of(store: RedisHistoryStore) -> RespTransport:
    """The running event loop's transport of ``store``."""
    link = store._transport()
    assert isinstance(link, RespTransport), "the store did not use the resp transport"
    return link


def test_resp_target_only_for_plain_standalone_urls() -> None:
    assert resp_target("redis://127.0.0.1:6379/0") == {"host": "127.0.0.1", "port": 6379, "db": 0}
    assert resp_target("redis://alice:p%40ss@h:7/3") == {
        "host": "h",
        "port": 7,
        "db": 3,
        "username": "alice",
        "password": "p@ss",
    }
    assert resp_target("unix:///tmp/redis.sock?db=2") == {"path": "/tmp/redis.sock", "db": 2}
    # redis-py implements these: the store leaves them to it.
    for url, reason in (
        ("rediss://127.0.0.1:6379/0", "not TLS"),
        ("redis://127.0.0.1:6379/0?client_name=x", "client_name"),
        ("redis://127.0.0.1:6379/0?protocol=3", "protocol"),
    ):
        with pytest.raises(ValueError, match=reason):
            resp_target(url)


def test_the_default_transport_is_the_fastest_that_serves_the_url() -> None:
    assert open_store("redis://127.0.0.1:6379/0").transport == "resp"
    assert open_store("unix:///tmp/redis.sock").transport == "resp"
    assert open_store("redis://127.0.0.1:6379/0?client_name=x").transport == "redis-py"
    assert open_store("rediss://127.0.0.1:6379/0").transport == "redis-py"
    assert open_store("redis+cluster://127.0.0.1:7000").transport == "redis-py"
    assert open_store("redis://127.0.0.1:6379/0?transport=redis-py").transport == "redis-py"
    assert open_store("redis://127.0.0.1:6379/0", transport="redis-py").describe()["transport"] == "redis-py"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis+cluster://127.0.0.1:7000", "not a Redis Cluster"),
        ("rediss://127.0.0.1:6379/0", "not TLS"),
        ("redis://127.0.0.1:6379/0?client_name=x", "client_name"),
    ],
)
def test_resp_where_it_cannot_serve_names_why(url: str, reason: str) -> None:
    with pytest.raises(RedisURLError, match=reason) as caught:
        open_store(url, transport="resp")
    assert "transport=redis-py" in str(caught.value)
    with pytest.raises(RedisURLError, match="must be one of resp, redis-py"):
        open_store(url, transport="fast")


async def test_handed_in_clients_run_on_redis_py(private_redis: Any) -> None:
    client = Redis(port=private_redis.port)
    try:
        with pytest.raises(RedisURLError, match="client handed to it"):
            RedisHistoryStore(client=client, transport="resp")
        async with RedisHistoryStore(client=client, prefix="handed") as store:
            assert store.transport == "redis-py"
            await store.append(KEY, make_messages(2))
            assert len(await store.load(KEY, last=5)) == 2
    finally:
        await client.aclose()


@pytest.mark.reliability
async def test_concurrent_callers_share_one_pipelined_connection(private_redis: Any) -> None:
    async with open_store(private_redis.url) as store:
        keys = [SessionKey("tenant", f"s{n}") for n in range(40)]

        async def writer(n: int, key: SessionKey) -> list[str]:
            batch = make_messages(n % 5 + 1, key.session_id)
            assert await store.append(key, batch) == len(batch)
            assert await store.count(key) == len(batch)
            return [m.text for m in await store.load(key, last=3)]

        results = await asyncio.gather(*(writer(n, key) for n, key in enumerate(keys)))
        for n, (key, texts) in enumerate(zip(keys, results, strict=True)):
            assert texts == [f"{key.session_id}-{i}" for i in range(n % 5 + 1)][-3:]
        fast = resp_of(store)
        protocol = fast._protocol
        assert protocol is not None
        assert not protocol.pending
        # Concurrent appends to one key stay contiguous and each id is stored once.
        batches = [make_messages(3, f"c{n}") for n in range(20)]
        added = await asyncio.gather(*(store.append(KEY, b) for b in batches + batches))
        assert sum(added) == 60
        stored = [m.message_id for m in await store.load(KEY)]
        assert sorted(stored) == sorted(m.message_id for b in batches for m in b)
        for batch in batches:
            start = stored.index(batch[0].message_id)
            assert stored[start : start + 3] == [m.message_id for m in batch]
        assert fast._protocol is protocol  # one connection served all of it


@pytest.mark.reliability
async def test_cancelled_waiters_do_not_desync_the_replies(private_redis: Any) -> None:
    async with open_store(private_redis.url, socket_timeout=5) as store:
        keys = [SessionKey("tenant", f"k{n}") for n in range(30)]
        for n, key in enumerate(keys):
            await store.append(key, make_messages(n + 1, key.session_id))
        fast = resp_of(store)
        # A command the server answers late holds the replies behind it in the pipe.
        slow = asyncio.create_task(fast.call("BLPOP", "nothing-here", 0.3))
        await asyncio.sleep(0.02)
        loads = [asyncio.create_task(store.load(key)) for key in keys]
        counts = [asyncio.create_task(store.count(key)) for key in keys]
        await asyncio.sleep(0.02)  # all written, none answered
        slow.cancel()
        for task in loads[::2] + counts[1::2]:
            task.cancel()
        for n, task in enumerate(loads):
            if n % 2:
                assert [m.text for m in await task] == [f"{keys[n].session_id}-{i}" for i in range(n + 1)]
            else:
                with pytest.raises(asyncio.CancelledError):
                    await task
        for n, task in enumerate(counts):
            if n % 2 == 0:
                assert await task == n + 1
            else:
                with pytest.raises(asyncio.CancelledError):
                    await task
        with pytest.raises(asyncio.CancelledError):
            await slow
        # The connection is still in step: each later call gets its own reply.
        for n, key in enumerate(keys):
            assert await store.count(key) == n + 1
        assert fast._protocol is not None
        assert fast._protocol.broken is None


@pytest.mark.reliability
async def test_a_cancelled_append_is_whole_or_absent(private_redis: Any) -> None:
    async with open_store(private_redis.url) as store:
        await store.count(KEY)
        batch = make_messages(200, "cancel")
        task = asyncio.create_task(store.append(KEY, batch))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stored = [m.message_id for m in await store.load(KEY)]
        assert stored in ([], [m.message_id for m in batch])
        assert await store.append(KEY, batch) == 200 - len(stored)
        assert await store.count(KEY) == 200


@pytest.mark.reliability
async def test_server_restart_fails_pending_calls_then_recovers(private_redis: Any) -> None:
    async with open_store(private_redis.url, socket_timeout=1, connect_timeout=1) as store:
        await store.append(KEY, make_messages(3, "before"))
        fast = resp_of(store)
        slow = asyncio.create_task(fast.call("BLPOP", "nothing-here", 5))
        await asyncio.sleep(0.02)
        pending = [asyncio.create_task(store.load(KEY, last=2)) for _ in range(5)]
        await asyncio.sleep(0.02)
        await private_redis.stop()
        started = time.monotonic()
        outcomes = await asyncio.gather(slow, *pending, return_exceptions=True)
        assert time.monotonic() - started < 10
        for outcome in outcomes[1:]:
            assert isinstance(outcome, StoreUnavailableError), outcome
            assert f"127.0.0.1:{private_redis.port}" in str(outcome)
            assert outcome.__cause__ is not None
        with pytest.raises(StoreUnavailableError) as caught:
            await store.append(KEY, make_messages(1))
        assert "cannot reach Redis" in str(caught.value)

        await private_redis.start()  # empty, and without the store's scripts (NOSCRIPT, then SCRIPT LOAD)
        after = make_messages(2, "after")
        assert await store.append(KEY, after) == 2
        assert [m.text for m in await store.load(KEY)] == ["after-0", "after-1"]
        assert await store.append(KEY, after) == 0


@pytest.mark.reliability
async def test_a_silent_server_times_out_every_waiter_and_the_next_call_reconnects(
    private_redis: Any, proxy: Any
) -> None:
    async with open_store(f"redis://127.0.0.1:{proxy.port}/0", socket_timeout=0.3, connect_timeout=1) as store:
        await store.append(KEY, make_messages(2))
        protocol = resp_of(store)._protocol
        proxy.blackhole = True
        started = time.monotonic()
        outcomes = await asyncio.gather(*(store.count(KEY) for _ in range(4)), return_exceptions=True)
        assert time.monotonic() - started < 5
        for outcome in outcomes:
            assert isinstance(outcome, StoreUnavailableError)
            assert "Timeout" in str(outcome)
            assert f"127.0.0.1:{proxy.port}" in str(outcome)
        assert protocol is not None
        assert protocol.broken is not None
        proxy.blackhole = False
        assert await store.count(KEY) == 2
        assert resp_of(store)._protocol is not protocol


@pytest.mark.reliability
async def test_script_flush_is_recovered_by_script_load(private_redis: Any) -> None:
    async with open_store(private_redis.url) as store:
        await store.append(KEY, make_messages(1, "a"))
        raw = Redis(port=private_redis.port)
        try:
            await raw.script_flush()
        finally:
            await raw.aclose()
        assert await store.append(KEY, make_messages(1, "b")) == 1
        assert await store.count(KEY) == 2


async def test_password_username_and_database_from_the_url(secured_redis: Any) -> None:
    port = secured_redis.port
    raw = Redis(port=port, password="s3cret", db=3)
    try:
        await raw.execute_command("ACL", "SETUSER", "alice", "on", ">w0nder", "~*", "+@all")
        async with open_store(f"redis://:s3cret@127.0.0.1:{port}/3?prefix=p") as store:
            assert await store.append(KEY, make_messages(2)) == 2
            assert await store.count(KEY) == 2
            assert resp_of(store)._protocol is not None
        assert await raw.exists("p:tenants") == 1  # written in database 3
        async with open_store(f"redis://alice:w0nder@127.0.0.1:{port}/3?prefix=p") as store:
            assert len(await store.load(KEY)) == 2
        for url in (f"redis://:wrong@127.0.0.1:{port}/0", f"redis://127.0.0.1:{port}/0"):
            async with open_store(url, connect_timeout=1) as store:
                started = time.monotonic()
                with pytest.raises(StoreUnavailableError) as caught:
                    await store.load(KEY)
                assert time.monotonic() - started < 5
                assert f"127.0.0.1:{port}" in str(caught.value)
                assert "wrong" not in str(caught.value)
                assert "s3cret" not in str(caught.value)
    finally:
        await raw.aclose()


def test_a_new_event_loop_drops_the_old_connection(private_redis: Any) -> None:
    store = open_store(private_redis.url)

    async def first() -> RespTransport:
        await store.append(KEY, make_messages(2))
        return resp_of(store)

    async def second() -> list[Message]:
        try:
            return await store.load(KEY)
        finally:
            await store.close()

    old = asyncio.run(first())
    assert old.closed  # released as its loop shut down
    assert len(asyncio.run(second())) == 2
    assert store._links.all() == []


async def test_close_releases_the_socket(private_redis: Any) -> None:
    store = open_store(private_redis.url)
    await store.count(KEY)
    protocol = resp_of(store)._protocol
    assert protocol is not None
    assert protocol.transport is not None
    await store.close()
    assert protocol.transport.is_closing()
    assert protocol.lost.done()
