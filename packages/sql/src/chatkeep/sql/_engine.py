"""The ``sqlalchemy`` transport: any SQLAlchemy ``AsyncEngine``, and the engine a store makes from its URL.

Statements run on the driver's DBAPI adapter through SQLAlchemy's greenlet bridge (no SQL compilation;
the driver caches prepared statements). On an engine the store made, a call checks a connection straight
out of the pool (no ``Connection`` object) without a pre-ping round trip: a pooled connection found dead
before the server answered is dropped together with every connection as old as it (``Pool._invalidate``,
what SQLAlchemy's own ``Connection`` does on a disconnect; ``tests/test_driver_contracts.py`` fails when a
SQLAlchemy release changes it), and the call runs once more. An engine you hand in goes through
``engine.connect()``. The native transports (``_native``) lend the same pooled connections.

Between calls, a store's own engine keeps up to ``pool_size`` connections checked out in chatkeep's hands
(:class:`_Engine`), newest first: the next call takes one with no trip through the pool. Checking one out of
SQLAlchemy's pool costs a greenlet switch (the pool may open a connection, which is I/O), measured at 60-70 µs
per call inside a turn on a 2-core machine, as much as the rest of a short call's Python work. A kept
connection older than ``pool_recycle`` goes back to the pool, which replaces it; with ``pool_pre_ping`` none is
kept (each call then pays the pool's round trip, as asked); one found dead drops the kept ones with it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from chatkeep.core import ChatkeepError
from chatkeep.core.backend import PerLoop, redact_url
from chatkeep.sql._config import sqlite_pragmas
from chatkeep.sql._errors import SQLITE_FILE_HINT, NoAnswerError, connect_timed_out
from chatkeep.sql._schema import ensure_schema
from chatkeep.sql._sql import Statements
from chatkeep.sql._transport import Connection, LendingTransport

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.ext.asyncio import AsyncEngine

    from chatkeep.sql._config import SQLConfig

__all__ = ["EngineTransport", "Leased", "create_engine", "timeout_statement"]

L = TypeVar("L", bound="Leased")

#: The key of a pooled connection's ``info`` set once a call used it (``info`` is cleared when it is replaced).
_USED = "chatkeep_used"
#: The key of a pooled connection's ``info`` holding when chatkeep first lent it (``time.monotonic()``).
_SINCE = "chatkeep_since"
#: The key of a pooled connection's ``info`` that names its server (``postgresql``, ``mariadb`` or ``mysql``),
#: set where its statement timeout is (the schema's work lifts that timeout by the same name).
_SERVER = "chatkeep_server"


class Leased(Connection):
    """A connection lent from an engine's pool: ``lease`` is the pooled connection (or the ``AsyncConnection``)."""

    __slots__ = ("lease",)

    def __init__(self, lease: Any, *, reused: bool) -> None:
        super().__init__(reused=reused)
        self.lease = lease


