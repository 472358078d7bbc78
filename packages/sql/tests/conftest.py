"""The databases the SQL tests run against, each isolated in a schema, database or file of its own.

``CHATKEEP_TEST_SQL_URL`` names the one database a test session targets: ``sqlite://`` (a temporary
file), a ``postgresql+...://`` URL or a ``mysql+...://`` URL. Unset, every test runs on all three
defaults; a server that cannot be reached is skipped with the reason, or fails the run when
``CHATKEEP_REQUIRE_SERVICES=1`` (CI).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from chatkeep.core import HistoryStore, SessionKey
from chatkeep.sql._schema import key_hash
from chatkeep.testing import DocumentDamager
from chatkeep.testing.services import missing_service

DEFAULTS = {
    "sqlite": "sqlite://",
    "postgresql": "postgresql+asyncpg://postgres@127.0.0.1:5432/test",
    "mysql": "mysql+asyncmy://root@127.0.0.1:3306/test",
}


#: A PostgreSQL with the pgvector extension (scripts/pgvector up), for the search tests of a PostgreSQL run.
PGVECTOR_URL = os.environ.get("CHATKEEP_TEST_PGVECTOR_URL", "postgresql+asyncpg://postgres@127.0.0.1:5433/test")


def _family(url: str) -> str:
    scheme = url.split("://", 1)[0].split("+", 1)[0].lower()
    return {"postgres": "postgresql", "mariadb": "mysql"}.get(scheme, scheme)


def _targets() -> list[str]:
    chosen = os.environ.get("CHATKEEP_TEST_SQL_URL")
    return [chosen] if chosen else list(DEFAULTS.values())


@dataclass
class Target:
    """One database under test: ``url`` opens chatkeep's isolated backing there."""

    family: str
    url: str
    server_url: str  # the URL as configured (no isolation), for tests that make their own
    name: str  # the schema, database or file the run owns

    @functools.cached_property
    def can_search(self) -> bool:
        """Whether chatkeep can index and search here (PostgreSQL: the server has pgvector)."""
        return self.family == "postgresql" and has_pgvector(self.server_url)

    def url_for(self, name: str) -> str:
        """The store URL of another isolated backing ``name`` (made with :meth:`create_backing`)."""
        return _isolated_url(self.family, self.server_url, name)

    def admin(self, *statements: str, database: str | None = None) -> list[tuple[object, ...]]:
        """Run statements on the server with a sync driver; returns the last one's rows."""
        return admin_execute(self.family, self.server_url, *statements, database=database)

    def execute_in(self, name: str, statements: list[tuple[str, tuple[object, ...]]]) -> list[tuple[object, ...]]:
        """Run statements (``?`` placeholders) in the backing ``name``, outside chatkeep; the last one's rows."""
        rows: list[tuple[object, ...]] = []
        if self.family == "sqlite":
            conn = sqlite3.connect(name, isolation_level=None)
            try:
                for sql, params in statements:
                    rows = conn.execute(sql, params).fetchall()
            finally:
                conn.close()
            return rows
        host, port, user, password, dbname = _server_parts(self.server_url)
        if self.family == "postgresql":
            import psycopg

            with psycopg.connect(
                host=host, port=port, user=user, password=password, dbname=dbname, autocommit=True
            ) as pg:
                pg.execute(f'SET search_path TO "{name}"')
                for sql, params in statements:
                    cur = pg.execute(sql.replace("?", "%s"), params)  # type: ignore[arg-type]
                    rows = list(cur.fetchall()) if cur.description else []
            return rows
        import pymysql

        my = pymysql.connect(
            host=host, port=port, user=user, password=password or "", database=name, autocommit=True, charset="utf8mb4"
        )
        try:
            with my.cursor() as cur:
                for sql, params in statements:
                    cur.execute(sql.replace("?", "%s") if params else sql, params or None)
                    rows = list(cur.fetchall())
        finally:
            my.close()
        return rows

    @contextlib.contextmanager
    def holding(self, name: str, locking_sql: str) -> Iterator[None]:
        """Run ``locking_sql`` (a ``SELECT ... FOR UPDATE``) in a transaction of the backing ``name``, outside chatkeep,
        and keep that transaction, with its locks, open until the block ends (then roll it back)."""
        if self.family == "sqlite":
            raise ValueError("SQLite locks the whole file: use BEGIN IMMEDIATE on a connection of your own")
        host, port, user, password, dbname = _server_parts(self.server_url)
        if self.family == "postgresql":
            import psycopg

            with psycopg.connect(host=host, port=port, user=user, password=password, dbname=dbname) as pg:
                pg.execute(f'SET search_path TO "{name}"')
                pg.execute(locking_sql)  # psycopg opened a transaction for it
                try:
                    yield
                finally:
                    pg.rollback()
            return
        import pymysql

        my = pymysql.connect(host=host, port=port, user=user, password=password or "", database=name)
        try:
            my.begin()
            with my.cursor() as cur:
                cur.execute(locking_sql)
            yield
        finally:
            my.rollback()
            my.close()

    def create_backing(self, tmp: Path) -> str:
        """A new empty schema, database or file name on this server."""
        return create_backing(self.family, self.server_url, tmp)

    def drop_backing(self, name: str) -> None:
        """Drop a backing made by :meth:`create_backing`."""
        drop_backing(self.family, self.server_url, name)


