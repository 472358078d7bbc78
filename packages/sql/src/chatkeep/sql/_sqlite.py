"""The ``sqlite3`` transport: SQLite through the standard library, on the event loop, waiting only in a thread.

A SQLite statement costs a few microseconds, and a hop to a worker thread 50-100 µs, more than a whole
turn's statements: so statements run right on the event loop, on connections whose busy timeout is 0. In
WAL mode readers never wait for a writer, and a writer's ``BEGIN IMMEDIATE`` either gets the write lock at
once or fails with SQLITE_BUSY before anything was written; only then is the statement run again in a
worker thread, where it waits up to ``busy_timeout`` while the event loop goes on. Connections are kept in a
small pool; each is in WAL mode.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from chatkeep.core import ChatkeepError
from chatkeep.sql._errors import SQLITE_FILE_HINT
from chatkeep.sql._schema import ensure_schema
from chatkeep.sql._sql import Statements
from chatkeep.sql._transport import Connection, Transport

__all__ = ["SQLiteTransport"]

_Rows = tuple[Sequence[Sequence[Any]], int]


def _busy(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc).lower() or "busy" in str(exc).lower())


class _SQLiteConnection(Connection):
    __slots__ = ("_cursor", "raw", "transport")

    def __init__(self, raw: sqlite3.Connection, transport: SQLiteTransport) -> None:
        super().__init__()
        self.raw = raw
        self.transport = transport
        self._cursor = raw.cursor()  # one cursor for every statement: each call reads its rows before the next

    async def _fetch(self, statement: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
        try:
            return self._cursor.execute(statement, params).fetchall()
        except sqlite3.OperationalError as exc:
            if not _busy(exc):
                raise
        return (await self.transport.waiting(self.raw, statement, params))[0]  # it failed whole: nothing was done

    async def _execute(self, statement: str, params: Sequence[Any]) -> int:
        try:
            return self._cursor.execute(statement, params).rowcount
        except sqlite3.OperationalError as exc:
            if not _busy(exc):
                raise
        return (await self.transport.waiting(self.raw, statement, params))[1]


class SQLiteTransport(Transport[_SQLiteConnection]):
    """SQLite through the built-in ``sqlite3`` module, on the event loop (see the module docstring)."""

    name = "sqlite3"
    shields_writes = False  # a call suspends only while a statement waits in a thread, which it then waits out
    loop_bound = False
    hint = SQLITE_FILE_HINT
    errors = (sqlite3.Error, OSError)

    def __init__(self, path: str, *, busy_timeout: float, pool_size: int, synchronous: str = "normal") -> None:
        self.path = path
        self.synchronous = synchronous
        self.description = f"sqlite:///{path}"
        self.busy_timeout = busy_timeout
        self.pool_size = max(1, pool_size)
        self.statements = Statements("sqlite", "qmark")
        self._idle: list[_SQLiteConnection] = []
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    def connect(self, *, wait: bool = True) -> sqlite3.Connection:
        """A new connection to the file, set up for chatkeep (creating the file and its folder on first use).

        ``wait=False``: for the event loop, its busy timeout is 0 once it is set up.
        """
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False, cached_statements=256
        )
        try:
            self._use_wal(conn)
            # NORMAL is durable across application crashes in WAL mode; only a power loss can undo the last
            # commits. FULL syncs the WAL at every commit, so a commit also survives a power loss.
            conn.execute(f"PRAGMA synchronous={self.synchronous.upper()}")
            conn.execute("PRAGMA foreign_keys=ON")
            if not wait:
                conn.execute("PRAGMA busy_timeout=0")
        except BaseException:
            conn.close()
            raise
        return conn

    def _use_wal(self, conn: sqlite3.Connection) -> None:
        """Put the file in WAL mode (it stays so: later connections only read the mode).

        Switching needs a moment alone with the file, and SQLite does not call its busy handler for it, so
        when several processes open a new file at once the switch can fail with "database is locked" at
        once: try again until the busy timeout is spent.
        """
        if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
            return
        deadline = time.monotonic() + self.busy_timeout
        delay = 0.001
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL").fetchall()
                return
            except sqlite3.OperationalError as exc:
                if not _busy(exc) or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    async def _in_thread(self, work: Any, *args: Any) -> Any:
        """Run blocking ``work`` in a worker thread; a cancelled caller still waits for it (it holds a connection)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.pool_size, thread_name_prefix="chatkeep-sqlite")
        done = asyncio.get_running_loop().run_in_executor(self._executor, work, *args)
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            while not done.done():
                try:
                    await asyncio.shield(done)
                except asyncio.CancelledError:
                    continue
            raise

    async def waiting(self, raw: sqlite3.Connection, statement: str, params: Sequence[Any]) -> _Rows:
        """Run a statement that found the database busy again in a thread, waiting up to ``busy_timeout``."""
        return await self._in_thread(self._wait_and_run, raw, statement, params)  # type: ignore[no-any-return]

    def _wait_and_run(self, raw: sqlite3.Connection, statement: str, params: Sequence[Any]) -> _Rows:
        raw.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
        try:
            cur = raw.execute(statement, params)
            return cur.fetchall(), cur.rowcount
        finally:
            raw.execute("PRAGMA busy_timeout=0")

    async def _checkout(self) -> _SQLiteConnection:
        if self._idle:
            return self._idle.pop()
        # Opening may create the file and switch it to WAL, which waits for other processes: in a thread.
        return _SQLiteConnection(await self._in_thread(lambda: self.connect(wait=False)), self)

    async def _checkin(self, conn: _SQLiteConnection) -> None:
        if not self._closed and len(self._idle) < self.pool_size:
            self._idle.append(conn)
        else:
            conn.raw.close()

    async def _discard(self, conn: _SQLiteConnection, exc: BaseException, *, stale: bool) -> None:
        if conn.raw.in_transaction:
            conn.raw.close()  # its rollback failed: do not hand a connection in an unknown state to the next call
        else:
            await self._checkin(conn)

    def _stale(self, conn: _SQLiteConnection, exc: Exception) -> bool:
        return False  # a file does not go away between calls the way a server connection does

    def _prepare(self, upgrade: bool) -> str:
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        engine = create_engine("sqlite+pysqlite://", creator=self.connect, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                return ensure_schema(conn, upgrade=upgrade)
        finally:
            engine.dispose()

    async def prepare(self, *, upgrade: bool = False) -> str:
        from sqlalchemy.exc import SQLAlchemyError

        try:
            return await self._in_thread(self._prepare, upgrade)  # type: ignore[no-any-return]
        except ChatkeepError:
            raise
        except (sqlite3.Error, OSError, SQLAlchemyError) as exc:
            raise self.translate(exc) from exc

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.raw.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False)
