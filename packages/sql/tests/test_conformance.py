"""The SQL backend against the conformance kit, on each database under test (see conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest

from chatkeep.core import HistoryStore
from chatkeep.sql import SQLHistoryStore
from chatkeep.testing import HistoryStoreConformance, StoreFactory


class TestSQLConformance(HistoryStoreConformance):
    native_ttl = False  # no engine-side expiry: prune(older_than=...) is the retention tool
    multi_process = True  # every process reaches the same database through store_url

    @pytest.fixture
    def store_url(self, sql_target: Any) -> str:
        return sql_target.url

    @pytest.fixture
    def make_store(self, store_url: str) -> StoreFactory:
        def make(**options: Any) -> HistoryStore:
            return SQLHistoryStore(store_url, **options)

        return make

    async def messages_read(self, store: HistoryStore) -> int:
        assert isinstance(store, SQLHistoryStore)
        assert store.uses_fast_path, "this class runs the kit on the fast path"
        return store.messages_read


# The drivers each database's fast path replaces: SQLAlchemy's async adapters all the way down.
_BASELINE_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+psycopg", "mysql": "mysql+aiomysql"}


class TestSQLBaselineConformance(TestSQLConformance):
    """The same kit on the path without the fast ones (stdlib sqlite3 runner, native asyncpg / asyncmy calls)."""

    @pytest.fixture
    def store_url(self, sql_target: Any) -> str:
        _, rest = sql_target.url.split("://", 1)
        return f"{_BASELINE_DRIVERS[sql_target.family]}://{rest}"

    async def messages_read(self, store: HistoryStore) -> int:
        assert isinstance(store, SQLHistoryStore)
        assert not store.uses_fast_path, "the baseline class must not run on a fast path"
        return store.messages_read
