"""The Redis backend against the conformance kit, on standalone Redis and on the 3-master cluster."""

from __future__ import annotations

from typing import Any

import pytest

from chatkeep.core import HistoryStore
from chatkeep.redis import open_store
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
