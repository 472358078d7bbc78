"""HistoryStore's default ``_load_before`` (a stream of ``_iter_messages`` up to the range's end), on memory's storage.

A plugin written before ``load(before=...)`` existed gets it from the base class: the same ranges, at a cost that
grows with the position (it reads every message before the range). The kit's range tests run on it here; every
bundled backend overrides it. The example plugin (docs/examples/chatkeep-jsonfiles) runs the whole kit on it too.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from chatkeep.core import HistoryStore, Message, SessionKey
from chatkeep.memory import MemoryHistoryStore
from chatkeep.testing import ForkConformance, RangeConformance, StoreFactory, StoreKit


class _DefaultRange(MemoryHistoryStore):
    """Memory's storage with the base's ``_load_before``, as a plugin that predates it has."""

    _load_before = HistoryStore._load_before


class TestDefaultRange(RangeConformance, ForkConformance):
    native_ttl = True
    multi_process = False

    @pytest.fixture
    def make_store(self) -> StoreFactory:
        namespace = f"load-before-default-{uuid.uuid4().hex}"

        def make(**options: Any) -> HistoryStore:
            return _DefaultRange(namespace=namespace, **options)

        return make

    @pytest.mark.xfail(strict=True, reason="the default reads every message before the range (O(before))")
    async def test_a_range_of_a_large_session_reads_only_the_range(self, kit: StoreKit) -> None:
        await super().test_a_range_of_a_large_session_reads_only_the_range(kit)

    @pytest.mark.xfail(strict=True, reason="the default reads every message before the range (O(before))")
    async def test_a_range_of_a_large_fork_reads_only_the_range(self, kit: StoreKit) -> None:
        await super().test_a_range_of_a_large_fork_reads_only_the_range(kit)


async def test_the_default_stops_reading_at_the_range_end() -> None:
    store = _DefaultRange(f"memory://load-before-stop-{uuid.uuid4().hex}")
    key = SessionKey("t", "s")
    await store.append(key, [Message(role="user", text=f"#{n}") for n in range(5_000)])
    read = store.messages_read
    window = await store.load(key, last=10, before=1_500)
    assert [m.text for m in window] == [f"#{n}" for n in range(1_490, 1_500)]
    assert store.messages_read - read <= 2_000, "the default read past the range's end"
