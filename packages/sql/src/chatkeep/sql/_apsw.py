"""The ``apsw`` transport: SQLite through apsw, its own SQLite library, which can load extensions (sqlite-vec).

The standard library's ``sqlite3`` here cannot load extensions, so semantic recall on SQLite runs on apsw
(``?transport=apsw``, extra ``chatkeep-sql[recall]``). It is the ``sqlite3`` transport with another library
underneath: the same worker threads, one connection each, the same statements; the schema's work (SQLAlchemy
and Alembic) runs on an apsw connection too, behind a small DB-API face (:class:`_SchemaConnection`).

Two copies of the SQLite library in one process must never open the same file: POSIX file locks belong to the
process, so one library closing its descriptor drops the other's locks, and two writers can then corrupt the
file. That is why a store uses one library for a file, schema work included, and why apsw is used only when
asked: an application that also opens the file with ``sqlite3`` (or another store on it with the default
transport) would otherwise pair the two libraries without knowing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import apsw
import apsw.ext

from chatkeep.sql._config import sqlite_pragmas
from chatkeep.sql._sqlite import SQLiteTransport, _SQLiteConnection

__all__ = ["ApswTransport"]


def _sqlite_vec_path() -> str | None:
    try:
        import sqlite_vec  # type: ignore[import-untyped]
    except ImportError:
        return None
    return str(sqlite_vec.loadable_path())


class _ApswConnection(_SQLiteConnection):
    """A pooled apsw connection (see :class:`~chatkeep.sql._sqlite._SQLiteConnection`)."""

    __slots__ = ()

    async def _fetch(self, statement: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
        rows: Sequence[Sequence[Any]] = self._cursor.execute(statement, tuple(params)).fetchall()
        return rows

    async def _execute(self, statement: str, params: Sequence[Any]) -> int:
        self._cursor.execute(statement, tuple(params)).fetchall()
        return int(self.raw.changes())


class _SchemaCursor:
    """The DB-API cursor SQLAlchemy and Alembic use, on an apsw cursor."""

    def __init__(self, raw: apsw.Connection) -> None:
        self._raw = raw
        self._cursor = raw.cursor()
        self._rows: list[Any] = []
        self.description: Any = None
        self.rowcount = -1
        self.lastrowid: int | None = None
        self.arraysize = 1

    def execute(self, statement: str, params: Sequence[Any] | None = None) -> _SchemaCursor:
        bindings = tuple(params or ())
        # The columns, from the prepared statement (apsw tells them only while rows remain; SQLAlchemy needs them
        # for a query that found none too). Schema work only: preparing twice costs nothing there.
        described = apsw.ext.query_info(self._raw, statement, bindings).description
        self._cursor.execute(statement, bindings)
        self.description = (
            None if not described else [(name, None, None, None, None, None, None) for name, _ in described]
        )
        self._rows = list(self._cursor) if described else []
        self.rowcount = int(self._raw.changes()) if not described else -1
        self.lastrowid = int(self._raw.last_insert_rowid())
        return self

    def executemany(self, statement: str, rows: Sequence[Sequence[Any]]) -> None:
        for params in rows:
            self.execute(statement, params)

    def fetchone(self) -> Any:
        return self._rows.pop(0) if self._rows else None

    def fetchmany(self, size: int | None = None) -> list[Any]:
        count = size or self.arraysize
        taken, self._rows = self._rows[:count], self._rows[count:]
        return taken

    def fetchall(self) -> list[Any]:
        taken, self._rows = self._rows, []
        return taken

    def close(self) -> None:
        self._rows = []


class _SchemaConnection:
    """The DB-API connection SQLAlchemy's ``pysqlite`` dialect needs for the schema's work, on apsw.

    Autocommit, as the ``sqlite3`` connections chatkeep opens are (``isolation_level=None``): the schema's work
    opens its transaction itself (``BEGIN IMMEDIATE``) and commits it.
    """

    isolation_level: str | None = None

    def __init__(self, raw: apsw.Connection) -> None:
        self._raw = raw

    def cursor(self) -> _SchemaCursor:
        return _SchemaCursor(self._raw)

    def commit(self) -> None:
        if self._raw.in_transaction:
            self._raw.execute("COMMIT")

    def rollback(self) -> None:
        if self._raw.in_transaction:
            self._raw.execute("ROLLBACK")

    def close(self) -> None:
        self._raw.close()

    def create_function(self, name: str, arity: int, function: Any, **_options: Any) -> None:
        self._raw.create_scalar_function(name, function, arity)


class ApswTransport(SQLiteTransport):
    """SQLite through apsw, with sqlite-vec loaded when installed (see the module docstring)."""

    name = "apsw"
    errors: tuple[type[BaseException], ...] = (apsw.Error, OSError)

    def __init__(
        self, path: str, *, busy_timeout: float, pool_size: int, pragmas: Sequence[str] = sqlite_pragmas()
    ) -> None:
        super().__init__(path, busy_timeout=busy_timeout, pool_size=pool_size, pragmas=pragmas)
        self.loads_sqlite_vec = _sqlite_vec_path() is not None

    def wrap(self, raw: Any) -> _SQLiteConnection:
        return _ApswConnection(raw)  # the same face on apsw's connection

    def open(self) -> apsw.Connection:
        """A new apsw connection to the file, with sqlite-vec loaded when installed."""
        conn = apsw.Connection(self.path)
        try:
            conn.set_busy_timeout(int(self.busy_timeout * 1000))
            vec = _sqlite_vec_path()
            if vec is not None:
                conn.enable_load_extension(True)
                conn.load_extension(vec)
                conn.enable_load_extension(False)
        except BaseException:
            conn.close()
            raise
        return conn

    def schema_connection(self) -> Any:
        return _SchemaConnection(self.connect())