class _DBAPIConnection(Leased):
    """Statements on the driver's DBAPI adapter, each through SQLAlchemy's greenlet bridge."""

    __slots__ = ("_dbapi", "_spawn")

    def __init__(self, lease: Any, dbapi: Any, spawn: Any, *, reused: bool) -> None:
        super().__init__(lease, reused=reused)
        self._dbapi = dbapi
        self._spawn = spawn

    def _step(self, statement: str, params: Sequence[Any]) -> tuple[Sequence[Sequence[Any]], int]:
        cur = self._dbapi.cursor()
        try:
            if params:
                cur.execute(statement, params)
            else:
                cur.execute(statement)
            self.answered = True
            return (cur.fetchall() if cur.description else ()), int(cur.rowcount)
        finally:
            cur.close()

    async def _fetch(self, statement: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
        return (await self._spawn(self._step, statement, params))[0]  # type: ignore[no-any-return]

    async def _execute(self, statement: str, params: Sequence[Any]) -> int:
        return (await self._spawn(self._step, statement, params))[1]  # type: ignore[no-any-return]


class _Engine:
    """One event loop's engine of a store's own, and the pooled connections kept checked out between its calls."""

    __slots__ = ("engine", "idle", "keep", "recycle")

    def __init__(self, engine: AsyncEngine, *, recycle: float, pre_ping: bool) -> None:
        from sqlalchemy.pool import QueuePool

        self.engine = engine
        pool = engine.sync_engine.pool
        #: How many to keep (none for a pool without a size, or one that pings before each use).
        self.keep = pool.size() if isinstance(pool, QueuePool) and not pre_ping else 0
        self.recycle = recycle
        self.idle: list[Any] = []  # SQLAlchemy's pooled connections, the most recently used last

    def fresh(self, fairy: Any) -> bool:
        """Whether a kept connection is younger than ``pool_recycle``."""
        return self.recycle < 0 or time.monotonic() - fairy.info.get(_SINCE, 0.0) < self.recycle

    def release(self) -> None:
        """Give every kept connection back to the pool (inside SQLAlchemy's greenlet: a return may close one)."""
        while self.idle:
            self.idle.pop().close()

    def invalidate(self, exc: BaseException) -> None:
        """Drop every kept connection (inside the greenlet): another one was found dead, so may they be."""
        while self.idle:
            fairy = self.idle.pop()
            fairy.invalidate(exc)
            fairy.close()


class EngineTransport(LendingTransport[L]):
    """A SQLAlchemy ``AsyncEngine``: PostgreSQL, MySQL/MariaDB, or SQLite on aiosqlite (see the module docstring)."""

    name = "sqlalchemy"

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        owned: bool,
        schema: str | None = None,
        statement_timeout: float | None = None,
        make: Callable[[], AsyncEngine] | None = None,
        recycle: float = -1,
        pre_ping: bool = False,
    ) -> None:
        from sqlalchemy.exc import SQLAlchemyError
        from sqlalchemy.pool import QueuePool
        from sqlalchemy.util import greenlet_spawn

        self.owned = owned
        # An engine the store made from its URL is made again for each event loop that uses the store (its pooled
        # connections belong to one loop); an engine handed in is its owner's, used on its one loop.
        self.serves_any_loop = owned and make is not None
        self._engines: PerLoop[_Engine] | None = None
        self._only = engine if owned else engine.execution_options(isolation_level="AUTOCOMMIT")
        if self.serves_any_loop:
            assert make is not None
            self._engines = PerLoop(
                lambda: _Engine(make(), recycle=recycle, pre_ping=pre_ping),
                close=_dispose,
                abandon=_forget,
                first=_Engine(engine, recycle=recycle, pre_ping=pre_ping),
            )
        self.schema = schema
        self.statement_timeout = statement_timeout
        dialect = engine.dialect
        self.description = redact_url(engine.url.render_as_string(hide_password=True))
        self.address, self.port = engine.url.host, engine.url.port
        if dialect.name == "sqlite":
            self.hint = SQLITE_FILE_HINT
        self.statements = Statements(
            dialect.name,
            dialect.paramstyle,
            is_mariadb=bool(getattr(dialect, "is_mariadb", False)),
            # The engines chatkeep makes connect without CLIENT_FOUND_ROWS (see _bounded_connect).
            found_rows=not (owned and dialect.driver in _MYSQL_DRIVERS),
        )
        # A QueuePool closes a connection returned beyond its size: that close needs SQLAlchemy's greenlet.
        self._queue_pool = isinstance(engine.sync_engine.pool, QueuePool)
        self._spawn = greenlet_spawn
        errors: list[type[BaseException]] = [SQLAlchemyError, OSError, asyncio.TimeoutError]
        dbapi = getattr(dialect, "loaded_dbapi", None)
        if dbapi is not None and isinstance(getattr(dbapi, "Error", None), type):
            errors.append(dbapi.Error)
        self.errors = (*errors, *self._driver_errors())

    @property
    def kept(self) -> int:
        """How many of the running loop's pooled connections are kept checked out between calls (idle)."""
        if self._engines is None:
            return 0
        held = self._engines.current()
        return 0 if held is None else len(held.idle)

    @property
    def engine(self) -> AsyncEngine:
        """The engine of the running event loop (made on its first call there), or the one engine handed in."""
        return self._only if self._engines is None else self._engines.get().engine

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        """The driver's own exceptions, for a transport that calls the driver directly."""
        return ()

    def _wrap(self, lease: Any, pooled: Any, *, reused: bool) -> L:
        """The connection a call gets for a pooled connection (``lease`` is what goes back to the pool)."""
        return _DBAPIConnection(lease, pooled.dbapi_connection, self._spawn, reused=reused)  # type: ignore[return-value]

    async def _checkout(self) -> L:
        if self._engines is not None:
            held = self._engines.get()
            while held.idle:
                fairy = held.idle.pop()
                if held.fresh(fairy):
                    return self._wrap(fairy, fairy, reused=True)
                await self._spawn(fairy.close)  # past pool_recycle: the pool replaces it
            fairy = await self._spawn(held.engine.sync_engine.pool.connect)
            fairy.info.setdefault(_SINCE, time.monotonic())
            return self._wrap(fairy, fairy, reused=bool(fairy.info.get(_USED)))
        conn = await self.engine.connect()
        try:
            pooled = await conn.get_raw_connection()
        except BaseException:
            await conn.close()
            raise
        return self._wrap(conn, pooled, reused=True)

    async def _checkin(self, conn: L) -> None:
        """Return a connection to the pool: no I/O (no reset on return), unless the pool is full and closes it.

        A connection beyond ``pool_size`` (an overflow one) is closed on return, and an async driver's close
        must run in SQLAlchemy's greenlet, or its socket is left open.
        """
        if self._engines is None:
            await conn.lease.close()
            return
        fairy = conn.lease
        fairy.info[_USED] = True
        held = self._engines.get()
        if len(held.idle) < held.keep:
            held.idle.append(fairy)  # kept for the next call (see the module docstring)
            return
        pool = held.engine.sync_engine.pool
        if self._queue_pool and pool.checkedin() < pool.size():  # type: ignore[attr-defined]
            fairy.close()
        else:
            await self._spawn(fairy.close)

    async def _discard(self, conn: L, exc: BaseException, *, stale: bool) -> None:
        if isinstance(exc, NoAnswerError):
            # A server that stopped answering gets no goodbye: SQLAlchemy's close of an asyncpg connection waits
            # 2 s for one. asyncpg's public terminate() closes the socket at once (the others close without a wait).
            terminate = getattr(getattr(conn.lease, "driver_connection", None), "terminate", None)
            if callable(terminate):
                terminate()
        if self._engines is None:
            await conn.lease.invalidate(exc if isinstance(exc, Exception) else None)
            await conn.lease.close()
            return
        await self._spawn(self._drop, self._engines.get(), conn.lease, exc, stale)

    def _drop(self, held: _Engine, fairy: Any, exc: BaseException, stale: bool) -> None:
        if stale:
            # Every connection opened before this one may be dead too: the pool replaces them on checkout, as
            # SQLAlchemy's Connection does on a disconnect (tests/test_driver_contracts.py guards this call).
            held.engine.sync_engine.pool._invalidate(fairy, exc)
            held.invalidate(exc)  # and the kept ones, which no checkout would test
        else:
            fairy.invalidate(exc)  # unknown state (a failed rollback, a cancelled call): never reuse it
        fairy.close()

    def _stale(self, conn: L, exc: Exception) -> bool:
        if not self.owned:
            return False  # your engine's connection is invalidated, and the call not run again
        if isinstance(exc, OSError):
            return True
        return bool(self.engine.dialect.is_disconnect(exc, conn.lease.dbapi_connection, None))  # type: ignore[arg-type]

    def _prepare(self, conn: SAConnection, upgrade: bool) -> str:
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
        if self._engines is not None:  # the pool may need them back (max_overflow=0)
            held = self._engines.get()
            if held.idle:
                await self._spawn(held.release)
        try:
            # A connection in a transaction of its own (the engine's default isolation) for the schema work.
            isolation = "SERIALIZABLE" if self.engine.dialect.name == "sqlite" else "READ COMMITTED"
            engine = self.engine.execution_options(isolation_level=isolation)
            async with engine.connect() as conn:
                revision = await conn.run_sync(partial(self._prepare, upgrade=upgrade))
        except ChatkeepError:
            raise
        except self.errors as exc:
            raise self.translate(exc) from exc
        # The first connection told the dialect what the server is (a mysql:// URL may reach MariaDB).
        dialect = self.engine.dialect
        self.statements.use_server(
            is_mariadb=bool(getattr(dialect, "is_mariadb", False)), version=dialect.server_version_info
        )
        return revision

    def on_loop_change(self) -> None:
        # An engine handed in, moved to a new loop: the pooled connections died with the old one.
        if self._engines is None:
            self._only.sync_engine.dispose(close=False)

    async def aclose(self) -> None:
        if self._engines is not None:
            await self._engines.aclose()
        elif self.owned:
            await self._only.dispose()


