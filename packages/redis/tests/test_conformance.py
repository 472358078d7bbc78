"""The Redis backend against the conformance kit: standalone Redis on each transport, and the 3-master cluster."""

from __future__ import annotations

from typing import Any

import pytest

from chatkeep.core import HistoryStore, UnsupportedOperationError
from chatkeep.redis import RedisHistoryStore, open_store
from chatkeep.testing import (
    ForkConformance,
    HistoryStoreConformance,
    StoreFactory,
    StoreKit,
    not_implemented_yet,
)

_NO_FORKS = "forks are not implemented yet on Redis: issue 22"
_needs_forks = pytest.mark.xfail(strict=True, reason=_NO_FORKS, raises=UnsupportedOperationError)


@not_implemented_yet(ForkConformance, reason=_NO_FORKS)
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

    @_needs_forks
    async def test_a_fork_uses_what_it_took(self, kit: StoreKit, store: HistoryStore) -> None:
        await super().test_a_fork_uses_what_it_took(kit, store)

    @_needs_forks
    async def test_a_fork_starts_with_its_source_info(self, kit: StoreKit, store: HistoryStore) -> None:
        await super().test_a_fork_starts_with_its_source_info(kit, store)
