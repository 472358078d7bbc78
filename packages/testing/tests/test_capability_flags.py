"""The kit skips a test only for its two capability flags, ``native_ttl`` and ``multi_process`` (DESIGN.md).

Anything else a backend cannot do is a strict expected failure it declares; a test that skipped on another
property of the store would hide the gap instead.
"""

from __future__ import annotations

import uuid

from chatkeep.core import StoreLoopError, open_store
from chatkeep.testing import StoreKit
from chatkeep.testing.conformance import LifecycleConformance


async def test_the_loops_test_runs_on_a_store_serving_one_loop_and_fails_with_its_store_loop_error() -> None:
    def make(**options: object) -> object:
        store = open_store(f"memory://kit-flags-{uuid.uuid4().hex}", **options)
        store.serves_any_loop = False  # as a third-party store, or one made on a caller's driver client
        return store

    kit = StoreKit(make)  # type: ignore[arg-type]
    try:
        store = await kit.open()
        outcome: BaseException | None = None
        try:
            await LifecycleConformance().test_loops_sharing_a_store_lose_and_duplicate_nothing(kit, store)
        except BaseException as exc:  # pytest's Skipped too, which a plain except Exception would not see
            outcome = exc
        assert isinstance(outcome, StoreLoopError), f"the loops test ended with {outcome!r}, not the store's refusal"
    finally:
        await kit.aclose()
