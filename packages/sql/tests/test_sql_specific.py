"""What the conformance kit does not cover: URLs and drivers, SQLite's file and WAL, existing engines, outages."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import random
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import chatkeep.core
from chatkeep.core import (
    AgentSession,
    ChatkeepError,
    ConcurrencyConflictError,
    Message,
    MissingExtraError,
    SessionFormatError,
    SessionKey,
    SessionOwnershipError,
    StoreConfigurationError,
    StoreUnavailableError,
)
from chatkeep.sql import (
    SQLHistoryProvider,
    SQLHistoryStore,
    SQLURLError,
    _config,
    _sql,
    default_sqlite_path,
    open_store,
)
from chatkeep.testing.faults import LoopbackProxy
from chatkeep.testing.telemetry import Telemetry


@pytest.mark.parametrize(
    ("url", "family", "driver"),
    [
        ("sqlite://", "sqlite", "pysqlite"),
        ("sqlite:///rel/x.db", "sqlite", "pysqlite"),
        ("sqlite+aiosqlite:////abs/x.db", "sqlite", "aiosqlite"),
        ("postgresql://u:p@h/db", "postgresql", "asyncpg"),
        ("postgres://u@h/db", "postgresql", "asyncpg"),
        ("postgresql+psycopg://u@h/db", "postgresql", "psycopg"),
        ("postgresql+asyncpg://u@h:5433/db?schema=s", "postgresql", "asyncpg"),
        ("mysql://root@h/db", "mysql", "asyncmy"),
        ("mariadb://root@h/db", "mariadb", "asyncmy"),
        ("mysql+asyncmy://root@h/db?max_message_bytes=10", "mysql", "asyncmy"),
    ],
)
def test_urls_pick_an_async_driver(url: str, family: str, driver: str) -> None:
    config = _config.parse_url(url)
    assert (config.family, config.driver) == (family, driver)
    if family in ("mysql", "mariadb"):
        assert config.url is not None
        assert "charset=utf8mb4" in config.url
    if "schema=" in url:
        assert config.settings.schema_ == "s"
        assert config.url is not None
        assert "schema" not in config.url  # chatkeep's options never reach the driver


def test_sqlite_paths() -> None:
    assert _config.parse_url("sqlite://").sqlite_path == default_sqlite_path()
    assert default_sqlite_path().endswith(str(Path("chatkeep") / "history.db"))
    assert _config.parse_url("sqlite:///rel/x.db").sqlite_path == "rel/x.db"
    assert _config.parse_url("sqlite:////abs/x%20y.db").sqlite_path == "/abs/x y.db"


def test_missing_driver_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _config.importlib.util.find_spec

    def without(name: str, *args: Any) -> Any:
        return None if name in ("asyncpg", "psycopg", "asyncmy", "aiomysql") else real(name, *args)

    monkeypatch.setattr(_config.importlib.util, "find_spec", without)
    # The default driver of a family comes with the chatkeep-core extra named after it.
    with pytest.raises(MissingExtraError) as caught:
        open_store("postgresql://user:secret@db/app")
    assert "secret" not in str(caught.value)
    assert (
        'needs the asyncpg driver, which is not installed; install it with: pip install "chatkeep-core[postgresql]"'
        in str(caught.value)
    )
    with pytest.raises(MissingExtraError, match=re.escape('pip install "chatkeep-core[postgresql]"')):
        open_store("postgres://u@db/app")
    with pytest.raises(MissingExtraError, match=re.escape('pip install "chatkeep-core[mysql]"')):
        open_store("mysql+asyncmy://root@db/app")
    with pytest.raises(MissingExtraError, match=re.escape('pip install "chatkeep-core[mariadb]"')):
        open_store("mariadb://root@db/app")
    # An opt-in driver is installed by its own name (no extra brings it).
    with pytest.raises(
        MissingExtraError,
        match=re.escape(
            'needs the psycopg driver, which is not installed; install it with: pip install "psycopg[binary]"'
        ),
    ):
        chatkeep.core.open_store("postgresql+psycopg://u@db/app")
    with pytest.raises(MissingExtraError, match=re.escape('pip install "aiomysql"')):
        open_store("mysql+aiomysql://root@db/app")


def test_sqlite_needs_no_driver_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _config.importlib.util.find_spec
    monkeypatch.setattr(
        _config.importlib.util, "find_spec", lambda name, *args: None if name == "aiosqlite" else real(name, *args)
    )
    assert _config.parse_url("sqlite:///x.db").driver == "pysqlite"  # the standard library's sqlite3
    with pytest.raises(MissingExtraError, match=re.escape('install it with: pip install "aiosqlite"')):
        _config.parse_url("sqlite+aiosqlite:///x.db")


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://host/x.db",
        "sqlite:///:memory:",
        "postgresql+psycopg2://u@h/db",
        "mysql+pymysql://u@h/db",
        "postgresql+nosuch://u@h/db",
        "mysql://u@h/db?schema=x",
        "sqlite:///x.db?max_message_bytes=lots",
        "sqlite:///x.db?busy_timeout=-1",
        "sqlite:///x.db#frag",
        "mariadb://127.0.0.1/\ud800",  # a lone surrogate (found by tests/test_url_properties.py)
        "postgresql://u@127.0.0.1/db?application_name=\udcff",
    ],
)
def test_bad_urls_are_refused_clearly(url: str) -> None:
    with pytest.raises(SQLURLError) as caught:
        open_store(url)
    assert isinstance(caught.value, ChatkeepError)


def test_unknown_options_are_refused_at_open() -> None:
    with pytest.raises(
        SQLURLError, match=r"no ttl option: it has no native TTL; delete old sessions with store\.prune"
    ):
        open_store("sqlite:///x.db", ttl=5)
    with pytest.raises(SQLURLError, match=r"'bogus' in sqlite:///x\.db\?bogus=1; the options are max_message_bytes"):
        open_store("sqlite:///x.db?bogus=1")
    with pytest.raises(SQLURLError, match="'journal_mode'"):  # SQLite takes no driver options: nothing is ignored
        open_store("sqlite:///x.db?journal_mode=delete")
    with pytest.raises(SQLURLError, match=r"synchronous='sometimes'.* must be normal or full"):
        open_store("sqlite:///x.db?synchronous=sometimes")
    with pytest.raises(SQLURLError, match="the synchronous option is for SQLite"):
        open_store("postgresql+asyncpg://u@127.0.0.1:1/db?synchronous=full")
    with pytest.raises(SQLURLError, match="the mmap_size option is for SQLite"):
        open_store("mysql+asyncmy://u@127.0.0.1:1/db?mmap_size=0")
    with pytest.raises(SQLURLError, match=r"mmap_size='-1'"):
        open_store("sqlite:///x.db?mmap_size=-1")
    with pytest.raises(SQLURLError, match=r"'bogus'.*or an option of the asyncpg driver"):
        open_store("postgresql+asyncpg://u@127.0.0.1:1/db?bogus=1")
    with pytest.raises(SQLURLError, match="pool_size=0 must be a whole number of 1 or more"):
        open_store("postgresql+asyncpg://u@127.0.0.1:1/db", pool_size=0)
    with pytest.raises(SQLURLError, match="keyword option 'pool'"):
        open_store("sqlite:///x.db", pool=3)
    # The driver's own connect options still pass through to it.
    assert "command_timeout=5" in str(open_store("postgresql+asyncpg://u@127.0.0.1:1/db?command_timeout=5").config.url)


def test_options_come_typed_from_the_query_and_keywords_and_the_rest_goes_to_the_driver() -> None:
    url = "postgresql+asyncpg://u@h/db?schema=app&pool_size=3&command_timeout=5&pool_pre_ping=yes"
    config = _config.parse_url(url, busy_timeout=timedelta(seconds=2), max_overflow=0, pool_size=None)
    settings = config.settings
    assert (settings.schema_, settings.pool_size, settings.max_overflow, settings.pool_pre_ping) == ("app", 3, 0, True)
    assert (settings.busy_timeout, settings.connect_timeout, settings.transport) == (2.0, 5.0, None)
    assert settings.driver_query == (("command_timeout", "5"),)
    assert config.url == "postgresql+asyncpg://u@h/db?command_timeout=5"
    assert config.transport == "asyncpg"  # settings.transport is what was given; config.transport what runs
    with pytest.raises(
        SQLURLError,
        match=r"the options are max_message_bytes, schema, busy_timeout, synchronous, mmap_size, connect_timeout, "
        r"statement_timeout, pool_size, max_overflow, pool_recycle, pool_pre_ping, transport$",
    ):
        _config.parse_url("sqlite://", scheme="x")


def test_the_docs_table_names_every_option() -> None:
    page = (Path(__file__).resolve().parents[3] / "docs" / "backends" / "sql.md").read_text()
    first_cells = re.findall(r"^\| ((?:`\w+`(?:, )?)+) \|", page, flags=re.MULTILINE)
    documented = {name for cell in first_cells for name in re.findall(r"`(\w+)`", cell)}
    assert documented == set(_config.SQLSettings.option_names())


def test_open_store_finds_the_plugin_and_does_no_io() -> None:
    store = chatkeep.core.open_store("postgresql+asyncpg://nobody@127.0.0.1:1/nothing")  # nothing listens there
    assert isinstance(store, SQLHistoryStore)
    assert store.dialect == "postgresql"
    assert "sql" in [backend.name for backend in chatkeep.core.installed_backends()]
    provider = chatkeep.core.history_provider("sqlite:///never-created.db", max_messages=5)
    assert isinstance(provider.store, SQLHistoryStore)
    assert not Path("never-created.db").exists()


async def test_default_sqlite_file_is_created_on_first_use_in_wal_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_config.platformdirs, "user_data_dir", lambda *a, **k: str(tmp_path / "data" / "chatkeep"))
    path = tmp_path / "data" / "chatkeep" / "history.db"
    store = open_store("sqlite://")
    assert not path.exists()
    key = SessionKey("t", "s")
    async with store:
        await store.append(key, [Message(role="user", text="hi")])
    assert path.exists()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT count(*) FROM chatkeep_messages").fetchone()[0] == 1
    finally:
        conn.close()
    provider = SQLHistoryProvider("sqlite://")
    try:
        assert [m.text for m in await provider.get_messages("s", key=SessionKey("t", "s"))] == ["hi"]
    finally:
        await provider.close()
    assert provider.store.closed


@pytest.mark.reliability
async def test_sqlite_writer_waits_for_the_lock_instead_of_failing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'busy.db'}"
    key = SessionKey("t", "s")
    async with open_store(url) as store:
        await store.count(key)
        blocker = sqlite3.connect(tmp_path / "busy.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        task = asyncio.create_task(store.append(key, [Message(role="user", text="waits")]))
        await asyncio.sleep(0.3)
        assert not task.done()
        blocker.execute("COMMIT")
        blocker.close()
        assert await task == 1


@pytest.mark.reliability
def test_many_first_connections_to_a_new_file_all_switch_it_to_wal(tmp_path: Path) -> None:
    # SQLite does not wait for its busy timeout while switching a file to WAL, so several processes opening a
    # new file at once used to fail with "database is locked"; each connection now retries within the timeout.
    from concurrent.futures import ThreadPoolExecutor

    from chatkeep.sql._sqlite import SQLiteTransport

    def first_use(path: Path) -> str:
        conn = SQLiteTransport(str(path), busy_timeout=5.0, pool_size=1).connect()
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS t (x)")
            return str(conn.execute("PRAGMA journal_mode").fetchone()[0])
        finally:
            conn.close()

    with ThreadPoolExecutor(8) as pool:
        for round_ in range(60):
            path = tmp_path / f"new-{round_}.db"
            assert list(pool.map(first_use, [path] * 8)) == ["wal"] * 8


async def test_an_existing_engine_is_used_and_left_open(sql_target: Any) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    config = _config.parse_url(sql_target.url)
    url = config.url or f"sqlite+aiosqlite:///{config.sqlite_path}"
    connect_args: dict[str, Any] = {}
    if config.settings.schema_:
        connect_args["server_settings"] = {"search_path": config.settings.schema_}
    engine = create_async_engine(url, connect_args=connect_args)
    key = SessionKey("engine", "s")
    try:
        async with SQLHistoryStore(client=engine) as store:
            assert await store.append(key, [Message(role="user", text="via your engine")]) == 1
            assert [m.text for m in await store.load(key, last=1)] == ["via your engine"]
        async with engine.connect() as conn:  # still usable after the store closed
            assert (await conn.execute(text("SELECT 1"))).scalar() == 1
        async with SQLHistoryStore(sql_target.url) as other:  # the same data through a URL
            assert await other.count(key) == 1
            await other.delete(key)
    finally:
        await engine.dispose()


@pytest.mark.reliability
async def test_cancelled_calls_leak_no_connection(sql_target: Any) -> None:
    store = SQLHistoryStore(sql_target.url)
    key = SessionKey("cancel", "s")
    try:
        await store.count(key)
        for wait in (0, 0.001, 0.003):
            task = asyncio.create_task(store.append(key, [Message(role="user", text=str(n)) for n in range(200)]))
            await asyncio.sleep(wait)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        transport: Any = store._transport
        if hasattr(transport, "engine"):  # every connection checked out is one kept idle for the next call
            assert transport.engine.sync_engine.pool.checkedout() == transport.kept
        # Each cancelled append either committed before the cancellation reached it or rolled back whole, and
        # its outcome is final by the time the caller sees the cancellation.
        stored = await store.count(key)
        assert stored % 200 == 0
        await asyncio.sleep(0.05)
        assert await store.count(key) == stored
        assert await store.append(key, [Message(role="user", text="after")]) == 1
        await store.delete(key)
    finally:
        await store.close()


async def test_spans_name_the_database_family_and_its_server(sql_target: Any, telemetry: Telemetry) -> None:
    from sqlalchemy.engine import make_url

    async with open_store(sql_target.url) as store:
        await store.count(SessionKey("telemetry", "s"))
    server = make_url(sql_target.url) if sql_target.family != "sqlite" else None
    assert telemetry.span("count").attributes == {
        "db.system.name": store.dialect,
        "db.operation.name": "count",
        **({"server.address": server.host, "server.port": server.port} if server else {}),
    }
    assert store.dialect == sql_target.family


@pytest.mark.reliability
async def test_outage_raises_unavailable_and_recovers(sql_target: Any, telemetry: Telemetry) -> None:
    if sql_target.family == "sqlite":
        pytest.skip("SQLite has no server connection to lose")
    from sqlalchemy.engine import make_url

    parsed = make_url(sql_target.url)
    default_port = 5432 if sql_target.family == "postgresql" else 3306
    proxy = LoopbackProxy(parsed.port or default_port, upstream_host=parsed.host or "127.0.0.1")
    port = await proxy.start()
    url = sql_target.url.replace(f"{parsed.host}:{parsed.port}", f"127.0.0.1:{port}")
    store = SQLHistoryStore(url, connect_timeout=3)
    key = SessionKey("outage", "s")
    try:
        assert await store.append(key, [Message(role="user", text="before")]) == 1
        proxy.down()
        for _ in range(2):  # pooled connections are dead, new ones are refused: every call fails fast
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError) as caught:
                await store.append(key, [Message(role="user", text="during")])
            assert time.monotonic() - started < 10
            assert caught.value.__cause__ is not None
            assert "secret" not in str(caught.value)
        proxy.restore()
        # The very next call after the database is back succeeds (old pooled connections are replaced).
        assert await store.append(key, [Message(role="user", text="after")]) == 1
        assert [m.text for m in await store.load(key)] == ["before", "after"]
        # The first call in the outage found its pooled connection dead and tried once more on a new one.
        failed = telemetry.spans()[1]
        assert (failed.attributes["error.type"], failed.attributes["chatkeep.retries"]) == ("StoreUnavailableError", 1)
        assert [(event.name, event.attributes) for event in failed.events] == [
            ("retry", {"chatkeep.retry.reason": "connection lost", "chatkeep.retry.attempt": 1})
        ]
        await store.delete(key)
    finally:
        await store.close()
        await proxy.aclose()


def test_sqlite_runs_a_sync_views_call_in_the_callers_thread_and_an_async_one_in_a_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chatkeep.sql import _sqlite
    from chatkeep.sql._sqlite import SQLiteTransport

    opened: list[Any] = []
    ran_in: list[int] = []
    connect, run_through = SQLiteTransport.connect, _sqlite._run_through

    def recorded_connect(self: SQLiteTransport) -> Any:
        opened.append(connect(self))
        return opened[-1]

    def recorded_run(operation: Any) -> Any:
        ran_in.append(threading.get_ident())
        return run_through(operation)

    monkeypatch.setattr(SQLiteTransport, "connect", recorded_connect)
    monkeypatch.setattr(_sqlite, "_run_through", recorded_run)
    key = SessionKey("t", "s")
    view = open_store(f"sqlite:///{tmp_path / 'sync.db'}").sync()
    try:
        view.count(key)  # the schema is made in a worker thread, once
        ran_in.clear()
        for n in range(20):
            assert view.append(key, [Message(role="user", text=f"m{n}")]) == 1
            assert [m.text for m in view.load(key, last=1)] == [f"m{n}"]
        assert set(ran_in) == {threading.get_ident()}  # no hop to a worker and back
        ran_in.clear()
        assert asyncio.run(view.store.count(key)) == 20  # an application's loop: never blocked
        assert threading.get_ident() not in ran_in
        # (calls from many threads at once: tests/test_sync_backends.py, on this transport too)
    finally:
        view.close()
    for conn in opened:  # closing the store closed every connection, those of the callers' calls too
        with pytest.raises(sqlite3.ProgrammingError):
            conn.execute("SELECT 1")


@pytest.mark.parametrize("driver", ["sqlite", "sqlite+aiosqlite"])
@pytest.mark.parametrize(("query", "level"), [("", 1), ("?synchronous=normal", 1), ("?synchronous=FULL", 2)])
async def test_sqlite_synchronous_option_sets_the_pragma_on_every_connection(
    tmp_path: Path, driver: str, query: str, level: int
) -> None:
    async with open_store(f"{driver}:///{tmp_path / 'sync.db'}{query}") as store:
        await store.append(SessionKey("t", "s"), [Message(role="user", text="hi")])  # connects
        levels = await store._fetch("PRAGMA synchronous", ())
    assert [tuple(row) for row in levels] == [(level,)]  # 1 is NORMAL, 2 is FULL


@pytest.mark.parametrize("url", ["sqlite:///{path}", "sqlite:///{path}?transport=apsw", "sqlite+aiosqlite:///{path}"])
@pytest.mark.parametrize(("option", "mapped"), [("", 1 << 30), ("mmap_size=0", 0), ("mmap_size=65536", 65536)])
async def test_sqlite_mmap_size_option_sets_the_pragma_on_every_connection(
    tmp_path: Path, url: str, option: str, mapped: int
) -> None:
    if "apsw" in url:
        pytest.importorskip("apsw")
    url = url.format(path=tmp_path / "mapped.db")
    async with open_store(url + ("&" if "?" in url else "?") + option if option else url) as store:
        await store.append(SessionKey("t", "s"), [Message(role="user", text="hi")])  # connects
        sizes = await store._fetch("PRAGMA mmap_size", ())
    assert [tuple(row) for row in sizes] == [(mapped,)]


_KILLED_WRITER = """
import asyncio, sys
from chatkeep.core import Message, SessionKey, open_store

