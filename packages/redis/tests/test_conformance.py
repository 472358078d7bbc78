"""The Redis backend against the conformance kit: standalone Redis on each transport, and the 3-master cluster."""

from __future__ import annotations

from typing import Any

import pytest

from chatkeep.core import HistoryStore
from chatkeep.redis import RedisHistoryStore, open_store
from chatkeep.testing import (
    HistoryStoreConformance,
    StoreFactory,
)


class TestRedisConformance(HistoryStoreConformance):
    """The whole kit once per transport that serves the target (``redis_transport``, see conftest.py)."""

    native_ttl = True
    multi_process = True

    @pytest.fixture
    def store_url(self, redis_url: str, redis_transport: str) -> str:
        return f"{redis_url}&transport={redis_transport}"

    @pytest.fixture
    def make_store(self, store_url: str, redis_transport: str) -> StoreFactory:
        def make(**options: Any) -> HistoryStore:
            store = open_store(store_url, **options)
            assert isinstance(store, RedisHistoryStore)
            assert store.transport == redis_transport
            return store

        return make
