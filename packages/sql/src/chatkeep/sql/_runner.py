"""Where the statements run: SQLite's ``sqlite3`` in worker threads, or a SQLAlchemy ``AsyncEngine``'s pool.

Both run one synchronous function per store call on a DBAPI connection in autocommit mode (one hop from
the event loop per call), check the schema once before the first call, and translate driver errors
into :class:`StoreUnavailableError` with the driver's exception chained.
"""

from __future__ import annotations

import abc
import asyncio
import os
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from chatkeep.core import ChatkeepError, StoreUnavailableError, redact_url
from chatkeep.sql._schema import ensure_schema
from chatkeep.sql._sql import Statements

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["EngineRunner", "Runner", "SQLiteRunner"]

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

    def _unavailable(self, exc: BaseException) -> StoreUnavailableError:
        return StoreUnavailableError(
            f"the database at {self.description} failed or could not be reached ({type(exc).__name__}: "
            f"{redact_url(str(exc)).strip()[:500]}); check that it is running and reachable, then retry"
        )


class SQLiteRunner(Runner):
    """SQLite through the built-in ``sqlite3`` module, each call in one of the store's worker threads.

    The async SQLite driver costs several times the sync one per statement, so a call runs all its
    statements on a plain ``sqlite3`` connection in a thread: one hop per call. Connections are kept in a
    small pool; each is in WAL mode (readers never wait for the writer) with a busy timeout.
    """

    def __init__(self, path: str, *, busy_timeout: float, pool_size: int) -> None:
        self.path = path
        self.description = f"sqlite:///{path}"
        self.busy_timeout = busy_timeout
        self.pool_size = max(1, pool_size)
        self.statements = Statements("sqlite", "qmark")
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    def connect(self) -> sqlite3.Connection:
        """A new connection to the file, set up for chatkeep (creating the file and its folder on first use)."""
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False, cached_statements=256
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL").fetchall()
            # NORMAL is durable across application crashes in WAL mode; only a power loss can undo the last commits.
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
        except BaseException:
            conn.close()
            raise
        return conn

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
        for conn in idle:
            conn.close()
        if self._executor is not None:
            # Calls still running return their connection to a closed pool, which closes it.
            self._executor.shutdown(wait=False)


class EngineRunner(Runner):
    """A SQLAlchemy ``AsyncEngine`` (PostgreSQL, MySQL/MariaDB, or SQLite through aiosqlite).

    Each call checks a connection out of the engine's pool (pre-pinged, recycled) and runs in SQLAlchemy's
    greenlet bridge directly on the driver's DBAPI adapter: no SQL compilation per call, and the driver
    caches the prepared statements.
    """

    def __init__(self, engine: AsyncEngine, *, owned: bool, schema: str | None = None) -> None:
        self.engine = engine if owned else engine.execution_options(isolation_level="AUTOCOMMIT")
        self.owned = owned
        self.schema = schema
        dialect = engine.dialect
        family = "postgresql" if dialect.name == "postgresql" else dialect.name
        self.description = redact_url(engine.url.render_as_string(hide_password=True))
        self.statements = Statements(family, dialect.paramstyle, is_mariadb=bool(getattr(dialect, "is_mariadb", False)))
        from sqlalchemy.exc import SQLAlchemyError

        errors: list[type[BaseException]] = [SQLAlchemyError, OSError, asyncio.TimeoutError]
        dbapi = getattr(dialect, "loaded_dbapi", None)
        if dbapi is not None and isinstance(getattr(dbapi, "Error", None), type):
            errors.append(dbapi.Error)
        self._errors = tuple(errors)

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
            async with self.engine.connect() as conn:
                return await conn.run_sync(self._call, op)
        except self._errors as exc:
            if isinstance(exc, ChatkeepError):
                raise
            raise self._unavailable(exc) from exc

    def _prepare(self, conn: Connection, upgrade: bool) -> str:
        if self.schema is not None:
            quoted = self.engine.dialect.identifier_preparer.quote_identifier(self.schema)
            conn.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {quoted}")
            conn.commit()
        return ensure_schema(conn, upgrade=upgrade)

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
    if config.driver == "asyncpg":
        connect_args["timeout"] = config.connect_timeout
        if config.schema is not None:
            # Set when asyncpg connects: no extra round trip per connection.
            connect_args["server_settings"] = {"search_path": _quote_pg(config.schema)}
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

    if config.family == "sqlite":

        @event.listens_for(engine.sync_engine, "connect")
        def _pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON"):
                cursor.execute(f"PRAGMA {pragma}")
            cursor.execute(f"PRAGMA busy_timeout={int(config.busy_timeout * 1000)}")
            cursor.close()

    return EngineRunner(engine, owned=True, schema=config.schema)


def _quote_pg(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
