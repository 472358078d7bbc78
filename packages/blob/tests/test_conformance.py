"""The blob backend against the conformance kit on Azurite: default segments, and tiny ones that roll over often."""

from __future__ import annotations

from typing import Any

import pytest

from chatkeep.blob import open_store
from chatkeep.core import HistoryStore
from chatkeep.testing import HistoryStoreConformance, StoreFactory


class TestBlobConformance(HistoryStoreConformance):
    native_ttl = False  # Blob Storage has no per-blob TTL: prune or a lifecycle rule removes idle sessions
    multi_process = True

    @pytest.fixture
    def store_url(self, blob_url: str) -> str:
        return blob_url

    @pytest.fixture
    def make_store(self, store_url: str) -> StoreFactory:
        def make(**options: Any) -> HistoryStore:
            return open_store(store_url, **options)

        return make


class TestBlobConformanceSmallSegments(TestBlobConformance):
    """Every third append starts a new segment, so the roll-over paths and the reads across segments
    run under the whole kit (the index window stays above the 160 messages the concurrency test has in flight)."""

    @pytest.fixture
    def store_url(self, blob_url: str) -> str:
        return f"{blob_url}?segment_blocks=3&index_window=200"