async def main():
    store = open_store(sys.argv[1])
    for n in range(100_000):
        batch = [Message(role="user", text=f"{sys.argv[2]}:{n}/{i}") for i in range(20)]
        await store.append(SessionKey("t", "s"), batch)
        print(f"{sys.argv[2]}:{n}", flush=True)

asyncio.run(main())
"""


@pytest.mark.reliability
@pytest.mark.parametrize("synchronous", ["normal", "full"])
def test_sqlite_file_passes_its_integrity_check_after_writers_are_killed(
    tmp_path: Path, synchronous: str, sql_target: Any
) -> None:
    if sql_target.family != "sqlite":
        pytest.skip("a test of SQLite files: it runs in the SQLite session")
    url = f"sqlite:///{tmp_path / 'killed.db'}?synchronous={synchronous}"
    acknowledged: set[str] = set()
    for round_ in range(5):
        child = subprocess.Popen(
            [sys.executable, "-c", _KILLED_WRITER, url, str(round_)], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        for _ in range(random.randint(2, 20)):
            acknowledged.add(child.stdout.readline().strip())
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        acknowledged.update(child.stdout.read().split())  # printed before the kill
        child.stdout.close()
    conn = sqlite3.connect(tmp_path / "killed.db")
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        texts = [
            row[0] for row in conn.execute("SELECT json_extract(record, '$.contents[0].text') FROM chatkeep_messages")
        ]
    finally:
        conn.close()
    stored: dict[str, int] = {}
    for text in texts:
        append = text.split("/")[0]
        stored[append] = stored.get(append, 0) + 1
    assert acknowledged <= set(stored), "an acknowledged append is gone"
    assert set(stored.values()) == {20}, "an append was stored in part"


async def test_pop_without_delete_returning_is_atomic(sql_target: Any) -> None:
    # MySQL has no DELETE ... RETURNING: pop reads the newest row FOR UPDATE and deletes it. The server here is
    # MariaDB, which has RETURNING, so its stores (once they met the server) are switched to the statements
    # chatkeep uses on MySQL.
    if sql_target.family != "mysql":
        pytest.skip("the MySQL pop statements need a MySQL or MariaDB server")
    stores = [SQLHistoryStore(sql_target.url) for _ in range(4)]
    try:
        for store in stores:
            await store.count(SessionKey("pop-mysql", "nothing"))  # met the server: use_server has run
            transport: Any = store._transport
            store._sql = transport.statements = _sql.Statements("mysql", store._sql._paramstyle, is_mariadb=False)
            assert store._sql.pop[1] is False
        key = SessionKey("pop-mysql", f"s-{random.getrandbits(48):x}")
        batch = [Message(role="user", text=f"m{n}") for n in range(30)]
        await stores[0].append(key, batch)

        async def drain(store: SQLHistoryStore) -> list[str]:
            popped = []
            while (message := await store.pop(key)) is not None:
                popped.append(message.message_id)
            return popped

        drained = await asyncio.gather(*(drain(store) for store in stores))
        everything = [message_id for popped in drained for message_id in popped]
        assert sorted(everything) == sorted(m.message_id for m in batch), "a message was popped twice or lost"
        assert await stores[0].count(key) == 0
        await stores[0].delete(key)
    finally:
        for store in stores:
            await store.close()


def test_transport_defaults_to_the_drivers_own_and_sqlalchemy_runs_on_any_driver() -> None:
    assert _config.parse_url("sqlite:///x.db").transport == "sqlite3"
    assert _config.parse_url("postgresql+asyncpg://u@h/db").transport == "asyncpg"
    assert _config.parse_url("mysql+asyncmy://root@h/db").transport == "asyncmy"
    assert _config.parse_url("postgresql+psycopg://u@h/db").transport == "sqlalchemy"
    assert _config.parse_url("sqlite+aiosqlite:///x.db").transport == "sqlalchemy"
    on_engine = _config.parse_url("sqlite:///x.db?transport=sqlalchemy")
    assert (on_engine.transport, on_engine.url) == ("sqlalchemy", "sqlite+aiosqlite:///x.db")
    assert _config.parse_url("postgresql+asyncpg://u@h/db", transport="sqlalchemy").transport == "sqlalchemy"
    with pytest.raises(SQLURLError, match="the asyncpg transport runs on the asyncpg driver, not psycopg"):
        _config.parse_url("postgresql+psycopg://u@h/db?transport=asyncpg")
    with pytest.raises(SQLURLError, match="transport=sqlalchemy"):
        _config.parse_url("sqlite+aiosqlite:///x.db?transport=sqlite3")
    with pytest.raises(SQLURLError, match="must be one of sqlite3, apsw, asyncpg, asyncmy, sqlalchemy"):
        _config.parse_url("sqlite:///x.db?transport=pysqlite3")
    with pytest.raises(SQLURLError, match="the apsw transport runs on the apsw driver"):
        _config.parse_url("postgresql://u@h/db?transport=apsw")
    if importlib.util.find_spec("apsw") is not None:
        assert (_config.parse_url("sqlite:///x.db?transport=apsw").transport, on_engine.family) == ("apsw", "sqlite")


def test_statement_timeout_is_for_servers_and_defaults_to_30_seconds() -> None:
    assert _config.parse_url("postgresql://u@h/db").settings.statement_timeout == 30.0
    assert _config.parse_url("mysql://root@h/db?statement_timeout=2.5").settings.statement_timeout == 2.5
    assert _config.parse_url("postgresql://u@h/db", statement_timeout=5).settings.statement_timeout == 5.0
    assert _config.parse_url("sqlite://").settings.statement_timeout is None
    with pytest.raises(SQLURLError, match="busy_timeout"):
        _config.parse_url("sqlite:///x.db?statement_timeout=5")
    with pytest.raises(SQLURLError, match="positive"):
        _config.parse_url("postgresql://u@h/db?statement_timeout=0")


@pytest.mark.parametrize("driver", ["default", "psycopg"])
async def test_a_call_blocked_by_another_transactions_lock_fails_at_the_statement_timeout(
    sql_target: Any, driver: str
) -> None:
    # A client that keeps a session's row locked (stuck in a transaction) must not hang every appender: the server
    # cancels the waiting statement at statement_timeout, nothing of the append is stored, and once the lock is
    # released the store works on (the cancelled connection is not reused in a broken state). asyncpg takes the
    # timeout as a startup setting, the other drivers by a statement when they connect.
    if sql_target.family == "sqlite":
        pytest.skip(
            "SQLite writers wait at most busy_timeout (test_sqlite_writer_waits_for_the_lock_instead_of_failing)"
        )
    url = sql_target.url
    if driver == "psycopg":
        if sql_target.family != "postgresql":
            pytest.skip("psycopg is a PostgreSQL driver")
        url = re.sub(r"^postgres(ql)?(\+\w+)?://", "postgresql+psycopg://", url)
    store = SQLHistoryStore(url, statement_timeout=1)
    try:
        key = SessionKey("timeouts", f"s-{random.getrandbits(48):x}")
        await store.append(key, [Message(role="user", text="before")])
        with sql_target.holding(sql_target.name, "SELECT id FROM chatkeep_sessions FOR UPDATE"):
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError, match="statement_timeout=1 s") as caught:
                await store.append(key, [Message(role="user", text="blocked")])
            waited = time.monotonic() - started
            assert "statement_timeout" in str(caught.value)  # says which option to raise
            assert await store.load(key) != []  # reads never wait for a writer's lock
        assert 0.9 <= waited < 10, f"the append waited {waited:.1f} s, not about the 1 s timeout"
        assert [m.text for m in await store.load(key)] == ["before"], "the cancelled append stored something"
        await store.append(key, [Message(role="user", text="after")])
        assert [m.text for m in await store.load(key)] == ["before", "after"]
        await store.delete(key)
    finally:
        await store.close()


@pytest.mark.parametrize("damage", ['{"type": "sess', "[1, 2]", b"\xff\xfe"])
async def test_a_damaged_session_document_names_the_session(
    tmp_path: Path, damage: str | bytes, sql_target: Any
) -> None:
    if sql_target.family != "sqlite":
        pytest.skip("it damages a SQLite file: it runs in the SQLite session")
    url = f"sqlite:///{tmp_path / 'damaged.db'}"
    key = SessionKey("t-damaged", "s-damaged")
    async with open_store(url) as store:
        await store.save_session(key, AgentSession(session_id=key.session_id, tenant=key.tenant))
    conn = sqlite3.connect(tmp_path / "damaged.db")  # write garbage where the document is kept
    try:
        with conn:
            assert conn.execute("UPDATE chatkeep_sessions SET document = ?", (damage,)).rowcount == 1
    finally:
        conn.close()
    async with open_store(url) as store:
        with pytest.raises(SessionFormatError) as caught:
            await store.load_session(key)
        assert "session 's-damaged' in tenant 't-damaged' is damaged" in str(caught.value)
        assert "chatkeep sessions delete s-damaged --tenant t-damaged" in str(caught.value)


@pytest.mark.parametrize("transport", ["asyncmy", "sqlalchemy"])
async def test_a_repeated_append_on_mysql_is_silent_and_counted_exactly(
    sql_target: Any, transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    # INSERT IGNORE made the server raise a warning per skipped message, which asyncmy fetched with SHOW WARNINGS
    # (a round trip) and logged: a resumed copy printed a "Duplicate entry" line per message.
    if sql_target.family != "mysql":
        pytest.skip("MySQL/MariaDB only")
    key = SessionKey("repeat", f"s-{random.getrandbits(48):x}")
    batch = [Message(role="user", text=str(n)) for n in range(5)]
    async with SQLHistoryStore(sql_target.url, transport=transport) as store:
        assert await store.append(key, batch[:3]) == 3
        with caplog.at_level(logging.DEBUG), warnings.catch_warnings():
            warnings.simplefilter("error")
            assert await store.append(key, batch) == 2  # 3 stored already: skipped silently
            assert await store.append(key, batch) == 0
        assert [r.getMessage() for r in caplog.records if r.name.startswith(("asyncmy", "aiomysql"))] == []
        assert await store.count(key) == 5
        assert [m.text for m in await store.load(key)] == [str(n) for n in range(5)]
        (info,) = [i for i in (await store.list_sessions("repeat", limit=1000)).items if i.session_id == key.session_id]
        assert info.message_count == 5
        await store.delete(key)


async def test_an_engine_of_your_own_on_mysql_still_counts_repeated_appends_exactly(sql_target: Any) -> None:
    # SQLAlchemy's MySQL dialects always connect with CLIENT_FOUND_ROWS: appends then keep INSERT IGNORE.
    from sqlalchemy.ext.asyncio import create_async_engine

    if sql_target.family != "mysql":
        pytest.skip("MySQL/MariaDB only")
    config = _config.parse_url(sql_target.url)
    assert config.url is not None
    engine = create_async_engine(config.url)
    key = SessionKey("repeat-engine", f"s-{random.getrandbits(48):x}")
    batch = [Message(role="user", text=str(n)) for n in range(4)]
    try:
        async with SQLHistoryStore(client=engine) as store:
            assert await store.append(key, batch[:1]) == 1
            assert await store.append(key, batch) == 3
            assert await store.append(key, batch) == 0
            assert await store.count(key) == 4
            await store.delete(key)
    finally:
        await engine.dispose()


@pytest.mark.parametrize("wrong", ["database", "user"])
async def test_a_database_or_user_that_does_not_exist_is_a_configuration_error(
    sql_target: Any, wrong: str, tmp_path: Path
) -> None:
    # It was reported as the server being unavailable ("check that it is running"): no retry fixes a wrong name.
    from sqlalchemy.engine import make_url

    if sql_target.family == "sqlite":
        if wrong == "user":
            pytest.skip("SQLite files have no users")
        path = tmp_path / "notes.db"
        path.write_bytes(b"these are my notes, not a database" * 200)
        url = f"sqlite:///{path}"
        expected = "not a SQLite database"
    else:
        server = make_url(sql_target.server_url)
        if wrong == "database":
            server = server.set(database="chatkeep_no_such_database")
            expected = "does not exist there"
        else:
            server = server.set(username="chatkeep_no_such_user")
            expected = "refused the URL's user or password"
        url = server.render_as_string(hide_password=False)
    store = open_store(url)
    try:
        with pytest.raises(StoreConfigurationError, match=expected) as caught:
            await store.count(SessionKey("wrong", "s"))
        assert "check that it is running" not in str(caught.value)
    finally:
        await store.close()
    if sql_target.family == "sqlite":
        assert path.read_bytes().startswith(b"these are my notes")  # left as it was


async def test_an_engine_of_your_own_refuses_options_only_a_url_can_apply() -> None:
    # They were parsed as SQLite options and ignored: statement_timeout was refused as "not for SQLite URLs", and
    # pool_size or busy_timeout silently did nothing on a PostgreSQL engine.
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine("postgresql+asyncpg://u@127.0.0.1:1/db")  # never connected
    try:
        for option in ({"pool_size": 3}, {"busy_timeout": 1.0}, {"statement_timeout": 2.0}, {"schema": "app"}):
            with pytest.raises(SQLURLError, match=f"with client=.*{next(iter(option))} would be ignored"):
                SQLHistoryStore(client=engine, **option)
        assert SQLHistoryStore(client=engine, max_message_bytes=1000).max_message_bytes == 1000
    finally:
        await engine.dispose()


@pytest.mark.parametrize(
    ("is_mariadb", "version", "row_alias"),
    [
        (False, (8, 0, 19), True),  # the first MySQL with a row alias
        (False, (8, 4, 3), True),
        (False, (9, 1, 0), True),
        (False, (8, 0, 18), False),
        (False, (5, 7, 44), False),
        (False, None, False),  # not connected yet: the form every server takes
        (True, (10, 11, 6, "MariaDB"), False),  # MariaDB has no row alias, whatever its version number
        (True, (11, 4, 2), False),
    ],
)
def test_the_mysql_upsert_names_the_inserted_row_by_an_alias_from_mysql_8_0_19(
    is_mariadb: bool, version: tuple[object, ...] | None, row_alias: bool
) -> None:
    statements = _sql.Statements("mysql", "format", is_mariadb=is_mariadb, server_version=version)
    assert statements.row_alias is row_alias
    if row_alias:  # VALUES() is deprecated from MySQL 8.0.20: one warning per statement
        assert "VALUES(" not in statements.upsert
        assert ") AS incoming ON DUPLICATE KEY UPDATE next_seq = next_seq + incoming.next_seq," in statements.upsert
        assert "message_count = message_count + incoming.message_count" in statements.upsert
        assert "GREATEST(updated_at, incoming.updated_at)" in statements.upsert
    else:
        assert " AS incoming" not in statements.upsert
        assert "next_seq = next_seq + VALUES(next_seq)" in statements.upsert
        assert "GREATEST(updated_at, VALUES(updated_at))" in statements.upsert
    assert statements.upsert.endswith(" RETURNING id, next_seq, base_ref") is is_mariadb
    assert statements.upsert.count("%s") == 8


def test_the_server_met_at_connect_decides_the_upsert() -> None:
    statements = _sql.Statements("mysql", "format")  # a mysql:// URL, before the first connection
    assert "VALUES(next_seq)" in statements.upsert
    statements.use_server(is_mariadb=False, version=(8, 0, 36))
    assert "incoming.next_seq" in statements.upsert
    assert not statements.upsert.endswith("RETURNING id, next_seq")
    assert statements.pop[1] is False
    statements.use_server(is_mariadb=True, version=(10, 11, 6))  # the URL said mysql://, the server is MariaDB
    assert "VALUES(next_seq)" in statements.upsert
    # MariaDB returns the reserved range from the upsert, and the popped record from its DELETE (one round trip less)
    assert statements.upsert.endswith(" RETURNING id, next_seq, base_ref")
    assert statements.pop[1] is True
    statements.use_server(is_mariadb=True, version=(10, 4, 30))  # before INSERT ... RETURNING
    assert not statements.upsert.endswith("RETURNING id, next_seq")
    assert statements.pop[1] is True
    postgres = _sql.Statements("postgresql", "numeric_dollar")
    before = postgres.upsert
    postgres.use_server(is_mariadb=False, version=(16, 4))
    assert postgres.upsert == before


async def test_appends_on_this_server_use_the_upsert_its_version_takes(sql_target: Any) -> None:
    if sql_target.family != "mysql":
        pytest.skip("the row alias is a MySQL/MariaDB matter")
    (version,) = sql_target.admin("SELECT VERSION()")[0]
    store = SQLHistoryStore(sql_target.url)
    try:
        key = SessionKey("upsert-form", f"s-{random.getrandbits(48):x}")
        first = [Message(role="user", text=f"a{n}") for n in range(3)]
        second = [Message(role="user", text=f"b{n}") for n in range(2)]
        assert await store.append(key, first) == 3
        assert await store.append(key, second) == 2  # the upsert's update branch: next_seq and count add up
        assert [m.text for m in await store.load(key)] == ["a0", "a1", "a2", "b0", "b1"]
        assert await store.count(key) == 5
        assert (await store.list_sessions(key.tenant)).items[0].message_count == 5
        if "mariadb" in str(version).lower():
            assert not store._sql.row_alias
            assert "VALUES(next_seq)" in store._sql.upsert
            assert store._sql.upsert.endswith(" RETURNING id, next_seq, base_ref")  # no locked read back on MariaDB
        else:
            numbers = tuple(int(part) for part in re.findall(r"\d+", str(version))[:3])
            assert store._sql.row_alias is (numbers >= _sql.MYSQL_ROW_ALIAS)
        await store.delete(key)
    finally:
        await store.close()


async def test_postgresql_writes_over_a_stored_document_in_one_statement(
    sql_target: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if sql_target.family != "postgresql":
        pytest.skip("a document's write in one statement is PostgreSQL's (the others take a transaction)")
    from chatkeep.sql._transport import Connection

    statements: list[str] = []
    fetch, execute = Connection.fetch, Connection.execute

    async def counted_fetch(self: Connection, statement: str, params: Any = ()) -> Any:
        statements.append(statement)
        return await fetch(self, statement, params)

    async def counted_execute(self: Connection, statement: str, params: Any = ()) -> Any:
        statements.append(statement)
        return await execute(self, statement, params)

    tenant = f"doc-one-{random.getrandbits(48):x}"
    key = SessionKey(tenant, "s")
    store = SQLHistoryStore(sql_target.url)

    def doc(n: int) -> AgentSession:
        return AgentSession(session_id="s", tenant=tenant, state={"n": n})

    try:
        first = await store.save_session(key, doc(1), owner="alice")  # the first document: the transaction
        monkeypatch.setattr(Connection, "fetch", counted_fetch)
        monkeypatch.setattr(Connection, "execute", counted_execute)
        second = await store.save_session(key, doc(2), expected_version=first, owner="alice")
        third = await store.save_session(key, doc(3))  # no version, no owner: whatever is stored
        assert statements == [store._sql.doc_write_one] * 2
        assert len({first, second, third}) == 3
        # What the statement refuses goes to the transaction, which says why; nothing is written.
        for version in (first, "not-a-version", f"{third} ", f"0{third}", f"{third}.0"):
            with pytest.raises(ConcurrencyConflictError):
                await store.save_session(key, doc(9), expected_version=version)
        with pytest.raises(SessionOwnershipError):
            await store.save_session(key, doc(9), expected_version=third, owner="bob")
        monkeypatch.undo()
        stored = await store.load_session(key)
        assert stored is not None
        assert (stored.version, stored.session.state, stored.owner) == (third, {"n": 3}, "alice")
        # Of writers holding one version, exactly one writes; the others are told of the conflict.
        outcomes = await asyncio.gather(
            *(store.save_session(key, doc(10 + n), expected_version=third) for n in range(8)), return_exceptions=True
        )
        won = [outcome for outcome in outcomes if isinstance(outcome, str)]
        assert len(won) == 1
        assert all(isinstance(o, ConcurrencyConflictError) for o in outcomes if not isinstance(o, str))
        stored = await store.load_session(key)
        assert stored is not None
        assert stored.version == won[0]
        assert stored.session.state == {"n": 10 + outcomes.index(won[0])}
    finally:
        monkeypatch.undo()
        await store.delete_tenant(tenant)
        await store.close()


async def test_postgresql_reads_a_fork_chains_window_in_one_statement(
    sql_target: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if sql_target.family != "postgresql":
        pytest.skip(
            "one statement for a chain's window is PostgreSQL's (SQLite runs in-process; MySQL reads by stretch)"
        )
    from chatkeep.sql._transport import Connection

    statements: list[str] = []
    fetch = Connection.fetch

    async def counted(self: Connection, statement: str, params: Any = ()) -> Any:
        statements.append(statement)
        return await fetch(self, statement, params)

    tenant = f"chain-{random.getrandbits(48):x}"
    store = SQLHistoryStore(sql_target.url)
    try:
        keys = [SessionKey(tenant, f"s{n}") for n in range(4)]
        await store.append(keys[0], [Message(role="user", text=f"root-{n}") for n in range(30)])
        for n in range(1, 4):  # a fork of a fork of a fork, each through its source's one but last message
            await store.fork(keys[n - 1], keys[n], through=(await store.load(keys[n - 1], last=2))[0].message_id)
            await store.append(keys[n], [Message(role="user", text=f"own{n}-{i}") for i in range(3)])
        whole = [m.text for m in await store.load(keys[3])]  # four stretches, in four rows
        assert whole == [f"root-{n}" for n in range(29)] + ["own1-0", "own1-1", "own2-0", "own2-1"] + [
            f"own3-{i}" for i in range(3)
        ]
        monkeypatch.setattr(Connection, "fetch", counted)
        for depth in (1, 3):
            for last in (None, 2, 20):
                statements.clear()
                before = store.messages_read
                window = [m.text for m in await store.load(keys[depth], last=last)]
                # The plain read (a fork has none of its own rows there), then the whole chain in one statement.
                assert len(statements) == 2, statements
                assert statements[1] in (store._sql.chain_all, store._sql.chain_last)
                assert store.messages_read - before == len(window)
            if depth == 3:
                assert window == whole[-20:]
        statements.clear()
        paged = [m.text async for m in store.iter_messages(keys[3], batch=10)]
        assert paged == whole
        assert statements.count(store._sql.chain_page) == 4  # one statement per page of 10 (36 messages)
        assert len(statements) == 5  # and the plain first page
    finally:
        monkeypatch.undo()
        await store.delete_tenant(tenant)
        await store.close()


async def test_postgresql_appends_any_batch_size_exactly_and_plans_a_short_one_once(fresh_backing: Any) -> None:
    if fresh_backing.target.family != "postgresql":
        pytest.skip("the one-statement append is PostgreSQL's")
    import psycopg

    from chatkeep.sql._ops import append_params
    from chatkeep.sql._schema import key_hash
    from chatkeep.testing.conformance._info import costly_messages

    store = SQLHistoryStore(fresh_backing.url)
    try:
        # Both shapes of the statement (a VALUES list up to PG_VALUES_ROWS messages, arrays above), with and
        # without usage: stored in order, counted once, a retry changes nothing.
        for n in (1, 2, _sql.PG_VALUES_ROWS, _sql.PG_VALUES_ROWS + 1):
            for costly in (False, True):
                key = SessionKey("shapes", f"s{n}-{costly}")
                batch = (
                    costly_messages(n, f"b{n}")
                    if costly
                    else [Message(role="user", text=f"p{n}-{i}") for i in range(n)]
                )
                for _ in range(2):
                    await store.append(key, batch)
                assert [m.message_id for m in await store.load(key)] == [m.message_id for m in batch]
                assert await store.count(key) == n
                used = await store.usage(key)
                assert used.input_tokens == (n * (n + 1) // 2 if costly else 0)
        head = key_hash("shapes", "s1-False")  # the first session above
    finally:
        await store.close()
    # The short append's statement has one plan whatever its values: a connection plans it once (a generic plan)
    # rather than at every run, as it would an array's (whose length a generic plan does not know).
    statements = _sql.Statements("postgresql", "numeric_dollar")
    server = re.sub(r"^postgresql\+\w+://", "postgresql://", fresh_backing.target.server_url)
    with psycopg.connect(server, autocommit=True) as pg:
        pg.execute(f'SET search_path TO "{fresh_backing.name}"')
        [(tenant_hash, tenant, session_id)] = pg.execute(
            "SELECT tenant_hash, tenant, session_id FROM chatkeep_sessions WHERE key_hash = %s", (head,)
        ).fetchall()
        cursor = psycopg.ClientCursor(pg)
        for n in (1, 2):
            pg.execute(f"PREPARE append{n} AS {statements.pg_append(n, usage=False)}")
            for run in range(8):
                rows = [(random.randbytes(16), Message(role="user", text=f"{run}").to_record(), None) for _ in range(n)]
                params = append_params((head, bytes(tenant_hash), bytes(tenant), bytes(session_id)), 1, rows)
                cursor.execute(f"EXECUTE append{n}({', '.join(['%s'] * len(params))})", params)
                assert cursor.fetchall() == [(n,)]
            [(generic, custom)] = pg.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = %s", (f"append{n}",)
            ).fetchall()
            assert generic >= 3, (generic, custom)  # (the server tries custom plans for its first five runs)


def _plan(backing: Any, family: str, statement: str, params: tuple[object, ...]) -> list[str]:
    """How the database runs ``statement`` (``?`` placeholders): one line per step, naming its table and index."""
    if family == "sqlite":
        return [str(row[-1]) for row in backing.execute((f"EXPLAIN QUERY PLAN {statement}", params))]
    if family == "postgresql":
        [(plan,)] = backing.execute((f"EXPLAIN (FORMAT JSON) {statement}", params))
        steps: list[str] = []
        nodes = [plan[0]["Plan"]]
        while nodes:
            node = nodes.pop()
            steps.append(" ".join(str(node.get(k, "")) for k in ("Node Type", "Relation Name", "Index Name")))
            nodes += node.get("Plans", [])
        return steps
    rows = backing.execute((f"EXPLAIN {statement}", params))
    shift = 0 if rows and rows[0][3] in _ACCESS_TYPES else 1  # MySQL 8 has a partitions column, MariaDB none
    return [f"{row[2]} {row[3 + shift]} {row[5 + shift]}" for row in rows]  # table, access type, index


#: MySQL's and MariaDB's ``EXPLAIN`` access types (``ALL``: every row; ``index``: every entry of an index).
_ACCESS_TYPES = {"system", "const", "eq_ref", "ref", "fulltext", "ref_or_null", "index_merge", "unique_subquery"}
_ACCESS_TYPES |= {"index_subquery", "range", "index", "ALL", None}


async def test_a_tag_filter_reads_through_the_tag_index_never_the_tenant(fresh_backing: Any) -> None:
    """``list_sessions(tag=...)``: the database finds the tagged sessions through the tag index (EXPLAIN says so).

    50,000 sessions in one tenant, all with one tag and 50 with another, statistics gathered: no plan scans the
    sessions or the tags (or walks an index of all of them) to find the 50.
    """
    from chatkeep.sql._schema import tag_hash, tenant_hash

    family = fresh_backing.target.family
    store = SQLHistoryStore(fresh_backing.url)
    try:
        await store.migrate()
    finally:
        await store.close()
    sessions = 50_000
    digits = "(SELECT 0 AS d UNION ALL " + " UNION ALL ".join(f"SELECT {d}" for d in range(1, 10)) + ")"
    numbers = (
        f"(SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d + 1 AS i FROM {digits} a, {digits} b, "
        f"{digits} c, {digits} e, {digits} f) n WHERE n.i <= ?"
    )
    key = {
        "sqlite": "randomblob(32)",
        "postgresql": "decode(md5('k' || i) || md5('x' || i), 'hex')",
        "mysql": "UNHEX(SHA2(CONCAT('k', i), 256))",
    }[family]
    session_id = {
        "sqlite": "CAST(i AS BLOB)",
        "postgresql": "convert_to(i::text, 'UTF8')",
        "mysql": "CAST(i AS BINARY)",
    }
    insert = (
        "INSERT INTO chatkeep_sessions (key_hash, tenant_hash, tenant, session_id, created_at, updated_at, next_seq, "
        f"message_count) SELECT {key}, ?, ?, {session_id[family]}, i, i, 0, 0 FROM {numbers}"
    )
    tag, common = tag_hash("big", "rare"), tag_hash("big", "every")
    # One session in 1,000 (ids are 1 to 50,000, as updated_at), spread over the tenant's history.
    every = "id DIV 1000 * 1000 = id" if family == "mysql" else "id / 1000 * 1000 = id"
    analyze = {"sqlite": "ANALYZE", "postgresql": "ANALYZE", "mysql": "ANALYZE TABLE chatkeep_sessions, chatkeep_tags"}
    fresh_backing.execute(
        (insert, (tenant_hash("big"), b"big", sessions)),
        (
            f"INSERT INTO chatkeep_tags (session_ref, tag_hash) SELECT id, ? FROM chatkeep_sessions WHERE {every}",
            (tag,),
        ),
        ("INSERT INTO chatkeep_tags (session_ref, tag_hash) SELECT id, ? FROM chatkeep_sessions", (common,)),
        (analyze[family], ()),
    )
    statements = _sql.Statements(family, "qmark")
    for statement, params in (
        (statements.tagged_first, (tag, 21)),
        (statements.tagged_after, (tag, 31_000, 31_000, 31_000, 21)),  # page 2
    ):
        steps = _plan(fresh_backing, family, statement, params)
        assert any("ix_chatkeep_tags_tag" in step for step in steps), steps
        scans = [
            s
            for s in steps
            if re.search(r"\bSCAN chatkeep_(sessions|tags)\b|Seq Scan|chatkeep_(sessions|tags) (ALL|index)\b", s)
        ]
        assert scans == [], steps
        assert not any("ix_chatkeep_sessions_updated" in step for step in steps), steps


def test_ctrl_c_during_a_blocking_append_leaves_the_session_whole_or_untouched(
    sql_target: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A sync view's append runs in the caller's own task, without a shield (finish_if_cancelled): Ctrl-C (here a
    # loop callback raising KeyboardInterrupt, as Python's handler does) must still let the write end, rolled back
    # if it had not committed, before the interrupt reaches the caller.
    if sql_target.family == "sqlite":
        pytest.skip("SQLite runs a blocking call's write in place, with the loop paused: Ctrl-C stops Python there")
    from chatkeep.sql._transport import Connection

    pressed: list[bool] = []
    fetch, execute = Connection.fetch, Connection.execute

    def press_ctrl_c_once() -> None:
        if not pressed:
            pressed.append(True)

            def ctrl_c() -> None:
                raise KeyboardInterrupt

            asyncio.get_running_loop().call_soon(ctrl_c)  # fires while the statement waits for the server

    async def pressing_fetch(self: Connection, statement: str, params: Any = ()) -> Any:
        press_ctrl_c_once()
        return await fetch(self, statement, params)

    async def pressing_execute(self: Connection, statement: str, params: Any = ()) -> Any:
        press_ctrl_c_once()
        return await execute(self, statement, params)

    key = SessionKey("ctrl-c", "s")
    batch = [Message(role="user", text=f"m{n}") for n in range(50)]
    view = SQLHistoryStore(sql_target.url).sync()
    try:
        assert view.append(key, [Message(role="user", text="before")]) == 1
        monkeypatch.setattr(Connection, "fetch", pressing_fetch)
        monkeypatch.setattr(Connection, "execute", pressing_execute)
        with pytest.raises(KeyboardInterrupt):
            view.append(key, batch)
        monkeypatch.undo()
        assert pressed
        # Ctrl-C came once the write had begun: on PostgreSQL its one statement was sent, so it ran to its end and
        # stayed; elsewhere it is a transaction, which sees the interrupt before COMMIT and rolls back whole.
        whole = ["before", *(m.text for m in batch)]
        expected = whole if sql_target.family == "postgresql" else ["before"]
        assert [m.text for m in view.load(key)] == expected
        assert view.append(key, [Message(role="user", text="after")]) == 1  # the view (and its pool) works on
        assert [m.text for m in view.load(key, last=1)] == ["after"]
        view.delete(key)
    finally:
        view.close()
