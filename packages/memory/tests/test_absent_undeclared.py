"""``save_session(expected_version=ABSENT)`` on a store whose plugin does not declare ``creates_if_absent``.

A hook written before ``ABSENT`` existed would take it for a version (or ignore it and write): the base refuses
the call instead, and so does an ``EncryptedStore`` around such a store. The sync view passes ``ABSENT`` through.
"""

from __future__ import annotations

import os
import uuid

import pytest

from chatkeep.core import (
    ABSENT,
    AgentSession,
    ConcurrencyConflictError,
    SessionKey,
    SyncHistoryStore,
    UnsupportedOperationError,
)
from chatkeep.core.encryption import EncryptedStore
from chatkeep.memory import MemoryHistoryStore


class _Undeclared(MemoryHistoryStore):
    """Memory's storage, as a plugin written before ABSENT existed would declare it."""

    creates_if_absent = False


def _document(key: SessionKey, **state: object) -> AgentSession:
    return AgentSession(session_id=key.session_id, tenant=key.tenant, state=dict(state))


async def test_an_undeclared_plugin_refuses_absent_and_writes_nothing() -> None:
    key = SessionKey("t", "s")
    store = _Undeclared(f"memory://undeclared-{uuid.uuid4().hex}")
    with pytest.raises(UnsupportedOperationError, match=r"_Undeclared cannot save .*creates_if_absent"):
        await store.save_session(key, _document(key), expected_version=ABSENT)
    assert await store.load_session(key) is None
    keys = MemoryHistoryStore(f"memory://undeclared-keys-{uuid.uuid4().hex}")
    encrypted = EncryptedStore(store, key_store=keys, master_keys={"k1": os.urandom(32)})
    with pytest.raises(UnsupportedOperationError, match="creates_if_absent"):
        await encrypted.save_session(key, _document(key), expected_version=ABSENT)
    assert await store.load_session(key) is None


def test_the_sync_view_passes_absent_through() -> None:
    key = SessionKey("t", "s")
    with SyncHistoryStore(MemoryHistoryStore(f"memory://sync-absent-{uuid.uuid4().hex}")) as store:
        version = store.save_session(key, _document(key, n=1), expected_version=ABSENT)
        with pytest.raises(ConcurrencyConflictError, match="already has a document"):
            store.save_session(key, _document(key, n=2), expected_version=ABSENT)
        found = store.load_session(key)
        assert found is not None
        assert (found.session.state, found.version) == ({"n": 1}, version)


async def test_absent_is_not_a_version_string() -> None:
    key = SessionKey("t", "s")
    store = MemoryHistoryStore(f"memory://absent-{uuid.uuid4().hex}")
    await store.save_session(key, _document(key))
    for text in ("ABSENT", "", repr(ABSENT)):
        with pytest.raises(ConcurrencyConflictError, match="changed since version"):
            await store.save_session(key, _document(key), expected_version=text)
