"""The memory backend against the conformance kit."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from chatkeep.core import HistoryStore
from chatkeep.memory import MemoryHistoryStore
from chatkeep.testing import FakeClock, HistoryStoreConformance, StoreFactory


class TestMemoryConformance(HistoryStoreConformance):
    native_ttl = True
    multi_process = False  # the data lives in one process

    @pytest.fixture
    def ttl_clock(self) -> FakeClock:
        return FakeClock()  # every store of a test expires by it, and the kit's TTL tests move it: no waiting

    @pytest.fixture
    def make_store(self, ttl_clock: FakeClock) -> StoreFactory:
        namespace = f"conformance-{uuid.uuid4().hex}"

        def make(**options: Any) -> HistoryStore:
            return MemoryHistoryStore(namespace=namespace, clock=ttl_clock, **options)

        return make

    async def index_entries_in_raw_storage(self, store: HistoryStore, tenant: str) -> int:
        assert isinstance(store, MemoryHistoryStore)
        return index_entries(store, tenant)


def index_entries(store: MemoryHistoryStore, tenant: str) -> int:
    """The index entries a memory store's namespace holds for ``tenant``, read behind the store's API."""
    with store._data.lock:
        return sum(len(session.entries) for session in store._data.tenants.get(tenant, {}).values())
