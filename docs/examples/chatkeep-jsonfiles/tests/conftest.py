"""What the example's tests share: damaging a stored session document, for the kit's damage tests."""

from __future__ import annotations

import asyncio
import json
import pathlib

import pytest

from chatkeep.core import HistoryStore, SessionKey
from chatkeep.testing import DocumentDamager
from chatkeep_jsonfiles import JsonFilesHistoryStore


def _damage_document(meta: pathlib.Path) -> None:
    data = json.loads(meta.read_text(encoding="utf-8"))
    data["document"] = '{"type": "sess'
    meta.write_text(json.dumps(data), encoding="utf-8")


@pytest.fixture
def damage_session_document() -> DocumentDamager:
    """The kit's hook: text that is not JSON as the document in the session's metadata file."""

    async def damage(store: HistoryStore, key: SessionKey) -> None:
        assert isinstance(store, JsonFilesHistoryStore)
        await asyncio.to_thread(_damage_document, pathlib.Path(store._paths(key).meta))

    return damage