def _server_parts(url: str) -> tuple[str, int, str, str | None, str]:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    default_port = 5432 if _family(url) == "postgresql" else 3306
    return (
        parsed.host or "127.0.0.1",
        parsed.port or default_port,
        parsed.username or ("postgres" if default_port == 5432 else "root"),
        parsed.password,
        parsed.database or "test",
    )


def admin_execute(
    family: str, server_url: str, *statements: str, database: str | None = None
) -> list[tuple[object, ...]]:
    """Run statements on the server with a sync driver (outside chatkeep); returns the last one's rows."""
    host, port, user, password, dbname = _server_parts(server_url)
    rows: list[tuple[object, ...]] = []
    if family == "postgresql":
        import psycopg

        with psycopg.connect(
            host=host,
            port=port,
            user=user,
            password=password,
            dbname=database or dbname,
            autocommit=True,
            connect_timeout=5,
        ) as conn:
            for statement in statements:
                cur = conn.execute(statement)
                rows = list(cur.fetchall()) if cur.description else []
    else:
        import pymysql

        conn = pymysql.connect(
            host=host,
            port=port,
            user=user,
            password=password or "",
            database=database or dbname,
            connect_timeout=5,
            autocommit=True,
            charset="utf8mb4",
        )
        try:
            with conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement)
                    rows = list(cur.fetchall())
        finally:
            conn.close()
    return rows


def _isolated_url(family: str, server_url: str, name: str) -> str:
    if family == "sqlite":
        return f"sqlite:///{name}"
    if family == "postgresql":
        return server_url + ("&" if "?" in server_url else "?") + f"schema={name}"
    base, _, query = server_url.partition("?")
    root = base.rsplit("/", 1)[0]
    return f"{root}/{name}" + (f"?{query}" if query else "")


