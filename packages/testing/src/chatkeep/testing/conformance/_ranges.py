"""Conformance of ``load(before=p)``: a range of the history by position, read without reading the rest.

A fork's ranges (across its fork point, over a chain of forks) are :class:`~._forks.ForkConformance`'s.
"""

from __future__ import annotations

import pytest

from chatkeep.core import InvalidArgumentError
from chatkeep.core.backend import HistoryStore
from chatkeep.testing.conformance._base import (
    WINDOW_SLACK,
    ConformanceBase,
    StoreKit,
    make_messages,
    message_ids,
    texts,
)

__all__ = ["RangeConformance", "expected_range"]

LARGE_SESSION, LARGE_BATCH, WINDOW = 100_000, 1_000, 20


def expected_range(items: list[str], before: int, last: int | None) -> list[str]:
    """What ``load(last=last, before=before)`` returns of a history ``items``: positions ``before - last`` on."""
    stop = min(before, len(items))
    return items[0 if last is None else max(0, stop - last) : stop]


class RangeConformance(ConformanceBase):
    """``load(before=p)`` alone and with ``last``: at 0, within, at and beyond the count, after a trim and a pop."""

    async def test_before_reads_the_messages_older_than_a_position(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        batch = make_messages(10)
        await store.append(key, batch[:4])
        await store.append(key, batch[4:])
        ids = message_ids(batch)
        for before in (1, 3, 4, 5, 9, 10, 11, 1_000):
            assert message_ids(await store.load(key, before=before)) == expected_range(ids, before, None), before
        assert await store.load(key, before=0) == []

    async def test_before_with_last_reads_the_range_in_order(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        batch = make_messages(10)
        for low, high in ((0, 3), (3, 7), (7, 10)):
            await store.append(key, batch[low:high])
        ids = message_ids(batch)
        for before in range(13):
            for last in (1, 2, 3, 5, 10, 20):
                got = message_ids(await store.load(key, last=last, before=before))
                assert got == expected_range(ids, before, last), (before, last)
        assert await store.load(key, last=0, before=5) == []
        assert message_ids(await (await kit.open()).load(key, last=3, before=6)) == ids[3:6]

    async def test_before_on_a_missing_session_reads_empty(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        assert await store.load(key, before=3) == []
        assert await store.load(key, last=2, before=3) == []

    async def test_positions_restart_at_the_oldest_kept_message(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        batch = make_messages(12)
        await store.append(key, batch)
        assert await store.trim(key, 7) == 5
        kept = message_ids(batch[5:])
        assert message_ids(await store.load(key, before=3)) == kept[:3]
        assert message_ids(await store.load(key, last=2, before=5)) == kept[3:5]
        assert message_ids(await store.load(key, last=4, before=100)) == kept[-4:]
        # A pop, then more appends: a gap in the store's own numbering, never in the positions.
        popped = await store.pop(key)
        assert popped is not None
        kept = kept[:-1]
        more = make_messages(3, "more")
        await store.append(key, more)
        kept += message_ids(more)
        reader = await kit.open()
        for before in range(len(kept) + 2):
            for last in (None, 1, 3, 8):
                got = message_ids(await reader.load(key, last=last, before=before))
                assert got == expected_range(kept, before, last), (before, last)

    async def test_before_rejects_what_is_not_a_position(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        await store.append(key, make_messages(3))
        for bad in (-1, True, 2.0, "2"):
            with pytest.raises(InvalidArgumentError, match="before"):
                await store.load(key, before=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="last"):
            await store.load(key, last=-1, before=2)
        with pytest.raises(InvalidArgumentError, match="before"):
            await store.load(key, last=0, before=-1)  # each argument is checked, also when the other reads nothing

    async def test_a_range_of_a_large_session_reads_only_the_range(self, kit: StoreKit) -> None:
        writer = await kit.open()
        # Filled once per backing where the backing outlives the test (shared_backing): this test never changes it.
        key, _ = await kit.large_session(writer, LARGE_SESSION, LARGE_BATCH)
        reader = await kit.open()
        for before in (LARGE_SESSION // 2, 1_000, LARGE_SESSION - 500, LARGE_SESSION + 5):
            read = await self.messages_read(reader)
            window = await reader.load(key, last=WINDOW, before=before)
            assert await self.messages_read(reader) - read <= WINDOW + WINDOW_SLACK, f"before={before} read too much"
            stop = min(before, LARGE_SESSION)
            assert texts(window) == [f"#{n}" for n in range(stop - WINDOW, stop)]
