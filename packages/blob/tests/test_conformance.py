"""The blob backend against the conformance kit on Azurite: default segments, and tiny ones that roll over often."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chatkeep.blob import BlobHistoryStore, open_store
from chatkeep.core import HistoryStore, SessionKey
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

    async def damage_session_document(self, store: HistoryStore, key: SessionKey) -> None:
        assert isinstance(store, BlobHistoryStore)
        blob = store._container().get_blob_client(store.layout.meta(key.tenant, key.session_id))
        meta = json.loads(await (await blob.download_blob()).readall())
        meta["doc"] = '{"type": "sess'  # the session document, inside otherwise intact metadata
        listing = (await blob.get_blob_properties()).metadata
        await blob.upload_blob(json.dumps(meta).encode(), overwrite=True, metadata=listing)


class TestBlobConformanceSmallSegments(TestBlobConformance):
    """Every third append starts a new segment, so the roll-over paths and the reads across segments
    run under the whole kit (the index window stays above the 160 messages the concurrency test has in flight)."""

    @pytest.fixture
    def store_url(self, blob_url: str) -> str:
        return f"{blob_url}?segment_blocks=3&index_window=200"
