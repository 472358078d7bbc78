"""What the conformance kit does not cover: URLs, key layout and slots, trimming, TTL on every key, the index."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis
from redis.crc import key_slot

import chatkeep.core
from chatkeep.core import (
    ChatkeepError,
    FunctionCallContent,
    FunctionResultContent,
    Message,
    MessageTooLargeError,
    SessionKey,
    StoreConfigurationError,
)
from chatkeep.redis import RedisHistoryProvider, RedisHistoryStore, RedisURLError, _scripts, open_store
from chatkeep.redis._config import RedisSettings, parse_url
from chatkeep.redis._layout import INDEX_GRACE_US, log_keys, pop_receipt, session_keys, usage_key
from chatkeep.testing.telemetry import Telemetry


def _msgs(n: int, label: str = "m") -> list[Message]:
    return [Message(role="user", text=f"{label}-{i}") for i in range(n)]


# -- URLs and options (no server needed) ----------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "driver_url", "cluster", "address"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0", False, "127.0.0.1:6379"),
        ("redis://localhost", "redis://localhost", False, "localhost:6379"),
        ("rediss://:pw@cache.example:6380/2", "rediss://:pw@cache.example:6380/2", False, "cache.example:6380"),
        ("unix:///run/redis.sock?db=1", "unix:///run/redis.sock?db=1", False, "/run/redis.sock"),
        ("redis+cluster://127.0.0.1:7000", "redis://127.0.0.1:7000", True, "127.0.0.1:7000"),
        ("redis+cluster://a:7000,b:7001/", "redis://a:7000", True, "a:7000, b:7001"),
        ("redis://h:1/0?prefix=p&ttl=5&keep_last=9&client_name=x", "redis://h:1/0?client_name=x", False, "h:1"),
    ],
)
def test_urls(url: str, driver_url: str, cluster: bool, address: str) -> None:
    config = parse_url(url)
    assert (config.url, config.cluster, config.address) == (driver_url, cluster, address)


def test_options_and_keyword_overrides() -> None:
    url = "redis://h/0?prefix=app&ttl=2.5&keep_last=100&max_message_bytes=1000&socket_timeout=3&client_name=x"
    config = parse_url(url)
    settings = config.settings
    assert settings.driver_query == (("client_name", "x"),)  # redis-py's own options go to redis-py, in the URL
    assert config.url == "redis://h/0?client_name=x"
    assert (settings.prefix, settings.ttl, settings.keep_last, settings.max_message_bytes) == ("app", 2.5, 100, 1000)
    assert (settings.socket_timeout, settings.connect_timeout) == (3.0, 5.0)
    settings = parse_url("redis://h/0?ttl=2.5", ttl=timedelta(seconds=9), prefix="other", keep_last=None).settings
    assert (settings.ttl, settings.prefix, settings.keep_last) == (9.0, "other", None)  # a timedelta becomes seconds
    store = open_store("redis://h/0?ttl=3&keep_last=7", max_message_bytes=123)
    assert (store.ttl, store.keep_last, store.max_message_bytes, store.prefix) == (3.0, 7, 123, "chatkeep")


def test_the_docs_table_names_every_option() -> None:
    page = (Path(__file__).resolve().parents[3] / "docs" / "backends" / "redis.md").read_text()
    documented = set(re.findall(r"^\| `(\w+)` \|", page, flags=re.MULTILINE))
    assert documented == set(RedisSettings.option_names())


@pytest.mark.parametrize(
    "url",
    [
        "memory://",
        "redis:/localhost",
        "http://localhost",
        "redis://h/0?ttl=soon",
        "redis://h/0?keep_last=0",
        "redis://h/0?max_messages=5",  # the storage cap is keep_last; max_messages is the load window
        "redis://h/0?keep_last=1.5",
        "redis://h/0?bogus=1",  # neither chatkeep's nor redis-py's: refused at open, not at the first command
        "redis://h/0?max_message_bytes=0",
        "redis://h/0?socket_timeout=-1",
        "redis://h/0?prefix=a{b}",
        "redis://h/0?prefix=",
        "redis://h/zero",
        "redis://h:port/0",
        "redis://h/0#frag",
        "redis+cluster://h:7000/3",
        "redis+cluster://",
        "redis+cluster://h:x",
    ],
)
def test_bad_urls_are_refused_clearly(url: str) -> None:
    with pytest.raises(RedisURLError) as caught:
        open_store(url)
    assert isinstance(caught.value, (ChatkeepError, StoreConfigurationError, ValueError))


def test_bad_options_and_passwords_in_messages() -> None:
    with pytest.raises(RedisURLError, match="'tll'; the options are max_message_bytes, ttl, prefix, keep_last,"):
        open_store("redis://h/0", tll=3)
    with pytest.raises(RedisURLError, match="ttl=0 must be a positive"):
        open_store("redis://h/0", ttl=0)
    with pytest.raises(RedisURLError) as caught:
        open_store("redis://:hunter2@h/0?ttl=soon")
    assert "hunter2" not in str(caught.value)
    store = open_store("redis://user:hunter2@h:1/0?prefix=p")
    assert "hunter2" not in repr(store)
    assert "hunter2" not in str(store.describe())


async def test_client_that_decodes_responses_is_refused() -> None:
    client = Redis(decode_responses=True)
    try:
        with pytest.raises(StoreConfigurationError, match="decode_responses"):
            RedisHistoryStore(client=client)
    finally:
        await client.aclose()


def test_plugin_is_discovered_for_every_scheme() -> None:
    backend = next(b for b in chatkeep.core.installed_backends() if b.name == "redis")
    assert set(backend.schemes) == {"redis", "rediss", "unix", "redis+cluster"}
    for url in ("redis://h/0", "rediss://h/0", "unix:///tmp/r.sock", "redis+cluster://h:7000"):
        assert isinstance(chatkeep.core.open_store(url), RedisHistoryStore)


# -- against the server ---------------------------------------------------------------------------


async def test_session_keys_share_a_slot_and_ids_never_reach_other_keys(redis_url: str, redis_prefix: str) -> None:
    pairs = [("a.b", "c"), ("a", "b.c"), ("}{", "x"), ("t", "}{x}"), ("t", "{p}"), ("t:a", "b"), ("t", "a:b")]
    async with open_store(redis_url) as store:
        for n, (tenant, session_id) in enumerate(pairs):
            await store.append(SessionKey(tenant, session_id), [Message(role="user", text=str(n))])
        for n, (tenant, session_id) in enumerate(pairs):
            assert [m.text for m in await store.load(SessionKey(tenant, session_id))] == [str(n)]
    for tenant, session_id in pairs:
        h, m, i, index = session_keys(redis_prefix, tenant, session_id)
        assert key_slot(h.encode()) == key_slot(m.encode()) == key_slot(i.encode())
        assert all(key.startswith(f"{redis_prefix}:{{") for key in (h, m, i, index))
        assert session_id not in h[len(redis_prefix) :] or session_id in ("x",)


async def test_keep_last_trims_in_the_append_and_forgets_trimmed_ids(redis_url: str, raw_redis: Any) -> None:
    key = SessionKey("t", "capped")
    async with open_store(redis_url, keep_last=5) as store:
        first, second = _msgs(3, "a"), _msgs(4, "b")
        assert await store.append(key, first) == 3
        assert await store.append(key, second) == 4
        assert [m.message_id for m in await store.load(key)] == [m.message_id for m in (first + second)[-5:]]
        assert await store.count(key) == 5
        # Idempotency covers messages still stored: a trimmed message's id is forgotten with it.
        assert await store.append(key, second) == 0
        assert await store.append(key, first[:1]) == 1
        assert await store.count(key) == 5
        assert await raw_redis.zcard(session_keys(store.prefix, "t", "capped")[2]) == 5


async def test_a_retried_pop_returns_its_record_instead_of_popping_another(redis_url: str, raw_redis: Any) -> None:
    # redis-py runs a command again when its connection drops, also after the server ran it: the pop's
    # receipt (same slot as the session) makes the second run return the first run's record.
    key = SessionKey("t", "popped")
    async with open_store(redis_url) as store:
        batch = _msgs(6)
        await store.append(key, batch)
        h, m, i, _ = session_keys(store.prefix, "t", "popped")
        receipt = pop_receipt(h, "retried")
        assert key_slot(receipt.encode()) == key_slot(h.encode())
        args = (1, 0, 60_000, "t", "popped")
        keys = (h, m, i, usage_key(h), receipt)
        first = await store._script(_scripts.POP, keys, args)
        again = await store._script(_scripts.POP, keys, args)
        assert first == again
        assert Message.from_record(first.decode()).message_id == batch[-1].message_id
        assert 0 < await raw_redis.pttl(receipt) <= 60_000
        assert await store.count(key) == 5
        assert await raw_redis.zcard(i) == 5  # the popped id left the id set with its record
        assert await store.append(key, batch) == 1
        assert [m.message_id for m in await store.load(key)] == [m.message_id for m in batch]


async def test_ttl_is_set_on_every_key_of_the_session(redis_url: str, raw_redis: Any) -> None:
    key, lasting = SessionKey("t", "ttl"), SessionKey("t", "lasting")
    async with open_store(redis_url, ttl=60) as store, open_store(redis_url) as plain:
        await store.append(key, _msgs(2))
        await store.save_session(key, chatkeep.core.AgentSession(session_id="ttl", tenant="t"))
        await plain.append(lasting, _msgs(1))
        for name in session_keys(store.prefix, "t", "ttl")[:3]:
            assert 0 < await raw_redis.pttl(name) <= 60_000, name
        for name in session_keys(store.prefix, "t", "lasting")[:3]:
            assert await raw_redis.pttl(name) == -1, name


async def test_dead_index_entries_are_skipped_and_old_ones_dropped(redis_url: str, raw_redis: Any) -> None:
    async with open_store(redis_url) as store:
        await store.append(SessionKey("t", "alive"), _msgs(1))
        index = session_keys(store.prefix, "t", "x")[3]
        now = time.time_ns() // 1000
        # A crash after the index write, long ago; and a write under way right now.
        await raw_redis.zadd(index, {"crashed": now - INDEX_GRACE_US - 1_000_000, "in-flight": now})
        page = await store.list_sessions("t")
        assert [i.session_id for i in page.items] == ["alive"]
        assert await raw_redis.zscore(index, "crashed") is None
        assert await raw_redis.zscore(index, "in-flight") is not None


async def test_load_last_reads_only_the_window(redis_url: str) -> None:
    key = SessionKey("t", "window")
    async with open_store(redis_url) as writer, open_store(redis_url) as reader:
        await writer.append(key, [Message(role="user", text=f"{n}-" + "x" * 10_000) for n in range(200)])
        window = await reader.load(key, last=3)
        assert [m.text.split("-")[0] for m in window] == ["197", "198", "199"]
        assert reader.messages_read == 3
        assert 30_000 < reader.bytes_read < 31_000


async def test_spans_name_redis_and_its_server(redis_target: str, redis_url: str, telemetry: Telemetry) -> None:
    target = urlsplit(redis_target)
    async with open_store(redis_url) as store:
        await store.count(SessionKey("tenant", "telemetry"))
    assert telemetry.span("count").attributes == {
        "db.system.name": "redis",
        "db.operation.name": "count",
        "server.address": target.hostname,
        "server.port": target.port,
    }


async def test_oversized_message_writes_no_key(redis_url: str, raw_redis: Any, redis_prefix: str) -> None:
    async with open_store(redis_url, max_message_bytes=1_000) as store:
        with pytest.raises(MessageTooLargeError):
            await store.append(
                SessionKey("t", "big"), [Message(role="user", text="ok"), Message(role="user", text="x" * 2_000)]
            )
    assert [key async for key in raw_redis.scan_iter(match=f"{redis_prefix}:*")] == []


async def test_iteration_survives_a_trim_between_pages(redis_url: str) -> None:
    key = SessionKey("t", "iter")
    async with open_store(redis_url) as store:
        await store.append(key, _msgs(10))
        pages = store.iter_messages(key, batch=4)
        seen = [(await pages.__anext__()).text for _ in range(4)]
        await store.trim(key, 3)  # drops 0..6: the iterator resumes at the oldest message still stored after 3
        seen += [m.text async for m in pages]
        assert seen == ["m-0", "m-1", "m-2", "m-3", "m-7", "m-8", "m-9"]


async def test_provider_never_starts_a_trimmed_history_with_an_orphan_tool_result(redis_url: str) -> None:
    key = SessionKey("default", "tools")
    call = Message(role="assistant", contents=[FunctionCallContent(call_id="c1", name="weather")])
    result = Message(role="tool", contents=[FunctionResultContent(call_id="c1", result="sunny")])
    answer = Message(role="assistant", text="It is sunny.")
    async with open_store(redis_url, keep_last=2) as store:
        await store.append(key, [Message(role="user", text="weather?"), call, result, answer])
        assert [m.role for m in await store.load(key)] == ["tool", "assistant"]  # the call was trimmed away
        provider = RedisHistoryProvider(store, max_messages=10)
        loaded = await provider.get_messages("tools", key=key)
        assert [m.message_id for m in loaded] == [answer.message_id]
        await provider.close()
        assert not store.closed  # the provider does not own a store handed to it


async def test_provider_from_url_owns_its_store(redis_url: str) -> None:
    provider = RedisHistoryProvider(redis_url, max_messages=2)
    await provider.save_messages("s", _msgs(3), key=SessionKey("t", "s"))
    assert [m.text for m in await provider.get_messages("s", key=SessionKey("t", "s"))] == ["m-1", "m-2"]
    await provider.close()
    assert provider.store.closed


async def _session_keys_left(raw_redis: Any, prefix: str) -> list[str]:
    """The keys under ``prefix`` in a session's slot (``{T.S}``): messages, logs, hold counts, hashes."""
    found = [key.decode() async for key in raw_redis.scan_iter(match=f"{prefix}:*", count=1000)]
    # Pop receipts (``:p:``) outlive their session by design, for a minute.
    return sorted(key for key in found if re.search(r"\{[^}]*\.[^}]*\}", key) and ":p:" not in key)


