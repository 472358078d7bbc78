"""The JSON-files backend against chatkeep's conformance kit, on real files in pytest's tmp_path."""

from __future__ import annotations

import asyncio
import json
import pathlib
from typing import Any
from urllib.parse import quote

import pytest

from chatkeep.core import HistoryStore, SessionKey
from chatkeep.testing import HistoryStoreConformance, StoreFactory
from chatkeep_jsonfiles import JsonFilesHistoryStore


class TestJsonFilesConformance(HistoryStoreConformance):
    native_ttl = False  # files do not expire by themselves: the TTL tests skip, saying so
    multi_process = True  # file locks serialize writers in any process: child processes open store_url

    @pytest.fixture
    def store_url(self, tmp_path: pathlib.Path) -> str:
        return "jsonfiles://" + quote(str(tmp_path / "store"))  # each test its own folder

    @pytest.fixture
    def make_store(self, store_url: str) -> StoreFactory:
        def make(**options: Any) -> HistoryStore:
            return JsonFilesHistoryStore(store_url, **options)  # a new instance on the same folder

        return make

    async def damage_session_document(self, store: HistoryStore, key: SessionKey) -> None:
        assert isinstance(store, JsonFilesHistoryStore)
        meta = pathlib.Path(store._paths(key).meta)  # the session's metadata file, which holds its document
        await asyncio.to_thread(_damage_document, meta)

    # The read probe is the store's messages_read property (SupportsReadProbe): nothing to override.


def _damage_document(meta: pathlib.Path) -> None:
    data = json.loads(meta.read_text(encoding="utf-8"))
    data["document"] = '{"type": "sess'
    meta.write_text(json.dumps(data), encoding="utf-8")
