"""The ``chatkeep`` command end to end on memory://, through the kit (in this process: memory has no server)."""

from __future__ import annotations

import uuid

import pytest

from chatkeep.core import HistoryStore, SessionKey
from chatkeep.memory import MemoryHistoryStore
from chatkeep.testing import CLIConformance


class TestMemoryCommandLine(CLIConformance):
    multi_process = False  # the data lives in this process: the killed-copy test skips, saying so

    @pytest.fixture
    def store_url(self) -> str:
        return f"memory://cli-kit-{uuid.uuid4().hex}"

    async def damage_session_document(self, store: HistoryStore, key: SessionKey) -> None:
        assert isinstance(store, MemoryHistoryStore)
        stored = store._data.get(key)  # where the namespace keeps the document
        assert stored is not None
        stored.document = '{"type": "sess'
