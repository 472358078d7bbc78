"""The ``chatkeep`` command end to end on the JSON-files backend, through chatkeep's kit."""

from __future__ import annotations

import asyncio
import json
import pathlib
from urllib.parse import quote

import pytest

from chatkeep.core import HistoryStore, SessionKey
from chatkeep.testing import CLIConformance
from chatkeep_jsonfiles import JsonFilesHistoryStore


class TestJsonFilesCommandLine(CLIConformance):
    multi_process = True  # a chatkeep child process opens the same folder

    @pytest.fixture
    def store_url(self, tmp_path: pathlib.Path) -> str:
        return "jsonfiles://" + quote(str(tmp_path / "store"))

    async def damage_session_document(self, store: HistoryStore, key: SessionKey) -> None:
        assert isinstance(store, JsonFilesHistoryStore)
        meta = pathlib.Path(store._paths(key).meta)  # the session's metadata file, which holds its document
        await asyncio.to_thread(_damage_document, meta)

    # No unreachable_url: files have no server.


def _damage_document(meta: pathlib.Path) -> None:
    data = json.loads(meta.read_text(encoding="utf-8"))
    data["document"] = '{"type": "sess'
    meta.write_text(json.dumps(data), encoding="utf-8")
