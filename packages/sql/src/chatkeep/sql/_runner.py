"""Where the statements run: SQLite's ``sqlite3`` (inline or in worker threads), or a SQLAlchemy ``AsyncEngine``'s pool.

Both run one synchronous function per store call on a DBAPI connection in autocommit mode (at most one
hop from the event loop per call), check the schema once before the first call, and translate driver
errors into :class:`StoreUnavailableError` (:class:`StoreFullError` when the disk is full) with the driver's
exception chained. The hot calls have
faster paths: SQLite runs short calls inline on the event loop when they need not wait for a lock, and
an engine the store made runs ``load(last=k)`` and ``append`` on asyncpg or asyncmy natively.
"""

from __future__ import annotations

import abc
import asyncio
import errno
import math
import os
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from chatkeep.core import ChatkeepError, StoreFullError, StoreUnavailableError
from chatkeep.core.backend import redact_url
from chatkeep.sql._schema import ensure_schema
from chatkeep.sql._sql import Statements

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["EngineRunner", "NativeCall", "Runner", "SQLiteRunner"]

T = TypeVar("T")


class Runner(abc.ABC):
    """Runs synchronous functions on a pooled DBAPI connection for a store."""

    statements: Statements
    description: str
    #: Whether its connections belong to the event loop that opened them.
    loop_bound: bool = False

    @abc.abstractmethod
    async def run(self, op: Callable[[Any], T]) -> T:
        """Call ``op(dbapi_connection)`` on a pooled connection; driver errors raise StoreUnavailableError."""

    #: Whether :meth:`fetch_native` runs statements with the driver's own async API.
    native: bool = False

    def run_inline(self, op: Callable[[Any], T]) -> T | None:
        """Run a short ``op`` right here on the event loop if this runner can do so without waiting; else ``None``."""
        return None

    async def fetch_native(self, statement: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
        """Run one autocommitted statement natively (only when :attr:`native`); its rows."""
        raise NotImplementedError

    async def run_native(self, op: Callable[[NativeCall], Awaitable[T]]) -> T:
        """Run ``op`` on a pooled connection's driver object (only when :attr:`native`)."""
        raise NotImplementedError

    @abc.abstractmethod
    async def prepare(self, *, upgrade: bool = False) -> str:
        """Check (and in an empty database create, or with ``upgrade`` migrate) the schema; returns its revision."""

    async def release(self) -> None:  # noqa: B027 - only engines bound to a loop need it
        """Close the connections that belong to the running event loop (it is shutting down)."""

    def on_loop_change(self) -> None:  # noqa: B027 - only engines bound to a loop need it
        """Drop connections that belonged to an event loop that is gone."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release every connection."""

    #: What to check when a call fails: a server's reachability, or (for a SQLite file) its folder.
    unavailable_hint = "check that it is running and reachable, then retry"

    #: The statement timeout the runner's connections were opened with (``None``: not chatkeep's to say).
    statement_timeout: float | None = None

    def _unavailable(self, exc: BaseException) -> StoreUnavailableError:
        """The one translation of a driver error: :class:`StoreFullError` for a full disk, else unavailable."""
        detail = f"{type(exc).__name__}: {redact_url(str(exc)).strip()[:500]}"
        if timed_out(exc):
            limit = f" of {self.statement_timeout:g} s" if self.statement_timeout is not None else ""
            return StoreUnavailableError(
                f"the database at {self.description} cancelled a statement of this call at its statement "
                f"timeout{limit} ({detail}), and rolled back what it did. Most often another transaction holds a "
                "lock on the session for long (a stuck client, a long migration), or the server is overloaded: "
                "find what holds it (PostgreSQL: pg_stat_activity; MySQL/MariaDB: SHOW PROCESSLIST) and retry, or "
                "open the store with a larger statement_timeout"
            )
        if disk_full(exc):
            return StoreFullError(
                f"the database at {self.description} has no room left: its disk, volume, quota or tablespace is "
                f"full ({detail}); nothing of this call was stored and what was stored before is intact. Free "
                "space where the database keeps its files (or raise its quota), then retry: the store works again "
                "without a restart"
            )
        return StoreUnavailableError(
            f"the database at {self.description} failed or could not be reached ({detail}); {self.unavailable_hint}"
        )


#: PostgreSQL's SQLSTATE ``disk_full``; MySQL/MariaDB's ER_RECORD_FILE_FULL ("the table is full") and ER_DISK_FULL.
_PG_DISK_FULL = "53100"
_MYSQL_DISK_FULL = (1114, 1021)
_MYSQL_DRIVERS = ("asyncmy", "pymysql", "MySQLdb", "aiomysql")
_SQLITE_FULL = 13  # the primary result code (sqlite3.SQLITE_FULL at run time; typeshed does not list it)
#: PostgreSQL's SQLSTATE ``query_canceled``; MariaDB's ER_STATEMENT_TIMEOUT, MySQL's ER_QUERY_TIMEOUT and InnoDB's
#: ER_LOCK_WAIT_TIMEOUT.
_PG_CANCELED = "57014"
_MYSQL_TIMED_OUT = (1969, 3024, 1205)


def _errors_within(exc: BaseException) -> Iterator[BaseException]:
    """A driver error and every error it wraps: SQLAlchemy's ``orig`` and the chained causes, each once."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        orig = getattr(error, "orig", None)
        pending += [orig if isinstance(orig, BaseException) else None, error.__cause__, error.__context__]


def _mysql_code(error: BaseException) -> object:
    """A MySQL/MariaDB driver error's number (``None`` for another driver's error)."""
    driver = type(error).__module__.split(".", 1)[0]
    return error.args[0] if driver in _MYSQL_DRIVERS and error.args else None


def _sqlstate(error: BaseException) -> object:
    return getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)


def disk_full(exc: BaseException) -> bool:
    """Whether a driver error, or any error it wraps (SQLAlchemy's ``orig``, the chained causes), means "no space".

    SQLite's SQLITE_FULL, PostgreSQL's SQLSTATE 53100, MySQL/MariaDB errors 1114 and 1021, or an OS error
    ENOSPC / EDQUOT (a full disk or quota while a file is created or grown).
    """
    for error in _errors_within(exc):
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        code = getattr(error, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF == _SQLITE_FULL:
            return True
        if _sqlstate(error) == _PG_DISK_FULL or _mysql_code(error) in _MYSQL_DISK_FULL:
            return True
    return False


def timed_out(exc: BaseException) -> bool:
    """Whether the server cancelled a statement for running past the connection's statement timeout.

    PostgreSQL's SQLSTATE 57014 (``statement_timeout``), MariaDB's error 1969 (``max_statement_time``),
    MySQL's 3024 (``max_execution_time``) and InnoDB's 1205 (``innodb_lock_wait_timeout``).
    """
    return any(_sqlstate(e) == _PG_CANCELED or _mysql_code(e) in _MYSQL_TIMED_OUT for e in _errors_within(exc))


def _milliseconds(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def timeout_statement(server: str, seconds: float) -> str:
    """What bounds a connection's statements on ``server`` (``postgresql``, ``mariadb`` or ``mysql``) to ``seconds``.

    MariaDB and MySQL also bound InnoDB's row-lock waits (whole seconds, at least 1); MySQL's
    ``max_execution_time`` covers only ``SELECT``, so there the lock wait is what bounds a write.
    """
    if server == "postgresql":
        return f"SET statement_timeout = {_milliseconds(seconds)}"
    lock = max(1, math.ceil(seconds))
    if server == "mariadb":
        return f"SET SESSION max_statement_time = {seconds:g}, innodb_lock_wait_timeout = {lock}"
    return f"SET SESSION max_execution_time = {_milliseconds(seconds)}, innodb_lock_wait_timeout = {lock}"


#: The key of a pooled connection's ``info`` that names its server (``postgresql``, ``mariadb`` or ``mysql``),
#: set where its statement timeout is (the schema's work lifts that timeout by the same name).
_SERVER = "chatkeep_server"


def _mysql_server(cursor: Any) -> str:
    """``mariadb`` or ``mysql``: which server a MySQL-protocol connection reached (a ``mysql://`` URL may be either)."""
    cursor.execute("SELECT VERSION()")
    return "mariadb" if "mariadb" in str(cursor.fetchone()[0]).lower() else "mysql"


def _unbounded_statement(server: str) -> str:
    """What lifts the statement timeout (not the lock wait) on ``server``: for the schema's own work."""
    if server == "postgresql":
        return "SET statement_timeout = 0"
    return "SET SESSION max_statement_time = 0" if server == "mariadb" else "SET SESSION max_execution_time = 0"


class _InlineConnection(sqlite3.Connection):
    """The connection calls use on the event loop itself: never waits for a lock (``busy_timeout`` 0)."""

    no_wait = True


def _busy(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc).lower() or "busy" in str(exc).lower())


#: The hint for a SQLite file that cannot be opened or written (there is no server to start).
SQLITE_FILE_HINT = "check that the file's folder exists and that this process may read and write there, then retry"


class SQLiteRunner(Runner):
    """SQLite through the built-in ``sqlite3`` module: short calls inline, the rest in the store's worker threads.

    The async SQLite driver costs several times the sync one per statement, so a call runs all its
    statements on a plain ``sqlite3`` connection. A short call the store marks as such (``load(last=k)``
    with a small k, an append of a small batch) runs on the event loop itself when it need not wait: on a
    connection whose busy timeout is 0, WAL readers never wait for a writer, and a writer's ``BEGIN
    IMMEDIATE`` either gets the write lock at once or fails with SQLITE_BUSY, before anything was written;
    the call then runs again in a worker thread, where the busy timeout applies. A thread hop costs ~50-100
    µs, about as much as the whole call. Other calls run in a worker thread, one hop per call. Connections
    are kept in a small pool; each is in WAL mode (readers never wait for the writer).
    """

    unavailable_hint = SQLITE_FILE_HINT

    def __init__(self, path: str, *, busy_timeout: float, pool_size: int, synchronous: str = "normal") -> None:
        self.path = path
        self.synchronous = synchronous
        self.description = f"sqlite:///{path}"
        self.busy_timeout = busy_timeout
        self.pool_size = max(1, pool_size)
        self.statements = Statements("sqlite", "qmark")
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False
        self._inline: sqlite3.Connection | None = None
        self._inline_busy = False

    def connect(self, *, inline: bool = False) -> sqlite3.Connection:
        """A new connection to the file, set up for chatkeep (creating the file and its folder on first use)."""
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        conn = sqlite3.connect(
            self.path,
            timeout=0 if inline else self.busy_timeout,
            isolation_level=None,
            check_same_thread=False,
            cached_statements=256,
            factory=_InlineConnection if inline else sqlite3.Connection,
        )
        try:
            self._use_wal(conn, wait=not inline)
            # NORMAL is durable across application crashes in WAL mode; only a power loss can undo the last
            # commits. FULL syncs the WAL at every commit, so a commit also survives a power loss.
            conn.execute(f"PRAGMA synchronous={self.synchronous.upper()}")
            conn.execute("PRAGMA foreign_keys=ON")
        except BaseException:
            conn.close()
            raise
        return conn

    def _use_wal(self, conn: sqlite3.Connection, *, wait: bool) -> None:
        """Put the file in WAL mode (it stays so: later connections only read the mode).

        Switching needs a moment alone with the file, and SQLite does not call its busy handler for it, so
        when several processes open a new file at once the switch can fail with "database is locked" at
        once: try again until the busy timeout is spent (a connection that must not wait fails at once).
        """
        if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
            return
        deadline = time.monotonic() + (self.busy_timeout if wait else 0)
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

    def _call(self, op: Callable[[Any], T]) -> T:
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self.connect()
        try:
            result = op(conn)
        except BaseException:
            if conn.in_transaction:
                conn.close()  # its rollback failed: do not hand a connection in an unknown state to the next call
                conn = None
            raise
        finally:
            if conn is not None:
                with self._lock:
                    keep = not self._closed and len(self._idle) < self.pool_size
                    if keep:
                        self._idle.append(conn)
                if not keep:
                    conn.close()
        return result

    def run_inline(self, op: Callable[[Any], T]) -> T | None:
        if self._closed or self._inline_busy:
            return None
        conn = self._inline
        if conn is None:
            if not os.path.exists(self.path):
                return None  # the first call creates the file, in a thread
            try:
                conn = self._inline = self.connect(inline=True)
            except sqlite3.Error:
                return None
        self._inline_busy = True  # not re-entrant: a nested call takes the thread path
        try:
            return op(conn)
        except sqlite3.Error as exc:
            if conn.in_transaction:  # its rollback failed: start over with a new connection
                self._inline = None
                conn.close()
            if _busy(exc):
                return None  # nothing was written (the write lock comes first): run it again in a thread
            raise self._unavailable(exc) from exc
        finally:
            self._inline_busy = False

    async def run(self, op: Callable[[Any], T]) -> T:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.pool_size, thread_name_prefix="chatkeep-sqlite")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, self._call, op)
        except ChatkeepError:
            raise  # some are OSErrors (SessionOwnershipError is a PermissionError): not the database's failure
        except (sqlite3.Error, OSError) as exc:
            raise self._unavailable(exc) from exc

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
            return await self.run(lambda _conn: self._prepare(upgrade))
        except SQLAlchemyError as exc:
            raise self._unavailable(exc) from exc

    async def aclose(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        inline, self._inline = self._inline, None
        for conn in idle + ([inline] if inline is not None else []):
            conn.close()
        if self._executor is not None:
            # Calls still running return their connection to a closed pool, which closes it.
            self._executor.shutdown(wait=False)


class NativeCall:
    """A pooled connection's driver object (asyncpg or asyncmy) for one call, and whether the server answered yet."""

    __slots__ = ("answered", "conn", "driver")

    def __init__(self, driver: str, conn: Any) -> None:
        self.driver = driver
        self.conn = conn
        self.answered = False

    async def fetch(self, statement: str, params: Sequence[Any]) -> tuple[Sequence[Sequence[Any]], int]:
        """Run one statement; its rows (empty when it returns none) and, on asyncmy, the rows it changed."""
        if self.driver == "asyncpg":
            rows = await self.conn.fetch(statement, *params)
            self.answered = True
            return rows, len(rows)
        async with self.conn.cursor() as cur:
            changed = await cur.execute(statement, params or None)
            self.answered = True
            return (await cur.fetchall() if cur.description else ()), int(changed)


async def _native_fetch(statement: str, params: Sequence[Any], call: NativeCall) -> Sequence[Sequence[Any]]:
    return (await call.fetch(statement, params))[0]


class _Tracked:
    """A DBAPI connection that notes whether the server has answered any statement of the call yet."""

    __slots__ = ("_conn", "answered")

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.answered = False

    def cursor(self) -> _TrackedCursor:
        return _TrackedCursor(self._conn.cursor(), self)


class _TrackedCursor:
    __slots__ = ("_cur", "_owner")

    def __init__(self, cur: Any, owner: _Tracked) -> None:
        self._cur = cur
        self._owner = owner

    @property
    def rowcount(self) -> int:
        return int(self._cur.rowcount)

    def execute(self, sql: str, params: Any = None) -> Any:
        result = self._cur.execute(sql, params) if params is not None else self._cur.execute(sql)
        self._owner.answered = True
        return result

    def fetchall(self) -> Any:
        return self._cur.fetchall()


class EngineRunner(Runner):
    """A SQLAlchemy ``AsyncEngine`` (PostgreSQL, MySQL/MariaDB, or SQLite through aiosqlite).

    Each call runs in SQLAlchemy's greenlet bridge directly on the driver's DBAPI adapter: no SQL
    compilation per call, and the driver caches the prepared statements. On an engine the store made, a
    call checks a DBAPI connection straight out of the pool (no ``Connection`` object, one greenlet hop),
    without a pre-ping round trip: a pooled connection found dead (a database restart, an idle timeout)
    before the server answered any statement of the call is dropped with every connection as old as it,
    and the call runs once more on a new connection. An engine you hand in goes through ``engine.connect()``.
    """

    def __init__(
        self, engine: AsyncEngine, *, owned: bool, schema: str | None = None, statement_timeout: float | None = None
    ) -> None:
        self.engine = engine if owned else engine.execution_options(isolation_level="AUTOCOMMIT")
        self.owned = owned
        self.schema = schema
        self.statement_timeout = statement_timeout
        dialect = engine.dialect
        family = "postgresql" if dialect.name == "postgresql" else dialect.name
        self.description = redact_url(engine.url.render_as_string(hide_password=True))
        if family == "sqlite":
            self.unavailable_hint = SQLITE_FILE_HINT
        self.statements = Statements(family, dialect.paramstyle, is_mariadb=bool(getattr(dialect, "is_mariadb", False)))
        from sqlalchemy.exc import SQLAlchemyError
        from sqlalchemy.pool import QueuePool

        # A QueuePool closes a connection returned beyond its size: that close needs SQLAlchemy's greenlet.
        self._queue_pool = isinstance(self.engine.sync_engine.pool, QueuePool)
        errors: list[type[BaseException]] = [SQLAlchemyError, OSError, asyncio.TimeoutError]
        from sqlalchemy.util import greenlet_spawn

        self._spawn = greenlet_spawn
        dbapi = getattr(dialect, "loaded_dbapi", None)
        if dbapi is not None and isinstance(getattr(dbapi, "Error", None), type):
            errors.append(dbapi.Error)
        # The native path (fetch_native) talks to asyncpg or asyncmy directly: their own exceptions.
        self._native: str | None = None
        self._stale_types: tuple[type[BaseException], ...] = (OSError,)
        driver = getattr(dialect, "driver", "")
        if owned and driver == "asyncpg":
            import asyncpg  # type: ignore[import-untyped]

            self._native = "asyncpg"
            errors += [asyncpg.PostgresError, asyncpg.InterfaceError]
            self._stale_types = (OSError, asyncpg.ConnectionDoesNotExistError)
        elif owned and driver == "asyncmy":
            from asyncmy import errors as asyncmy_errors

            self._native = "asyncmy"
            errors.append(asyncmy_errors.Error)
        self._errors = tuple(errors)
        self.native = self._native is not None

    def _pooled(self, op: Callable[[Any], T]) -> T:
        """Run ``op`` on a connection checked out of the pool, retrying once on a stale pooled connection."""
        pool = self.engine.sync_engine.pool
        dialect = self.engine.dialect
        for attempt in (0, 1):
            fairy = pool.connect()
            reused = bool(fairy.info.get("chatkeep_used"))  # info is cleared when the connection is replaced
            tracked = _Tracked(fairy.dbapi_connection)
            try:
                result = op(tracked)
            except ChatkeepError:
                fairy.close()  # raised by the statements after a clean rollback: the connection is fine
                raise
            except BaseException as exc:
                stale = isinstance(exc, Exception) and (
                    isinstance(exc, OSError) or dialect.is_disconnect(exc, fairy.dbapi_connection, None)  # type: ignore[arg-type]
                )
                if stale:
                    # Every connection opened before this one may be dead too: the pool replaces them on checkout.
                    pool._invalidate(fairy, exc)  # what SQLAlchemy's Connection does on a disconnect
                else:
                    # The connection's state is unknown (a failed rollback, a cancelled call): never reuse it.
                    fairy.invalidate(exc)
                fairy.close()
                if stale and reused and not tracked.answered and attempt == 0:
                    continue  # the server never saw the call take effect: run it again on a new connection
                raise
            fairy.info["chatkeep_used"] = True
            fairy.close()
            return result
        raise AssertionError("unreachable")

    def _native_stale(self, exc: BaseException) -> bool:
        """Whether a native driver error means the connection is dead (not a SQL error)."""
        if isinstance(exc, self._stale_types):
            return True
        text = str(exc).lower()
        if self._native == "asyncpg":
            return type(exc).__name__ == "InterfaceError" and "closed" in text
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        # asyncmy: server gone / lost connection / not connected (InterfaceError(0, '') on a closed connection).
        return code in (2006, 2013, 2055) or (type(exc).__name__ == "InterfaceError" and code in (0, None))

    def _discard(self, fairy: Any, exc: BaseException, stale: bool) -> None:
        if stale:
            self.engine.sync_engine.pool._invalidate(fairy, exc)  # every connection as old as it is suspect too
        else:
            fairy.invalidate(exc)  # unknown state (a cancelled statement): never reuse it
        fairy.close()

    async def _checkin(self, fairy: Any) -> None:
        """Return a connection to the pool: no I/O (no reset on return), unless the pool is full and closes it.

        A connection beyond ``pool_size`` (an overflow one) is closed on return, and an async driver's close
        must run in SQLAlchemy's greenlet, or its socket is left open.
        """
        pool = self.engine.sync_engine.pool
        if self._queue_pool and pool.checkedin() < pool.size():  # type: ignore[attr-defined]
            fairy.close()
        else:
            await self._spawn(fairy.close)

    async def fetch_native(self, statement: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
        """Run one autocommitted statement with the driver's own async API on a pooled connection; its rows."""
        return await self.run_native(partial(_native_fetch, statement, params))

    async def run_native(self, op: Callable[[NativeCall], Awaitable[T]]) -> T:
        """Run ``op`` with the driver's own async API on a pooled connection (asyncpg or asyncmy).

        One greenlet hop to check the connection out of SQLAlchemy's pool (it may connect), then the driver
        directly on the event loop: no DBAPI adapter in between. A pooled connection found dead before the
        server answered any statement of ``op`` is replaced (with every connection as old as it) and ``op``
        runs once more on a new one.
        """
        pool = self.engine.sync_engine.pool
        try:
            for attempt in (0, 1):
                fairy = await self._spawn(pool.connect)
                reused = bool(fairy.info.get("chatkeep_used"))
                call = NativeCall(self._native or "", fairy.driver_connection)
                try:
                    result = await op(call)
                except ChatkeepError:
                    await self._checkin(fairy)  # raised after a clean rollback: the connection is fine
                    raise
                except BaseException as exc:
                    stale = self._native_stale(exc)
                    await self._spawn(self._discard, fairy, exc, stale)
                    if stale and reused and not call.answered and attempt == 0:
                        continue
                    raise
                fairy.info["chatkeep_used"] = True
                await self._checkin(fairy)
                return result
            raise AssertionError("unreachable")
        except self._errors as exc:
            if isinstance(exc, ChatkeepError):
                raise
            raise self._unavailable(exc) from exc

    @staticmethod
    def _call(conn: Connection, op: Callable[[Any], T]) -> T:
        try:
            return op(conn.connection.dbapi_connection)
        except ChatkeepError:
            raise  # raised by the statements after a clean rollback: the connection is fine
        except BaseException:
            # The connection's state is unknown (a dead socket, a failed rollback): the pool must not reuse it.
            conn.invalidate()
            raise

    async def run(self, op: Callable[[Any], T]) -> T:
        try:
            if self.owned:
                return await self._spawn(self._pooled, op)
            async with self.engine.connect() as conn:
                return await conn.run_sync(self._call, op)
        except self._errors as exc:
            if isinstance(exc, ChatkeepError):
                raise
            raise self._unavailable(exc) from exc

    def _prepare(self, conn: Connection, upgrade: bool) -> str:
        if self.statement_timeout is not None:
            # The schema's own work (a migration's index build) may run longer than any call: lift the bound on
            # this connection, and drop the connection afterwards rather than return it to the pool unbounded.
            # asyncpg takes the timeout at startup, so only the other drivers' connections name their server.
            server = conn.connection.info.get(_SERVER, "postgresql")
            conn.exec_driver_sql(_unbounded_statement(server))
        try:
            if self.schema is not None:
                quoted = self.engine.dialect.identifier_preparer.quote_identifier(self.schema)
                conn.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {quoted}")
                conn.commit()
            return ensure_schema(conn, upgrade=upgrade)
        finally:
            if self.statement_timeout is not None:
                conn.invalidate()

    async def prepare(self, *, upgrade: bool = False) -> str:
        try:
            # A connection in a transaction of its own (the engine's default isolation) for the schema work.
            engine = self.engine.execution_options(isolation_level=self._default_isolation())
            async with engine.connect() as conn:
                return await conn.run_sync(partial(self._prepare, upgrade=upgrade))
        except self._errors as exc:
            if isinstance(exc, ChatkeepError):
                raise
            raise self._unavailable(exc) from exc

    def _default_isolation(self) -> str:
        name = self.engine.dialect.name
        return "SERIALIZABLE" if name == "sqlite" else "READ COMMITTED"

    loop_bound = True

    async def release(self) -> None:
        """Close the pooled connections of an engine the store made (it stays usable and opens new ones)."""
        if self.owned:
            await self.engine.dispose()

    def on_loop_change(self) -> None:
        # The pooled connections died with their loop; start a new pool without touching them.
        self.engine.sync_engine.dispose(close=False)

    async def aclose(self) -> None:
        if self.owned:
            await self.engine.dispose()


def create_engine_runner(config: Any) -> EngineRunner:
    """An :class:`EngineRunner` on a new engine for a parsed URL (``SQLConfig``)."""
    from sqlalchemy import event
    from sqlalchemy.ext.asyncio import create_async_engine

    connect_args: dict[str, Any] = {}
    timeout = config.statement_timeout
    if config.driver == "asyncpg":
        connect_args["timeout"] = config.connect_timeout
        # Set when asyncpg connects: no extra round trip per connection.
        settings: dict[str, str] = {}
        if config.schema is not None:
            settings["search_path"] = _quote_pg(config.schema)
        if timeout is not None:
            settings["statement_timeout"] = str(_milliseconds(timeout))
        if settings:
            connect_args["server_settings"] = settings
    elif config.driver in ("psycopg", "psycopg_async"):
        connect_args["connect_timeout"] = max(1, round(config.connect_timeout))
    elif config.driver in ("asyncmy", "aiomysql"):
        connect_args["connect_timeout"] = config.connect_timeout
        # READ COMMITTED: no gap locks, so writers to different sessions never block or deadlock each other.
        connect_args["init_command"] = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"
    pool: dict[str, Any] = {}
    if config.family != "sqlite":
        pool = {
            "pool_size": config.pool_size,
            "max_overflow": config.max_overflow,
            "pool_recycle": config.pool_recycle,
            "pool_pre_ping": config.pool_pre_ping,
        }
    engine = create_async_engine(
        config.url,
        isolation_level="AUTOCOMMIT",
        # Every call ends its own transactions (COMMIT or ROLLBACK), so a returned connection needs no reset.
        pool_reset_on_return=None,
        connect_args=connect_args,
        **pool,
    )
    if config.schema is not None and config.driver != "asyncpg":
        quoted = _quote_pg(config.schema)

        @event.listens_for(engine.sync_engine, "connect")
        def _search_path(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute(f"SET search_path TO {quoted}")
            cursor.close()

    if timeout is not None and config.driver != "asyncpg":
        # One engine reaches one server: a MySQL-protocol one is asked which it is on the first connection only.
        servers: list[str] = ["postgresql"] if config.family == "postgresql" else []

        @event.listens_for(engine.sync_engine, "connect")
        def _statement_timeout(dbapi_connection: Any, record: Any) -> None:
            cursor = dbapi_connection.cursor()
            if not servers:
                servers.append(_mysql_server(cursor))
            cursor.execute(timeout_statement(servers[0], timeout))
            cursor.close()
            record.info[_SERVER] = servers[0]

    if config.family == "sqlite":

        @event.listens_for(engine.sync_engine, "connect")
        def _pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            for pragma in ("journal_mode=WAL", f"synchronous={config.synchronous.upper()}", "foreign_keys=ON"):
                cursor.execute(f"PRAGMA {pragma}")
            cursor.execute(f"PRAGMA busy_timeout={int(config.busy_timeout * 1000)}")
            cursor.close()

    return EngineRunner(engine, owned=True, schema=config.schema, statement_timeout=timeout)


def _quote_pg(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
