"""``wait_replicas``: writes that return only once replicas have them (Redis WAIT), and the options' checks.

The shared servers have no replicas, so there every waiting write times out and says so; a private master with
a private replica shows the write on the replica by the time the call returns. The failover of a replicated
cluster is in test_failover.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from redis.asyncio import Redis

from chatkeep.core import (
    AgentSession,
    ConcurrencyConflictError,
    Message,
    ReplicationTimeoutError,
    SessionKey,
    StoreUnavailableError,
)
from chatkeep.redis import RedisHistoryStore, RedisURLError, open_store
from chatkeep.redis._layout import session_keys
from chatkeep.testing.faults import free_port

KEY = SessionKey("tenant", "replicated")


def messages(n: int, label: str = "m") -> list[Message]:
    return [Message(role="user", text=f"{label}-{i}") for i in range(n)]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"wait_replicas": -1}, "wait_replicas=-1"),
        ({"wait_replicas": "two"}, "wait_replicas='two'"),
        ({"wait_replicas": True}, "wait_replicas=True"),
        ({"wait_timeout_ms": 0}, "wait_timeout_ms=0"),
        ({"wait_timeout_ms": "1.5"}, "wait_timeout_ms='1.5'"),
    ],
)
@pytest.mark.parametrize("given_as", ["keyword", "query"])
def test_malformed_wait_options_are_refused_at_open(options: dict[str, Any], named: str, given_as: str) -> None:
    ((name, value),) = options.items()
    url, keywords = "redis://127.0.0.1:6379/0", options
    if given_as == "query":
        url, keywords = f"{url}?{name}={str(value).lower() if value is True else value}", {}
    with pytest.raises(RedisURLError) as caught:
        open_store(url, **keywords)
    message = str(caught.value)
    assert named.split("=")[0] in message
    assert "whole number" in message


def test_a_wait_as_long_as_the_socket_timeout_is_refused() -> None:
    with pytest.raises(RedisURLError) as caught:
        open_store("redis://127.0.0.1:6379/0?wait_replicas=1&wait_timeout_ms=2000", socket_timeout=2)
    assert "wait_timeout_ms=2000 is not shorter than socket_timeout=2 s" in str(caught.value)
    assert "lower wait_timeout_ms or raise socket_timeout" in str(caught.value)
    # Without wait_replicas the timeout is not used, and shorter ones are fine.
    open_store("redis://127.0.0.1:6379/0?wait_timeout_ms=2000", socket_timeout=2)
    store = open_store("redis+cluster://127.0.0.1:7000?wait_replicas=2&wait_timeout_ms=1999", socket_timeout=2)
    assert store.describe()["wait_replicas"] == 2
    assert store.config.settings.wait_timeout_ms == 1999
    assert open_store().config.settings.wait_replicas == 0  # the default: no WAIT


async def test_without_replicas_a_waiting_append_is_stored_and_says_it_was_not_confirmed(redis_url: str) -> None:
    batch = messages(2)
    async with open_store(redis_url, wait_replicas=1, wait_timeout_ms=50) as store:
        with pytest.raises(ReplicationTimeoutError) as caught:
            await store.append(KEY, batch)
        error = caught.value
        assert (error.acknowledged, error.required, error.timeout_ms) == (0, 1, 50)
        assert isinstance(error, StoreUnavailableError)
        message = str(error)
        assert "only 0 of 1 replicas confirmed it within 50 ms" in message
        assert "NOT undone" in message
        assert "idempotent by message_id" in message
        # The write happened, and a retry adds nothing twice (and waits again).
        assert await store.count(KEY) == 2
        with pytest.raises(ReplicationTimeoutError):
            await store.append(KEY, batch)
        assert [m.message_id for m in await store.load(KEY)] == [m.message_id for m in batch]

        with pytest.raises(ReplicationTimeoutError) as saved:
            await store.save_session(KEY, AgentSession(session_id=KEY.session_id, tenant=KEY.tenant))
        assert "load the session" in str(saved.value)
        assert await store.load_session(KEY) is not None

        # A pop waits too; it is not undone either, so the error hands over what it removed and warns off a retry.
        with pytest.raises(ReplicationTimeoutError) as popped:
            await store.pop(KEY)
        assert popped.value.popped is not None
        assert popped.value.popped.message_id == batch[-1].message_id
        assert "Do not retry the pop" in str(popped.value)
        assert [m.message_id for m in await store.load(KEY)] == [batch[0].message_id]
        await store.delete(KEY)


async def test_without_replicas_a_waiting_fork_and_update_info_are_stored_and_say_so(redis_url: str) -> None:
    source, fork = SessionKey("tenant", "fork-source"), SessionKey("tenant", "fork-target")
    async with open_store(redis_url) as plain:
        await plain.append(source, messages(3))
    async with open_store(redis_url, wait_replicas=1, wait_timeout_ms=50) as store:
        with pytest.raises(ReplicationTimeoutError) as forked:
            await store.fork(source, fork)
        assert "only 0 of 1 replicas" in str(forked.value)
        assert "Do not retry the fork" in str(forked.value)
        assert await store.count(fork) == 3  # stored all the same
        with pytest.raises(ConcurrencyConflictError):
            await store.fork(source, fork)  # what the message warns of

        with pytest.raises(ReplicationTimeoutError) as tagged:
            await store.update_info(fork, title="kept", tags={"t"})
        assert "update_info" in str(tagged.value)
        page = await store.list_sessions(fork.tenant, tag="t")
        assert [(info.session_id, info.title) for info in page.items] == [(fork.session_id, "kept")]
        # A session that does not exist writes nothing, so there is nothing to wait for.
        assert await store.update_info(SessionKey("tenant", "nobody"), title="x") is False


async def test_a_refused_save_is_not_reported_as_unreplicated(redis_url: str) -> None:
    async with open_store(redis_url, wait_replicas=1, wait_timeout_ms=50) as store:
        with pytest.raises(ConcurrencyConflictError):
            await store.save_session(KEY, AgentSession(tenant=KEY.tenant), expected_version="not-stored")


class Pair:
    """A private master and its private replica."""

    def __init__(self, master: Any, replica: Any) -> None:
        self.master = master
        self.replica = replica

    async def replica_client(self) -> Redis:
        """A client on the replica (reads only: a replica refuses writes)."""
        return Redis(port=self.replica.port)

    async def in_sync(self) -> None:
        client = Redis(port=self.replica.port, decode_responses=True)
        try:
            for _ in range(200):
                if (await client.info("replication")).get("master_link_status") == "up":
                    return
                await asyncio.sleep(0.05)
        finally:
            await client.aclose()
        raise RuntimeError("the private replica did not sync with its master")


@pytest_asyncio.fixture(loop_scope="function")
async def pair(private_redis: Any) -> AsyncIterator[Pair]:
    """A private replica of the private redis-server, in sync when the test starts."""
    replica = type(private_redis)(free_port(), "--replicaof", "127.0.0.1", str(private_redis.port))
    await replica.start()
    try:
        both = Pair(private_redis, replica)
        await both.in_sync()
        yield both
    finally:
        await replica.stop()


@pytest.mark.reliability
@pytest.mark.parametrize("connection", ["fast", "redis-py client"])
async def test_a_waiting_append_is_on_the_replica_when_it_returns(pair: Pair, connection: str) -> None:
    handed = Redis(port=pair.master.port) if connection == "redis-py client" else None
    store = (
        RedisHistoryStore(client=handed, wait_replicas=1, wait_timeout_ms=2000)
        if handed is not None
        else open_store(pair.master.url, wait_replicas=1, wait_timeout_ms=2000)
    )
    replica = await pair.replica_client()
    m = session_keys("chatkeep", KEY.tenant, KEY.session_id)[1]
    try:
        for n in range(1, 21):
            assert await store.append(KEY, messages(1, f"turn-{n}")) == 1
            # No sleep, no polling: WAIT returned only once the replica had it.
            assert await replica.llen(m) == n
        await store.save_session(KEY, AgentSession(session_id=KEY.session_id, tenant=KEY.tenant))
        assert await replica.hget(session_keys("chatkeep", KEY.tenant, KEY.session_id)[0], "doc") is not None
        popped = await store.pop(KEY)
        assert popped is not None
        assert popped.text == "turn-20-0"
        assert await replica.llen(m) == 19  # the pop, too, was on the replica when it returned
        assert await store.append(KEY, [popped]) == 1  # put back, for the rest of the test
        assert await replica.llen(m) == 20

        await pair.replica.stop()
        unconfirmed = messages(1, "unconfirmed")
        with pytest.raises(ReplicationTimeoutError) as caught:
            await store.append(KEY, unconfirmed)
        assert "only 0 of 1 replicas" in str(caught.value)
        await pair.replica.start()  # empty (no persistence): it syncs everything from the master again
        await pair.in_sync()
        await replica.aclose()
        replica = await pair.replica_client()
        # The retry of the unconfirmed append adds nothing and waits for the replica, which then has it all.
        assert await store.append(KEY, unconfirmed) == 0
        assert await replica.llen(m) == 21
    finally:
        await store.close()
        await replica.aclose()
        if handed is not None:
            await handed.aclose()


@pytest.mark.reliability
async def test_a_waiting_fork_and_update_info_are_on_the_replica_when_they_return(pair: Pair) -> None:
    source, fork, again = KEY, SessionKey(KEY.tenant, "fork"), SessionKey(KEY.tenant, "fork-of-fork")
    replica = await pair.replica_client()
    try:
        async with open_store(pair.master.url, wait_replicas=1, wait_timeout_ms=2000) as store:
            await store.append(source, messages(3))
            for origin, target in ((source, fork), (fork, again)):  # the second holds a log of another slot
                assert await store.fork(origin, target) == 3
                # No sleep, no polling: WAIT returned only once the replica had the target.
                assert await replica.hget(session_keys("chatkeep", target.tenant, target.session_id)[0], "segs")
            assert await store.update_info(again, title="on the replica") is True
            stored = await replica.hget(session_keys("chatkeep", again.tenant, again.session_id)[0], "title")
            assert stored == b"on the replica"
    finally:
        await replica.aclose()


@pytest.mark.reliability
async def test_a_retried_append_makes_wait_cover_what_an_earlier_call_stored(pair: Pair) -> None:
    """A retry that adds nothing still sends the replicas a write, so its WAIT counts the stored messages.

    WAIT counts replicas that have this connection's writes; a retry from another connection (another store,
    another process) that wrote nothing would be confirmed at once, whatever the replicas have.
    """
    batch = messages(3)
    master = Redis(port=pair.master.port, decode_responses=True)
    try:
        async with open_store(pair.master.url) as plain:
            await plain.append(KEY, batch)
            before = (await master.info("replication"))["master_repl_offset"]
            assert await plain.append(KEY, batch) == 0
            assert (await master.info("replication"))["master_repl_offset"] == before  # plain: nothing sent
        async with open_store(pair.master.url, wait_replicas=1, wait_timeout_ms=2000) as waiting:
            assert await waiting.append(KEY, batch) == 0
        assert (await master.info("replication"))["master_repl_offset"] > before
    finally:
        await master.aclose()
