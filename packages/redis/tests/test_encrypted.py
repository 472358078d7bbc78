"""EncryptedStore over the Redis backend: the conformance kit through the wrapper, and a plaintext canary search."""

from __future__ import annotations

import os
from typing import Any

import pytest

from chatkeep.core import AgentSession, HistoryStore, Message, SessionKey
from chatkeep.core.encryption import EncryptedStore
from chatkeep.redis import RedisHistoryStore, open_store
from chatkeep.testing import (
    ForkConformance,
    HistoryStoreConformance,
    InfoConformance,
    StoreFactory,
    UsageConformance,
    not_implemented_yet,
)
from chatkeep.testing.encryption import ENCRYPTED_STORE_LACKS, BackingFactory, EncryptionConformance

MASTER = {"k1": os.urandom(32)}
CANARY = "canary-9c2d-plaintext-must-never-be-stored"


def encrypted(redis_url: str, **options: Any) -> EncryptedStore:
    # The wrapped data keys live under another prefix of their own (cleaned up with the test's prefix).
    return EncryptedStore(
        open_store(redis_url, **options), key_store=open_store(redis_url + "-keys"), master_keys=MASTER
    )


@not_implemented_yet(
    ForkConformance,
    UsageConformance,
    InfoConformance,
    reason=ENCRYPTED_STORE_LACKS,
)
class TestEncryptedRedisConformance(HistoryStoreConformance):
    native_ttl = True
    multi_process = False  # the child processes open plain stores by URL; the wrapper is not a URL scheme

    @pytest.fixture
    def make_store(self, redis_url: str) -> StoreFactory:
        def make(**options: Any) -> HistoryStore:
            return encrypted(redis_url, **options)

        return make

    async def messages_read(self, store: HistoryStore) -> int:
        assert isinstance(store, EncryptedStore)
        assert isinstance(store.inner, RedisHistoryStore)
        return store.inner.messages_read


class TestEncryptionOverRedis(EncryptionConformance):
    @pytest.fixture
    def open_backing(self, redis_url: str) -> BackingFactory:
        # Each named backing is a key prefix under the test's own (cleaned up with it).
        def open_backing(name: str) -> HistoryStore:
            return open_store(f"{redis_url}-{name}")

        return open_backing


async def test_plaintext_canary_is_in_no_key(redis_url: str, redis_prefix: str, raw_redis: Any) -> None:
    key = SessionKey("acme", "canary")
    async with encrypted(redis_url) as store:
        await store.append(key, [Message(role="user", text=f"secret {CANARY}", author_name=CANARY)])
        await store.save_session(key, AgentSession(session_id="canary", tenant="acme", state={"note": CANARY}))
        assert CANARY in (await store.load(key))[0].text
    dump = []
    async for name in raw_redis.scan_iter(match=f"{redis_prefix}*", count=1000):
        kind = (await raw_redis.type(name)).decode()
        if kind == "list":
            dump += await raw_redis.lrange(name, 0, -1)
        elif kind == "hash":
            dump += [v for pair in (await raw_redis.hgetall(name)).items() for v in pair]
        elif kind in ("set", "zset"):
            dump += list(await (raw_redis.smembers(name) if kind == "set" else raw_redis.zrange(name, 0, -1)))
        elif kind == "string":
            dump.append(await raw_redis.get(name))
    assert dump  # the keys do hold the session
    assert not any(CANARY.encode() in value for value in dump)
