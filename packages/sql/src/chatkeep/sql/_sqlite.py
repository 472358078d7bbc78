"""The ``sqlite3`` transport: SQLite through the standard library, each store call whole in a worker thread.

A SQLite statement costs microseconds, but it reads and writes a file (and a commit may sync it), and a
writer may wait for another process's lock: so nothing of SQLite runs on the event loop. A store call hands
its whole operation (every statement of it, a transaction included) to a worker thread at once, one hop per
call rather than per statement, where a statement that finds the database locked waits up to
``busy_timeout``. The event loop, any loop, only waits for the thread. The store has up to ``pool_size``
worker threads (``_workers.Workers``), shared by every thread and loop that uses it, and each worker thread
keeps one connection (in WAL mode) of its own.

One exception: a blocking call of the store's sync view that runs the view's private loop in the caller's own
thread (``in_blocking_call``) runs its operation right there, on a connection of an idle pool, with that loop
paused (``run_in_place``: no event loop runs in the thread meanwhile, so blocking-call guards see none): that
caller waits for it anyway, and no application's loop runs there, so the hop to a worker and back (two thread
wake-ups, about a tenth of a millisecond, most of a short read) buys nothing.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar, cast

from chatkeep.core import ChatkeepError
from chatkeep.core.backend import finish_if_cancelled, in_blocking_call, run_in_place
from chatkeep.sql._config import sqlite_pragmas
from chatkeep.sql._errors import SQLITE_FILE_HINT
from chatkeep.sql._schema import ensure_schema
from chatkeep.sql._sql import Statements
from chatkeep.sql._transport import Connection, Flag, Transport
from chatkeep.sql._workers import Workers

__all__ = ["SQLiteTransport"]

T = TypeVar("T")


def _busy(exc: BaseException) -> bool:
    """Whether a SQLite error (of either library) says the database is locked by another connection."""
    message = str(exc).lower()
    return type(exc).__name__ in ("OperationalError", "BusyError") and ("locked" in message or "busy" in message)


class _SQLiteConnection(Connection):
    """A pooled connection, used by one thread at a time: its statements run right away (no suspension)."""

    __slots__ = ("_cursor", "raw")

    def __init__(self, raw: sqlite3.Connection) -> None:
        super().__init__()
        self.raw: Any = raw  # a sqlite3 connection, or an apsw one (the apsw transport's subclass)
        self._cursor = raw.cursor()  # one cursor for every statement: each call reads its rows before the next

    async def _fetch(self, statement: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
        return self._cursor.execute(statement, params).fetchall()

    async def _execute(self, statement: str, params: Sequence[Any]) -> int:
        return self._cursor.execute(statement, params).rowcount

    async def pause(self, seconds: float) -> None:
        time.sleep(seconds)  # noqa: ASYNC251 - run by _run_through in the worker thread, never on an event loop


def _run_through(operation: Awaitable[T]) -> T:
    """Run an operation's coroutine to its end in this thread: on a SQLite connection it never suspends."""
    coroutine = cast(Coroutine[Any, Any, T], operation)
    try:
        coroutine.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    coroutine.close()
    raise AssertionError("a SQLite operation waited on the event loop; it must run whole in its thread")


