"""The ``chatkeep`` command end to end on standalone Redis and on the cluster, through the kit."""

from __future__ import annotations

import pytest

from chatkeep.core import HistoryStore, SessionKey
from chatkeep.core.encryption import EncryptedStore
from chatkeep.redis import RedisHistoryStore
from chatkeep.redis._layout import session_keys
from chatkeep.testing import CLIConformance
from chatkeep.testing.faults import free_port


class TestRedisCommandLine(CLIConformance):
    multi_process = True

    @pytest.fixture
    def store_url(self, redis_url: str) -> str:
        return redis_url

    async def damage_session_document(self, store: HistoryStore, key: SessionKey) -> None:
        inner = store.inner if isinstance(store, EncryptedStore) else store
        assert isinstance(inner, RedisHistoryStore)
        session_hash = session_keys(inner.prefix, key.tenant, key.session_id)[0]
        assert await inner._call("HSET", session_hash, "doc", '{"type": "sess') == 0  # overwrites the document

    @pytest.fixture
    def unreachable_url(self, redis_target: str) -> str:
        # The same kind of server (standalone or cluster) on a port where nothing listens.
        scheme = redis_target.split("://", 1)[0]
        return f"{scheme}://127.0.0.1:{free_port()}" + ("" if scheme == "redis+cluster" else "/0")
