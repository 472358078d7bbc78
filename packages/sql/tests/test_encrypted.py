"""EncryptedStore over the SQL backend: the conformance kit through the wrapper, and a plaintext canary search."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chatkeep.core import AgentSession, HistoryStore, Message, SessionKey
from chatkeep.core.encryption import EncryptedStore
from chatkeep.sql import SQLHistoryStore
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
CANARY = "canary-5b1e-plaintext-must-never-be-stored"


@pytest.fixture(scope="module")
def key_store_url(sql_target: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The wrapped data keys live in a backing of their own, as the docs ask."""
    name = sql_target.create_backing(tmp_path_factory.mktemp("keys"))
    try:
        yield sql_target.url_for(name)
    finally:
        sql_target.drop_backing(name)


def encrypted(url: str, key_store_url: str, **options: Any) -> EncryptedStore:
    return EncryptedStore(SQLHistoryStore(url, **options), key_store=SQLHistoryStore(key_store_url), master_keys=MASTER)


@not_implemented_yet(
    ForkConformance,
    UsageConformance,
    InfoConformance,
    reason=ENCRYPTED_STORE_LACKS,
)
class TestEncryptedSQLConformance(HistoryStoreConformance):
    native_ttl = False
    multi_process = False  # the child processes open plain stores by URL; the wrapper is not a URL scheme

    @pytest.fixture
    def make_store(self, sql_target: Any, key_store_url: str) -> StoreFactory:
        def make(**options: Any) -> HistoryStore:
            return encrypted(sql_target.url, key_store_url, **options)

        return make

    async def messages_read(self, store: HistoryStore) -> int:
        assert isinstance(store, EncryptedStore)
        assert isinstance(store.inner, SQLHistoryStore)
        return store.inner.messages_read


class TestEncryptionOverSQL(EncryptionConformance):
    @pytest.fixture
    def open_backing(self, sql_target: Any, tmp_path: Path) -> Iterator[BackingFactory]:
        """Each named backing is a schema, database or file of its own, made on first use and dropped after."""
        names: dict[str, str] = {}

        def open_backing(name: str) -> HistoryStore:
            if name not in names:
                names[name] = sql_target.create_backing(tmp_path)
            return SQLHistoryStore(sql_target.url_for(names[name]))

        try:
            yield open_backing
        finally:
            for made in names.values():
                sql_target.drop_backing(made)


async def test_plaintext_canary_is_not_in_any_table(fresh_backing: Any, key_store_url: str, tmp_path: Path) -> None:
    key = SessionKey("acme", "canary")
    async with encrypted(fresh_backing.url, key_store_url) as store:
        await store.append(key, [Message(role="user", text=f"secret {CANARY}", author_name=CANARY)])
        await store.save_session(key, AgentSession(session_id="canary", tenant="acme", state={"note": CANARY}))
        assert CANARY in (await store.load(key))[0].text
    rows = fresh_backing.execute(("SELECT * FROM chatkeep_messages", ()))
    rows += fresh_backing.execute(("SELECT * FROM chatkeep_sessions", ()))
    dump = repr(rows)
    assert rows  # the tables do hold the session
    assert CANARY not in dump
    assert CANARY.encode().hex() not in dump