class SQLiteTransport(Transport[_SQLiteConnection]):
    """SQLite through the built-in ``sqlite3`` module, on the event loop (see the module docstring)."""

    name = "sqlite3"
    serves_any_loop = True  # nothing of it belongs to an event loop
    #: Whether its connections load sqlite-vec (which a file's search index needs for any change of messages).
    loads_sqlite_vec = False
    hint = SQLITE_FILE_HINT
    errors: tuple[type[BaseException], ...] = (sqlite3.Error, OSError)

    def __init__(
        self, path: str, *, busy_timeout: float, pool_size: int, pragmas: Sequence[str] = sqlite_pragmas()
    ) -> None:
        self.path = path
        self.pragmas = tuple(pragmas)
        self.description = f"sqlite:///{path}"
        self.busy_timeout = busy_timeout
        self.pool_size = max(1, pool_size)
        self.statements = Statements("sqlite", "qmark")
        self._own = threading.local()  # a worker thread's connection: each opens its own on its first call
        self._workers = Workers(self.pool_size, "chatkeep-sqlite", on_exit=self._close_own)
        self._idle: list[_SQLiteConnection] = []  # the connections of blocking calls run in place, when idle
        self._idle_lock = threading.Lock()
        self._closing = False

    def wrap(self, raw: Any) -> _SQLiteConnection:
        """The :class:`Connection` of a raw connection of the library."""
        return _SQLiteConnection(raw)

    def open(self) -> Any:
        """A new connection of the library to the file, with its busy timeout, autocommit (and extensions)."""
        return sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False, cached_statements=256
        )

    def connect(self) -> Any:
        """A new connection to the file, set up for chatkeep (creating the file and its folder on first use)."""
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        conn = self.open()
        try:
            self._use_wal(conn)
            for pragma in self.pragmas:
                conn.execute(f"PRAGMA {pragma}").fetchall()  # mmap_size answers with a row
        except BaseException:
            conn.close()
            raise
        return conn

    def _use_wal(self, conn: Any) -> None:
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
            except self.errors as exc:
                if not _busy(exc) or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    async def _in_thread(self, work: Callable[..., T], *args: Any, cancel: Flag | None = None) -> T:
        """Run blocking ``work`` in a worker thread; a cancelled caller still waits for it (it holds a connection).

        ``cancel`` is set when the caller is cancelled, so that a write still running rolls back instead of
        committing; either way the outcome is final when the cancellation reaches the caller.
        """
        return await finish_if_cancelled(self._workers.submit(work, args), None if cancel is None else cancel.set)

    async def run(self, op: Callable[[_SQLiteConnection], Awaitable[T]], *, write: bool = False) -> T:
        """Run ``op`` whole in a worker thread, on that thread's connection; for a blocking call of the sync view,
        in the caller's thread (see the module docstring)."""
        cancel = Flag()
        try:
            if in_blocking_call():
                return await run_in_place(lambda: self._lend_idle(op, cancel))
            return await self._in_thread(self._lend_here, op, cancel, cancel=cancel if write else None)
        except ChatkeepError:
            raise
        except self.errors as exc:
            raise self.translate(exc) from exc

    def _lend_here(self, op: Callable[[_SQLiteConnection], Awaitable[T]], cancel: Flag) -> T:
        """In a worker thread: ``op`` on the thread's connection (opened on its first call)."""
        conn: _SQLiteConnection | None = getattr(self._own, "conn", None)
        if conn is None:
            conn = self._own.conn = self.wrap(self.connect())
        conn.cancel = cancel
        try:
            return _run_through(op(conn))
        except BaseException:
            if conn.raw.in_transaction:  # its rollback failed: open a new one rather than reuse an unknown state
                self._own.conn = None
                conn.raw.close()
            raise

    def _lend_idle(self, op: Callable[[_SQLiteConnection], Awaitable[T]], cancel: Flag) -> T:
        """In the thread of a blocking call: ``op`` on an idle connection (a new one when none is), given back."""
        with self._idle_lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self.wrap(self.connect())
        kept: _SQLiteConnection | None = conn
        conn.cancel = cancel
        try:
            return _run_through(op(conn))
        except BaseException:
            if conn.raw.in_transaction:  # its rollback failed: never lent again
                conn.raw.close()
                kept = None
            raise
        finally:
            if kept is not None:
                self._give_back(kept)

    def _give_back(self, conn: _SQLiteConnection) -> None:
        with self._idle_lock:
            if not self._closing and len(self._idle) < self.pool_size:
                self._idle.append(conn)
                return
        conn.raw.close()

    def _close_own(self) -> None:
        """In a worker thread that stops: close its connection."""
        conn = getattr(self._own, "conn", None)
        if conn is not None:
            self._own.conn = None
            conn.raw.close()

    def schema_connection(self) -> Any:
        """A DBAPI connection for the schema's work (SQLAlchemy and Alembic), on this transport's library."""
        return self.connect()

    def _prepare(self, upgrade: bool) -> str:
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        engine = create_engine("sqlite+pysqlite://", creator=self.schema_connection, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                return ensure_schema(conn, upgrade=upgrade, loads_sqlite_vec=self.loads_sqlite_vec)
        finally:
            engine.dispose()

    async def prepare(self, *, upgrade: bool = False) -> str:
        from sqlalchemy.exc import SQLAlchemyError

        try:
            return await self._in_thread(self._prepare, upgrade)
        except ChatkeepError:
            raise
        except self.errors as exc:
            raise self.translate(exc) from exc
        except SQLAlchemyError as exc:
            raise self.translate(exc) from exc

    async def aclose(self) -> None:
        await self._workers.stop()
        with self._idle_lock:
            self._closing = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.raw.close()
