"""The SQL backend against the conformance kit, on each database under test (see conftest.py), once per transport."""

from __future__ import annotations

from typing import Any

import pytest

from chatkeep.core import HistoryStore, SessionKey
from chatkeep.core.backend import SearchableStore
from chatkeep.sql import SQLHistoryStore
from chatkeep.sql._schema import key_hash, tenant_hash
from chatkeep.testing import (
    DocumentDamager,
    HistoryStoreConformance,
    SearchConformance,
    StoreFactory,
)

#: Each database's transports: the driver's own (the default) and SQLAlchemy's engine.
TRANSPORTS = {"sqlite": "sqlite3", "postgresql": "asyncpg", "mysql": "asyncmy"}


@pytest.fixture(params=["driver", "sqlalchemy", "apsw"])
def transport(request: pytest.FixtureRequest, sql_target: Any) -> str:
    """The transport the kit runs on: the database's default (``driver``), ``sqlalchemy``, or on SQLite ``apsw``."""
    if request.param == "apsw":
        if sql_target.family != "sqlite":
            pytest.skip("apsw is a SQLite transport")
        pytest.importorskip("apsw", reason="the apsw transport needs chatkeep-sql[recall]")
    return TRANSPORTS[sql_target.family] if request.param == "driver" else request.param


TENANT_INDEX_ROWS = (
    "SELECT count(*) FROM chatkeep_search x JOIN chatkeep_sessions s ON s.id = x.session_ref WHERE s.tenant_hash = ?"
)
#: SQLite's virtual tables of the index, whose rows a trigger removes with chatkeep_search's: any left is an orphan.
SQLITE_ORPHANS = (
    "SELECT (SELECT count(*) FROM chatkeep_search_vec WHERE rowid NOT IN (SELECT id FROM chatkeep_search)) "
    "+ (SELECT count(*) FROM chatkeep_search_fts WHERE rowid NOT IN (SELECT id FROM chatkeep_search))"
)


def postgres_index_entries(target: Any, tenant: str) -> int:
    """The tenant's rows of ``chatkeep_search`` (each references its message, so an orphan cannot exist)."""
    return int(target.execute_in(target.name, [(TENANT_INDEX_ROWS, (tenant_hash(tenant),))])[0][0])


def sqlite_index_entries(path: str, tenant: str) -> int:
    """The tenant's rows of ``chatkeep_search``, and the orphans of its vector and keyword tables, read with apsw."""
    import apsw
    import sqlite_vec

    conn = apsw.Connection(path)
    try:
        conn.enable_load_extension(True)
        conn.load_extension(sqlite_vec.loadable_path())
        [(rows,)] = conn.execute(TENANT_INDEX_ROWS, (tenant_hash(tenant),)).fetchall()
        [(orphans,)] = conn.execute(SQLITE_ORPHANS).fetchall()
        return int(rows) + int(orphans)
    finally:
        conn.close()


class TestSQLConformance(HistoryStoreConformance):
    native_ttl = False  # no engine-side expiry: prune(older_than=...) is the retention tool
    multi_process = True  # every process reaches the same database through store_url

    @pytest.fixture
    def store_url(self, sql_target: Any, transport: str, apsw_file: str) -> str:
        if transport == "apsw":  # a file of its own: once indexed, the other transports refuse it
            return f"sqlite:///{apsw_file}?transport=apsw"
        url: str = sql_target.url
        if transport == TRANSPORTS[sql_target.family]:
            return url  # the default: the URL names no transport
        return url + ("&" if "?" in url else "?") + f"transport={transport}"

    @pytest.fixture
    def shared_backing(self, sql_target: Any, transport: str, apsw_file: str) -> str:
        """The run's schema, database or file, dropped at its end (the driver's and SQLAlchemy's transports share it):
        the kit fills its 100,000-message fork source there once, not once per transport."""
        return apsw_file if transport == "apsw" else str(sql_target.url)

    @pytest.fixture
    def make_store(self, store_url: str, transport: str) -> StoreFactory:
        def make(**options: Any) -> HistoryStore:
            store = SQLHistoryStore(store_url, **options)
            assert store.transport == transport
            return store

        return make

    async def messages_read(self, store: HistoryStore) -> int:
        assert isinstance(store, SQLHistoryStore)
        return store.messages_read

    @pytest.fixture
    def damage_session_document(
        self, damage_session_document: DocumentDamager, transport: str, apsw_file: str
    ) -> DocumentDamager:
        """The kit's hook, on the file the transport uses; written with apsw on apsw's (one library per file)."""
        if transport != "apsw":
            return damage_session_document
        import apsw

        async def damage(store: HistoryStore, key: SessionKey) -> None:
            conn = apsw.Connection(apsw_file)
            try:
                conn.execute(
                    "UPDATE chatkeep_sessions SET document = ? WHERE key_hash = ?",
                    ('{"type": "sess', key_hash(key.tenant, key.session_id)),
                )
            finally:
                conn.close()

        return damage

    @pytest.fixture(autouse=True)
    def _server_can_search(self, sql_target: Any, transport: str, apsw_file: str) -> None:
        self.without_pgvector = sql_target.family == "postgresql" and not sql_target.can_search
        self.raw_target, self.apsw_file = sql_target, (apsw_file if transport == "apsw" else None)

    async def index_entries_in_raw_storage(self, store: HistoryStore, tenant: str) -> int:
        if self.apsw_file is not None:
            return sqlite_index_entries(self.apsw_file, tenant)
        return postgres_index_entries(self.raw_target, tenant)

    def searchable_store(self, store: HistoryStore) -> SearchableStore:
        if self.without_pgvector:
            pytest.skip(
                "this PostgreSQL has no pgvector: TestPgvectorSearchConformance runs the search kit on "
                "CHATKEEP_TEST_PGVECTOR_URL (scripts/pgvector up)"
            )
        return super().searchable_store(store)


class TestPgvectorSearchConformance(SearchConformance):
    """The search kit on PostgreSQL with pgvector, once per transport."""

    native_ttl = False
    multi_process = True

    @pytest.fixture(params=["asyncpg", "sqlalchemy"])
    def store_url(self, request: pytest.FixtureRequest, pgvector_target: Any) -> str:
        url: str = pgvector_target.url
        return url if request.param == "asyncpg" else url + "&transport=sqlalchemy"

    @pytest.fixture
    def make_store(self, store_url: str) -> StoreFactory:
        return lambda **options: SQLHistoryStore(store_url, **options)

    async def messages_read(self, store: HistoryStore) -> int:
        assert isinstance(store, SQLHistoryStore)
        return store.messages_read

    async def index_entries_in_raw_storage(self, store: HistoryStore, tenant: str) -> int:
        return postgres_index_entries(self.pgvector, tenant)

    @pytest.fixture(autouse=True)
    def _raw_target(self, pgvector_target: Any) -> None:
        self.pgvector = pgvector_target
