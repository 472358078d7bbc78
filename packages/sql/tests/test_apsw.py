"""The apsw transport keeps to one SQLite library per file: nothing of a store on it opens the file with sqlite3."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, NoReturn

import pytest

from chatkeep.core import Message, SessionKey
from chatkeep.sql import SQLHistoryStore, migrate

pytest.importorskip("apsw", reason="the apsw transport needs chatkeep-sql[recall]")


async def test_a_store_on_apsw_never_opens_its_file_with_sqlite3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise AssertionError("the sqlite3 library opened a file of an apsw store")

    monkeypatch.setattr(sqlite3, "connect", refused)
    url = f"sqlite:///{tmp_path / 'one-library.db'}?transport=apsw"
    key = SessionKey("t", "s")
    async with SQLHistoryStore(url) as store:
        assert store.transport == "apsw"
        assert await store.append(key, [Message(role="user", text="hello")]) == 1  # the schema made on apsw too
        assert [m.text for m in await store.load(key)] == ["hello"]
    assert await migrate(url)  # the schema's own work as well
