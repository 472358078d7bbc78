"""What the memory backend's tests share: damaging a stored session document for the kit's damage tests."""

from __future__ import annotations

import pytest

from chatkeep.core import HistoryStore, SessionKey
from chatkeep.memory import MemoryHistoryStore
from chatkeep.testing import DocumentDamager


@pytest.fixture
def damage_session_document() -> DocumentDamager:
    """The kit's hook: text that is not JSON where the namespace keeps the session document."""

    async def damage(store: HistoryStore, key: SessionKey) -> None:
        assert isinstance(store, MemoryHistoryStore)
        stored = store._data.get(key, store._clock())
        assert stored is not None
        stored.document = '{"type": "sess'

    return damage