async def test_the_last_session_holding_a_shared_log_frees_it_and_none_before(redis_url: str, raw_redis: Any) -> None:
    # Forks of a source and a fork of a fork, in as many slots: each log goes with the last session holding it.
    async with open_store(redis_url) as store:
        source, a, b, c = (SessionKey("t", name) for name in ("holds-src", "holds-a", "holds-b", "holds-c"))
        await store.append(source, _msgs(6, "src"))
        assert await store.fork(source, a) == 6
        await store.append(a, _msgs(2, "a"))
        assert await store.fork(source, b, through=(await store.load(source))[2].message_id) == 3
        assert await store.fork(a, c) == 8  # c holds the source's log (a's segment) and a's own log
        await store.append(c, _msgs(1, "c"))
        seen = {key: [m.text for m in await store.load(key)] for key in (a, b, c)}
        shared = [k for k in await _session_keys_left(raw_redis, store.prefix) if ":r:" in k]
        assert len(shared) == 2, shared  # the source's log and a's, each with its hold count

        await store.delete(source)
        await store.delete(a)
        for key in (b, c):  # their holds keep both logs
            assert [m.text for m in await store.load(key)] == seen[key]
            assert [m.text async for m in store.iter_messages(key, batch=2)] == seen[key]
        for _ in range(3):  # b pops every message it inherited: its segment, and its hold, go
            await store.pop(b)
        assert await store.count(b) == 0
        assert [m.text for m in await store.load(c)] == seen[c]
        assert await store.trim(c, 1) == 8  # c lets go of both logs, which nobody holds any more
        assert [m.text for m in await store.load(c)] == ["c-0"]
        left = await _session_keys_left(raw_redis, store.prefix)
        assert not [k for k in left if ":r:" in k or ":m:" in k], left
        await store.delete(b)
        await store.delete(c)
        assert await _session_keys_left(raw_redis, store.prefix) == []