async def _dispose(held: _Engine) -> None:
    from sqlalchemy.util import greenlet_spawn

    if held.idle:
        await greenlet_spawn(held.release)
    await held.engine.dispose()


def _forget(held: _Engine) -> None:
    """Drop an engine whose event loop is gone: its pooled connections died with the loop (not closed again)."""
    for fairy in held.idle:
        fairy.detach()  # the pool forgets it; its socket went with the loop
    held.idle.clear()
    held.engine.sync_engine.dispose(close=False)


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


def _mysql_server(cursor: Any) -> str:
    """``mariadb`` or ``mysql``: which server a MySQL-protocol connection reached (a ``mysql://`` URL may be either)."""
    cursor.execute("SELECT VERSION()")
    return "mariadb" if "mariadb" in str(cursor.fetchone()[0]).lower() else "mysql"


def _unbounded_statement(server: str) -> str:
    """What lifts the statement timeout (not the lock wait) on ``server``: for the schema's own work."""
    if server == "postgresql":
        return "SET statement_timeout = 0"
    return "SET SESSION max_statement_time = 0" if server == "mariadb" else "SET SESSION max_execution_time = 0"


def _quote_pg(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


#: The MySQL drivers SQLAlchemy's async dialects use, and the protocol's CLIENT_FOUND_ROWS capability flag.
_MYSQL_DRIVERS = ("asyncmy", "aiomysql")
_CLIENT_FOUND_ROWS = 2


def _driver_connect(driver: str) -> Callable[..., Awaitable[Any]] | None:
    """The driver's own ``connect`` coroutine function, which SQLAlchemy calls to open a connection."""
    if driver == "asyncpg":
        import asyncpg  # type: ignore[import-untyped]

        return asyncpg.connect  # type: ignore[no-any-return]
    if driver == "asyncmy":
        import asyncmy

        return asyncmy.connect
    if driver == "aiomysql":
        import aiomysql  # type: ignore[import-untyped]

        return aiomysql.connect  # type: ignore[no-any-return]
    if driver in ("psycopg", "psycopg_async"):
        import psycopg

        return psycopg.AsyncConnection.connect
    return None


def _bounded_connect(config: SQLConfig) -> Callable[..., Awaitable[Any]] | None:
    """The driver's ``connect``, bounded as a whole (TCP, greeting, TLS, login) by ``connect_timeout``.

    The drivers' own timeouts leave parts out: asyncmy and aiomysql bound only the TCP connect, so a peer that
    accepts and never sends the server's greeting would hang the call forever; asyncpg's raises a bare
    ``TimeoutError``. SQLAlchemy's async dialects call ``async_creator_fn`` (what ``create_async_engine``'s
    ``async_creator`` sets; ``tests/test_driver_contracts.py`` fails when a release changes it) with the
    URL's connect arguments in place of the driver's ``connect``.

    MySQL connections also drop the ``CLIENT_FOUND_ROWS`` flag SQLAlchemy adds: chatkeep counts rows an
    ``INSERT ... ON DUPLICATE KEY UPDATE`` changed (see ``Statements``), and no chatkeep statement reads the
    rows an ``UPDATE`` matched.
    """
    from sqlalchemy.engine import make_url

    connect = _driver_connect(config.driver)
    if connect is None or config.url is None:
        return None
    url = make_url(config.url)
    address = f"{url.host or 'localhost'}:{url.port or (5432 if config.family == 'postgresql' else 3306)}"
    seconds = config.settings.connect_timeout

    async def bounded(*args: Any, **kwargs: Any) -> Any:
        if config.driver in _MYSQL_DRIVERS:  # rows changed, not matched: exact append counts with no warnings
            kwargs["client_flag"] = kwargs.get("client_flag", 0) & ~_CLIENT_FOUND_ROWS
        try:
            return await asyncio.wait_for(connect(*args, **kwargs), seconds)
        except asyncio.TimeoutError as exc:  # the bound's, or the driver's own (asyncpg's has no message)
            raise connect_timed_out(address, seconds) from exc

    return bounded


def create_engine(config: SQLConfig) -> AsyncEngine:
    """A new engine for a parsed URL (``SQLConfig``): chatkeep's pool settings and per-connection setup."""
    from sqlalchemy import event
    from sqlalchemy.ext.asyncio import create_async_engine

    assert config.url is not None  # only the sqlite3 transport has none, and it opens no engine
    options = config.settings
    connect_args: dict[str, Any] = {}
    timeout = options.statement_timeout
    if config.driver == "asyncpg":
        connect_args["timeout"] = options.connect_timeout
        # Set when asyncpg connects: no extra round trip per connection.
        settings: dict[str, str] = {}
        if options.schema_ is not None:
            settings["search_path"] = _quote_pg(options.schema_)
        if timeout is not None:
            settings["statement_timeout"] = str(_milliseconds(timeout))
        if settings:
            connect_args["server_settings"] = settings
    elif config.driver in ("psycopg", "psycopg_async"):
        connect_args["connect_timeout"] = max(1, round(options.connect_timeout))
    elif config.driver in ("asyncmy", "aiomysql"):
        connect_args["connect_timeout"] = options.connect_timeout
        # READ COMMITTED: no gap locks, so writers to different sessions never block or deadlock each other.
        connect_args["init_command"] = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"
    bounded = _bounded_connect(config)
    if bounded is not None:
        connect_args["async_creator_fn"] = bounded
    pool: dict[str, Any] = {}
    if config.family != "sqlite":
        pool = {
            "pool_size": options.pool_size,
            "max_overflow": options.max_overflow,
            "pool_recycle": options.pool_recycle,
            "pool_pre_ping": options.pool_pre_ping,
        }
    engine = create_async_engine(
        config.url,
        isolation_level="AUTOCOMMIT",
        # Every call ends its own transactions (COMMIT or ROLLBACK), so a returned connection needs no reset.
        pool_reset_on_return=None,
        connect_args=connect_args,
        **pool,
    )
    if options.schema_ is not None and config.driver != "asyncpg":
        quoted = _quote_pg(options.schema_)

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
            for pragma in ("journal_mode=WAL", *sqlite_pragmas(options.synchronous, options.mmap_size)):
                cursor.execute(f"PRAGMA {pragma}")
                cursor.fetchall()
            cursor.execute(f"PRAGMA busy_timeout={int(options.busy_timeout * 1000)}")
            cursor.close()

    return engine
