"""The Redis backend against the conformance kit, on standalone Redis and on the 3-master cluster."""

from __future__ import annotations

from typing import Any

import pytest

from chatkeep.core import HistoryStore
from chatkeep.redis import RedisHistoryStore, open_store
from chatkeep.testing import HistoryStoreConformance, StoreFactory


class TestRedisConformance(HistoryStoreConformance):
    native_ttl = True
    multi_process = True

    @pytest.fixture
    def store_url(self, redis_url: str) -> str:
        return redis_url

    @pytest.fixture
    def make_store(self, store_url: str) -> StoreFactory:
        def make(**options: Any) -> HistoryStore:
            return open_store(store_url, **options)

        return make


class TestRedisBaselineConformance(TestRedisConformance):
    """The same kit with every command on redis-py: a query option for redis-py turns the fast connection off."""

    @pytest.fixture
    def store_url(self, redis_url: str) -> str:
        return redis_url + ("&" if "?" in redis_url else "?") + "client_name=chatkeep-kit"

    @pytest.fixture
    def make_store(self, store_url: str) -> StoreFactory:
        def make(**options: Any) -> HistoryStore:
            store = open_store(store_url, **options)
            assert isinstance(store, RedisHistoryStore)
            assert store._fast_target is None, "expected every command on redis-py"
            return store

        return make