async def test_deleting_a_tenant_of_forks_frees_their_logs(redis_url: str, raw_redis: Any) -> None:
    async with open_store(redis_url) as store:
        source = SessionKey("gone", "root")
        await store.append(source, _msgs(4))
        for n in range(3):
            await store.fork(source, SessionKey("gone", f"fork-{n}"))
            await store.fork(SessionKey("gone", f"fork-{n}"), SessionKey("gone", f"fork-{n}-{n}"))
        assert await store.delete_tenant("gone") == 7
        assert await _session_keys_left(raw_redis, store.prefix) == []


async def test_a_fork_onto_an_existing_target_gives_its_holds_back(redis_url: str, raw_redis: Any) -> None:
    async with open_store(redis_url) as store:
        source, fork, taken = SessionKey("t", "giver"), SessionKey("t", "giver-fork"), SessionKey("t", "taken")
        await store.append(source, _msgs(3))
        await store.fork(source, fork)
        await store.append(taken, _msgs(1))
        for origin in (source, fork):  # a log of the source's slot, and one of another slot
            with pytest.raises(chatkeep.core.ConcurrencyConflictError):
                await store.fork(origin, taken)
        for key in (source, fork, taken):
            await store.delete(key)
        assert await _session_keys_left(raw_redis, store.prefix) == []


