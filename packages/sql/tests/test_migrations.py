"""Schema versions: the frozen first schema upgrades with its data intact; newer ones are refused; first use creates."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from chatkeep.core import AgentSession, ChatkeepError, Message, SessionKey, StoreConfigurationError
from chatkeep.core.backend import SupportsSchemaRevision
from chatkeep.core.cli import main as cli_main
from chatkeep.sql import SCHEMA_REVISION, SchemaVersionError, SQLHistoryStore, migrate
from chatkeep.sql._schema import REVISIONS, VERSION_TABLE, key_hash, message_hash, tenant_hash

HERE = Path(__file__).parent
VERSION = "SELECT version_num FROM chatkeep_alembic_version"


def _frozen_ddl(family: str) -> list[tuple[str, tuple[Any, ...]]]:
    text = (HERE / f"schema_v1_{family}.sql").read_text()
    lines = [line for line in text.splitlines() if not line.startswith("--")]
    statements = [s.strip() for s in "\n".join(lines).split(";")]
    return [(s, ()) for s in statements if s and s not in ("BEGIN", "COMMIT")]


def _v1_rows(key: SessionKey, records: list[str], document: str) -> list[tuple[str, tuple[Any, ...]]]:
    """Data written the way revision 0001 lays it out (raw SQL, so the test never depends on today's code)."""
    head = (key_hash(key.tenant, key.session_id), tenant_hash(key.tenant), key.tenant.encode(), key.session_id.encode())
    session = (
        "INSERT INTO chatkeep_sessions (key_hash, tenant_hash, tenant, session_id, created_at, updated_at, next_seq, "
        "message_count, document, doc_version, owner) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    n = len(records)
    rows = [(session, (*head, 1_700_000_000_000_000, 1_700_000_000_000_001, n, n, document, 3, b"alice"))]
    for seq, record in enumerate(records):
        rows.append(
            (
                "INSERT INTO chatkeep_messages (session_ref, seq, message_hash, record) "
                "VALUES ((SELECT id FROM chatkeep_sessions WHERE key_hash = ?), ?, ?, ?)",
                (head[0], seq, message_hash(json.loads(record)["message_id"]), record),
            )
        )
    return rows


def test_known_revisions_match_the_shipped_migrations() -> None:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", "chatkeep.sql:migrations")
    script = ScriptDirectory.from_config(config)
    shipped = [rev.revision for rev in reversed(list(script.walk_revisions()))]
    assert tuple(shipped) == REVISIONS
    assert script.get_current_head() == SCHEMA_REVISION == REVISIONS[-1]


async def test_frozen_v1_database_upgrades_with_data_intact(fresh_backing: Any) -> None:
    key = SessionKey("tenant 'a'; --", "s\x00/é")
    messages = [Message(role="user", text="hi \x00 there"), Message(role="assistant", text="é" * 70_000)]
    session = AgentSession(session_id=key.session_id, tenant=key.tenant, state={"memory": ["likes pasta"]})
    document = json.dumps(session.to_dict(), ensure_ascii=False)
    fresh_backing.execute(*_frozen_ddl(fresh_backing.target.family))
    fresh_backing.execute(*_v1_rows(key, [m.to_record() for m in messages], document))

    assert await migrate(fresh_backing.url) == SCHEMA_REVISION
    assert fresh_backing.execute((VERSION, ())) == [(SCHEMA_REVISION,)]
    async with SQLHistoryStore(fresh_backing.url) as store:
        assert await store.load(key) == messages
        assert await store.count(key) == 2
        stored = await store.load_session(key, owner="alice")
        assert stored is not None
        assert stored.session == session
        with pytest.raises(ChatkeepError):
            await store.load_session(key, owner="bob")
        # The upgraded database keeps working: appends continue the sequence, versions keep counting.
        more = Message(role="user", text="after the upgrade")
        assert await store.append(key, [messages[0], more]) == 1
        assert [m.text for m in await store.load(key, last=2)] == [messages[1].text, more.text]
        assert await store.save_session(key, session, expected_version=stored.version, owner="alice")
        listed = (await store.list_sessions(key.tenant)).items
        assert [(i.session_id, i.message_count) for i in listed] == [(key.session_id, 3)]
        assert listed[0].created_at.year == 2023


@pytest.mark.reliability
async def test_first_use_creates_the_schema_once_under_concurrency(fresh_backing: Any) -> None:
    stores = [SQLHistoryStore(fresh_backing.url) for _ in range(4)]
    try:
        key = SessionKey("t", "s")
        counts = await asyncio.gather(
            *(s.append(key, [Message(role="user", text=str(n))]) for n, s in enumerate(stores))
        )
        assert counts == [1, 1, 1, 1]
        assert await stores[0].count(key) == 4
    finally:
        for store in stores:
            await store.close()
    assert fresh_backing.execute((VERSION, ())) == [(SCHEMA_REVISION,)]


async def test_a_schema_another_process_makes_between_two_looks_is_not_refused(
    fresh_backing: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first call looks for the version table, then for the sessions table, before it takes the schema lock.
    # Another process that made the whole schema in between used to make it look foreign ("not made by
    # chatkeep"): the race the concurrent first-use test hit now and then. Here the other process's store makes
    # the schema exactly there, on its own connection, in a thread of its own.
    from sqlalchemy.engine.reflection import Inspector

    original = Inspector.has_table
    interleaved: list[str] = []

    def other_process_makes_the_schema() -> None:
        async def first_use() -> None:
            async with SQLHistoryStore(fresh_backing.url) as other:
                await other.append(SessionKey("t", "other"), [Message(role="user", text="theirs")])

        asyncio.run(first_use())

    def has_table(self: Any, table_name: str, *args: Any, **kwargs: Any) -> bool:
        found = original(self, table_name, *args, **kwargs)
        if table_name == VERSION_TABLE and not found and not interleaved:
            interleaved.append(table_name)
            thread = threading.Thread(target=other_process_makes_the_schema)
            thread.start()
            thread.join()
        return found

    monkeypatch.setattr(Inspector, "has_table", has_table)
    async with SQLHistoryStore(fresh_backing.url) as store:
        assert await store.append(SessionKey("t", "s"), [Message(role="user", text="ours")]) == 1
        assert await store.count(SessionKey("t", "other")) == 1
    assert interleaved == [VERSION_TABLE]
    assert fresh_backing.execute((VERSION, ())) == [(SCHEMA_REVISION,)]


async def test_concurrent_first_calls_on_one_store_create_the_schema_once(fresh_backing: Any) -> None:
    # One store (a web app's) whose first requests arrive together: they wait for one schema check.
    async with SQLHistoryStore(fresh_backing.url) as store:
        keys = [SessionKey("t", f"s{n}") for n in range(8)]
        counts = await asyncio.gather(*(store.append(key, [Message(role="user", text="hi")]) for key in keys))
        assert counts == [1] * 8
        assert [await store.count(key) for key in keys] == [1] * 8
    assert fresh_backing.execute((VERSION, ())) == [(SCHEMA_REVISION,)]


async def test_newer_schema_is_refused_and_left_alone(fresh_backing: Any) -> None:
    key = SessionKey("t", "s")
    async with SQLHistoryStore(fresh_backing.url) as store:
        await store.append(key, [Message(role="user", text="kept")])
    fresh_backing.execute(("UPDATE chatkeep_alembic_version SET version_num = '9999'", ()))
    async with SQLHistoryStore(fresh_backing.url) as store:
        with pytest.raises(SchemaVersionError, match="newer") as caught:
            await store.load(key)
        assert isinstance(caught.value, StoreConfigurationError)
        assert "pip install -U chatkeep-sql" in str(caught.value)
        with pytest.raises(SchemaVersionError):
            await store.migrate()
    with pytest.raises(SchemaVersionError):
        await migrate(fresh_backing.url)
    assert fresh_backing.execute((VERSION, ())) == [("9999",)]


async def test_foreign_tables_without_version_are_refused(fresh_backing: Any) -> None:
    fresh_backing.execute(("CREATE TABLE chatkeep_sessions (id INTEGER PRIMARY KEY)", ()))
    async with SQLHistoryStore(fresh_backing.url) as store:
        with pytest.raises(SchemaVersionError, match="not made by chatkeep"):
            await store.count(SessionKey("t", "s"))


def test_cli_migrate(fresh_backing: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["migrate", "--store", fresh_backing.url]) == 0
    assert SCHEMA_REVISION in capsys.readouterr().out
    assert fresh_backing.execute((VERSION, ())) == [(SCHEMA_REVISION,)]
    assert cli_main(["migrate", "--store", fresh_backing.url]) == 0  # already there: nothing to do
    assert cli_main(["migrate", "--store", "memory://"]) == 0
    assert "no migrations" in capsys.readouterr().out


async def test_first_use_logs_no_warnings(fresh_backing: Any, caplog: pytest.LogCaptureFixture) -> None:
    # A person's console stays quiet when a store creates its schema (MariaDB used to warn, through the
    # driver's logger, about the name of the version table's primary key).
    caplog.set_level(logging.WARNING)
    async with SQLHistoryStore(fresh_backing.url) as store:
        assert await store.count(SessionKey("t", "s")) == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_schema_revision_reports_the_schema_without_migrating(fresh_backing: Any) -> None:
    async with SQLHistoryStore(fresh_backing.url) as store:
        assert isinstance(store, SupportsSchemaRevision)
        assert await store.schema_revision() == SCHEMA_REVISION  # an empty database: created, as a first call does
    fresh_backing.execute(("UPDATE chatkeep_alembic_version SET version_num = '9999'", ()))
    async with SQLHistoryStore(fresh_backing.url) as store:
        with pytest.raises(SchemaVersionError, match="newer"):
            await store.schema_revision()
    assert fresh_backing.execute((VERSION, ())) == [("9999",)]


def test_cli_doctor(fresh_backing: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["doctor", "--store", fresh_backing.url, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True
    assert report["schema_revision"] == SCHEMA_REVISION
    fresh_backing.execute(("UPDATE chatkeep_alembic_version SET version_num = '9999'", ()))
    assert cli_main(["doctor", "--store", fresh_backing.url, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["error"]["type"] == "SchemaVersionError"
    assert "pip install -U chatkeep-sql" in report["error"]["message"]
    assert "upgrade chatkeep-sql" in report["fix"]
    assert report["checks"] == [{"name": "schema", "ok": False, "ms": None, "detail": "see the error below"}]