def create_backing(family: str, server_url: str, tmp: Path) -> str:
    """Make an empty schema (PostgreSQL), database (MySQL) or file path (SQLite); returns its name."""
    if family == "sqlite":
        return str(tmp / f"ck_test_{uuid.uuid4().hex[:10]}.db")
    name = f"ck_test_{uuid.uuid4().hex[:12]}"
    if family == "postgresql":
        admin_execute(family, server_url, f'CREATE SCHEMA "{name}"')
    else:
        admin_execute(family, server_url, f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    return name


def drop_backing(family: str, server_url: str, name: str) -> None:
    """Drop what :func:`create_backing` made."""
    if family == "postgresql":
        admin_execute(family, server_url, f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    elif family == "mysql":
        admin_execute(family, server_url, f"DROP DATABASE IF EXISTS `{name}`")


def has_pgvector(server_url: str) -> bool:
    """Whether the PostgreSQL server at ``server_url`` can have the ``vector`` extension."""
    return bool(admin_execute("postgresql", server_url, "SELECT 1 FROM pg_available_extensions WHERE name = 'vector'"))


def reachable(family: str, server_url: str) -> str | None:
    if family == "sqlite":
        return None
    try:
        admin_execute(family, server_url, "SELECT 1")
    except Exception as exc:
        return f"{family} at {server_url} is unreachable ({type(exc).__name__}: {exc})"
    return None


@pytest.fixture(scope="session", params=_targets(), ids=_family)
def sql_target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """The database under test, with a backing (schema, database or file) this test session owns."""
    server_url: str = request.param
    family = _family(server_url)
    problem = reachable(family, server_url)
    if problem is not None:
        missing_service(problem)
    tmp = tmp_path_factory.mktemp("sql")
    name = create_backing(family, server_url, tmp)
    try:
        yield Target(family, _isolated_url(family, server_url, name), server_url, name)
    finally:
        drop_backing(family, server_url, name)


@pytest.fixture(scope="session")
def pgvector_target(sql_target: Target, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """A schema of its own on the PostgreSQL with pgvector (``CHATKEEP_TEST_PGVECTOR_URL``), in a PostgreSQL run."""
    if sql_target.family != "postgresql":
        pytest.skip("the pgvector server is tested in the PostgreSQL run")
    problem = reachable("postgresql", PGVECTOR_URL)
    if problem is not None:
        missing_service(f"{problem}; start it with scripts/pgvector up")
    name = create_backing("postgresql", PGVECTOR_URL, tmp_path_factory.mktemp("pgvector"))
    try:
        yield Target("postgresql", _isolated_url("postgresql", PGVECTOR_URL, name), PGVECTOR_URL, name)
    finally:
        drop_backing("postgresql", PGVECTOR_URL, name)


@pytest.fixture(scope="session")
def apsw_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The SQLite file the kit runs on with the apsw transport (it gets a sqlite-vec index: sqlite3 refuses it)."""
    return str(tmp_path_factory.mktemp("apsw") / "kit.db")


@pytest.fixture
def pgvector_backing(pgvector_target: Target, tmp_path: Path) -> Iterator[Target]:
    """A schema of the test's own on the PostgreSQL with pgvector (dropped afterwards)."""
    name = create_backing("postgresql", PGVECTOR_URL, tmp_path)
    try:
        yield Target("postgresql", pgvector_target.url_for(name), PGVECTOR_URL, name)
    finally:
        drop_backing("postgresql", PGVECTOR_URL, name)


@pytest.fixture
def damage_session_document(sql_target: Target) -> DocumentDamager:
    """The kit's hook: text that is not JSON in the session's ``document`` column, written outside chatkeep."""

    async def damage(store: HistoryStore, key: SessionKey) -> None:
        row = key_hash(key.tenant, key.session_id)
        update = ("UPDATE chatkeep_sessions SET document = ? WHERE key_hash = ?", ('{"type": "sess', row))
        check = ("SELECT document FROM chatkeep_sessions WHERE key_hash = ?", (row,))
        assert sql_target.execute_in(sql_target.name, [update, check]) == [('{"type": "sess',)]

    return damage


@dataclass
class Backing:
    """An empty schema, database or file a test owns: its ``name`` and the store ``url`` opening it."""

    target: Target
    name: str
    url: str

    def execute(self, *statements: tuple[str, tuple[object, ...]]) -> list[tuple[object, ...]]:
        """Run statements (``?`` placeholders) in this backing, outside chatkeep; the last one's rows."""
        return self.target.execute_in(self.name, list(statements))


@pytest.fixture
def fresh_backing(sql_target: Target, tmp_path: Path) -> Iterator[Backing]:
    """An empty backing of the test's own (dropped afterwards)."""
    name = create_backing(sql_target.family, sql_target.server_url, tmp_path)
    try:
        yield Backing(sql_target, name, sql_target.url_for(name))
    finally:
        drop_backing(sql_target.family, sql_target.server_url, name)