async def test_keep_last_on_a_fork_trims_what_it_inherited_and_never_its_source(redis_url: str, raw_redis: Any) -> None:
    # The append's own cut cannot reach a log the fork shares (another slot): the store trims after it.
    source, fork = SessionKey("t", "kept"), SessionKey("t", "kept-fork")
    async with open_store(redis_url, keep_last=5) as store:
        await store.append(source, _msgs(5, "src"))
        assert await store.fork(source, fork) == 5
        h = session_keys(store.prefix, "t", "kept")[0]
        assert await raw_redis.hget(h, "shared") == b"1"  # the source's log, renamed once, is the fork's too
        assert await raw_redis.exists(session_keys(store.prefix, "t", "kept")[1]) == 0
        assert await store.append(fork, _msgs(3, "own")) == 3
        kept = await store.load(fork)
        assert [m.text for m in kept] == ["src-3", "src-4", "own-0", "own-1", "own-2"]
        assert await store.count(fork) == 5
        assert [m.text for m in await store.load(source)] == [f"src-{n}" for n in range(5)]
        assert await store.usage(fork) == chatkeep.core.backend.usage_of(kept)


async def test_a_log_shared_before_logs_counted_their_holders_is_never_freed(redis_url: str, raw_redis: Any) -> None:
    # Forks made by the first release of forks left no count beside the logs they share: nobody knows who
    # holds such a log, so deleting its sessions keeps it, and the forks keep reading it.
    async with open_store(redis_url) as store:
        source, old, new = SessionKey("t", "counted-not"), SessionKey("t", "old-fork"), SessionKey("t", "new-fork")
        await store.append(source, _msgs(3))
        await store.fork(source, old)
        counts = [k for k in await _session_keys_left(raw_redis, store.prefix) if ":r:" in k]
        assert len(counts) == 1
        await raw_redis.delete(counts[0])  # as that release stored it
        await store.fork(source, new)
        await store.fork(old, SessionKey("t", "old-fork-fork"))
        await store.delete(source)
        await store.delete(old)
        for key in (new, SessionKey("t", "old-fork-fork")):
            assert [m.text for m in await store.load(key)] == ["m-0", "m-1", "m-2"]
            await store.delete(key)
        assert [k for k in await _session_keys_left(raw_redis, store.prefix) if ":r:" in k] == []
        assert [k for k in await _session_keys_left(raw_redis, store.prefix) if ":m:" in k] != []  # kept


