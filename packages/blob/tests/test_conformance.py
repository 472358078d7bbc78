"""The blob backend against the conformance kit on Azurite: default segments, and tiny ones that roll over often."""

from __future__ import annotations

from typing import Any

import pytest

from chatkeep.blob import open_store
from chatkeep.core import HistoryStore
from chatkeep.testing import HistoryStoreConformance, InfoConformance, StoreFactory, UsageConformance


class _BlobStores:
    """How the kit opens blob stores: on the test's own container (``store_url``)."""

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


class TestBlobConformance(_BlobStores, HistoryStoreConformance):
    """The whole kit."""


#: The kit but usage and info, which live in the metadata blob whatever the segments (see below).
_SEGMENT_KIT = tuple(k for k in HistoryStoreConformance.__bases__ if k not in (UsageConformance, InfoConformance))


class TestBlobConformanceSmallSegments(_BlobStores, *_SEGMENT_KIT):
    """Every third append starts a new segment, so the roll-over paths, the reads across segments and forks of
    many segments run under the kit (the index window stays above the 160 messages the concurrency test has in
    flight). Usage and info live in the metadata blob whatever the segments: the class above runs their tests,
    and leaving them out here keeps the blob CI session within its time."""

    @pytest.fixture
    def store_url(self, blob_url: str) -> str:
        return f"{blob_url}?segment_blocks=3&index_window=200"