async def _write(store: RedisHistoryStore, key: SessionKey, write: str) -> None:
    """One write of ``key`` of each kind that restarts its TTL."""
    if write == "append":
        assert await store.append(key, _msgs(1, "new")) == 1
    elif write == "pop":
        assert await store.pop(key) is not None
    elif write == "trim":
        assert await store.trim(key, 2) >= 1
    elif write == "update_info":
        assert await store.update_info(key, title="kept")
    else:
        await store.save_session(key, chatkeep.core.AgentSession(session_id=key.session_id, tenant=key.tenant))


@pytest.mark.parametrize("write", ["append", "pop", "trim", "update_info", "save_session"])
@pytest.mark.parametrize("writer", ["fork", "source"])
async def test_a_write_under_a_ttl_keeps_alive_the_shared_log_a_session_holds(
    redis_url: str, raw_redis: Any, writer: str, write: str
) -> None:
    # The fork holds its source's log (renamed, shared, in the source's slot) by reference: each write of the fork
    # restarts its TTL, and must lengthen that log's as far, or the fork loses the history it inherited while it is
    # in use. The source, once it popped, holds the shared log as a segment of its own slot: the same holds there.
    usage = chatkeep.core.Usage(input_tokens=3, output_tokens=1, total_tokens=4)
    used = Message(role="assistant", contents=[chatkeep.core.UsageContent(usage=usage)])  # a usage key too
    source, fork = SessionKey("t", "ttl-source"), SessionKey("t", "ttl-fork")
    async with open_store(redis_url, ttl=60) as store:
        await store.append(source, [*_msgs(3, "src"), used])
        assert await store.fork(source, fork) == 4
        h, m, _, _ = session_keys(store.prefix, "t", "ttl-source")
        shared = log_keys(f"{m}:{(await raw_redis.hget(h, 'log')).decode()}")  # hold count, records, ids, usage
        assert await raw_redis.exists(*shared) == 4
        if writer == "source":
            assert (await store.pop(source)).message_id == used.message_id  # the shared log becomes a segment
            assert await raw_redis.hget(h, "segs") is not None
        for name in shared:  # idle since: 57 of the TTL's 60 seconds went by
            assert await raw_redis.pexpire(name, 3_000)
        await _write(store, fork if writer == "fork" else source, write)
        for name in shared:
            assert await raw_redis.pttl(name) > 50_000, name
