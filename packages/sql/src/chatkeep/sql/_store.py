"""The SQL history store: SQLite (the embedded default), PostgreSQL and MySQL/MariaDB."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from chatkeep.core import (
    AgentSession,
    BackendHistoryProvider,
    Message,
    SessionInfo,
    SessionKey,
    SessionPage,
    StoreUnavailableError,
)
from chatkeep.core.backend import HistoryStore, StoredSession, checked, decode_records, session_document
from chatkeep.sql import _sql
from chatkeep.sql._config import SQLConfig, SQLURLError, parse_url
from chatkeep.sql._runner import EngineRunner, Runner, SQLiteRunner, create_engine_runner
from chatkeep.sql._schema import key_hash, message_hash, tenant_hash

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["SQLHistoryProvider", "SQLHistoryStore", "migrate", "open_store"]

T = TypeVar("T")
#: Calls on at most this many messages are short: on SQLite they run on the event loop when no lock is in the way,
#: and on PostgreSQL such an append is one statement. Longer appends keep a transaction whose COMMIT a
#: cancellation can still prevent (a short statement already sent is over before a cancellation could matter).
_SHORT_ROWS = 100
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _time(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def _us(moment: datetime) -> int:
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _encode_cursor(updated_at: int, row_id: int) -> str:
    return base64.urlsafe_b64encode(f"{updated_at}:{row_id}".encode()).decode()


def _decode_cursor(cursor: str) -> tuple[int, int]:
    try:
        updated_at, row_id = base64.urlsafe_b64decode(cursor.encode()).decode().split(":")
        return int(updated_at), int(row_id)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError) as exc:
        raise ValueError(f"{cursor!r} is not a list_sessions cursor") from exc


class SQLHistoryStore(HistoryStore):
    """A :class:`~chatkeep.core.HistoryStore` in a SQL database: SQLite, PostgreSQL, or MySQL/MariaDB.

    Open one with :func:`open_store` (``sqlite://``, ``postgresql://...``, ``mysql://...``), or hand it an
    ``AsyncEngine`` you already have. Nothing connects until the first call; the first call on an empty
    database creates chatkeep's tables. There is no native TTL: run :meth:`prune` as a scheduled job.

    Args:
        url: a store URL (see :func:`open_store`); ``None`` with no ``client`` opens ``sqlite://``.
        client: an existing SQLAlchemy ``AsyncEngine`` instead of a URL; the store uses its pool and leaves it
            open on close.
        **options: the URL's options as keywords (``max_message_bytes``, ``schema``, ``busy_timeout``,
            ``connect_timeout``, ``statement_timeout``, ``pool_size``, ``max_overflow``, ``pool_recycle``,
            ``pool_pre_ping``).

    Raises:
        SQLURLError: the URL or an option is malformed or unknown, or both a URL and a client are given.
        MissingExtraError: the URL's driver is not installed.
    """

    def __init__(self, url: str | None = None, *, client: AsyncEngine | None = None, **options: Any) -> None:
        if url is not None and client is not None:
            raise SQLURLError("give SQLHistoryStore a URL or a client= engine, not both")
        config: SQLConfig
        runner: Runner
        if client is not None:
            config = parse_url("sqlite://", **options)  # only the options matter here
            runner = EngineRunner(client, owned=False)
        else:
            config = parse_url(url or "sqlite://", **options)
            if config.driver == "pysqlite":
                assert config.sqlite_path is not None
                runner = SQLiteRunner(
                    config.sqlite_path,
                    busy_timeout=config.busy_timeout,
                    pool_size=config.pool_size,
                    synchronous=config.synchronous,
                )
            else:
                runner = create_engine_runner(config)
        super().__init__(max_message_bytes=config.max_message_bytes)
        self.config = config
        self._runner = runner
        self._sql = runner.statements
        self._ready = False
        self._prepare_lock: asyncio.Lock | None = None  # one first-use schema check at a time (made on its loop)
        self._guarded_loop: asyncio.AbstractEventLoop | None = None
        self._guard: AsyncIterator[None] | None = None
        self._records_read = 0
        self._last_stamp = 0

    # -- plumbing ------------------------------------------------------------------------------------

    @property
    def messages_read(self) -> int:
        """How many message rows this store has fetched (the conformance kit's read probe)."""
        return self._records_read

    @property
    def uses_fast_path(self) -> bool:
        """Whether the hot calls bypass SQLAlchemy: the stdlib ``sqlite3`` runner, or native asyncpg / asyncmy calls."""
        return isinstance(self._runner, SQLiteRunner) or self._runner.native

    @property
    def dialect(self) -> str:
        """The database family: ``sqlite``, ``postgresql``, ``mysql`` or ``mariadb``."""
        return self._sql.family

    def describe(self) -> dict[str, Any]:
        """What this store is, for logs and the CLI (no secrets)."""
        return {"type": type(self).__name__, "database": self._runner.description}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._runner.description}{' closed' if self.closed else ''}>"

    async def _prepare(self) -> None:
        """Check (or create) the schema once: concurrent first calls wait for the first instead of racing it."""
        if self._prepare_lock is None:
            self._prepare_lock = asyncio.Lock()
        async with self._prepare_lock:
            if not self._ready:
                await self._runner.prepare()
                self._ready = True

    def _on_loop_change(self) -> None:
        self._prepare_lock = None
        self._runner.on_loop_change()

    async def _aclose(self) -> None:
        guard, self._guard = self._guard, None
        if guard is not None and self._guarded_loop is asyncio.get_running_loop():
            await guard.aclose()  # type: ignore[attr-defined]
        await self._runner.aclose()

    def _stamp(self) -> int:
        """Now in microseconds, strictly after this store's previous stamp (so its writes order)."""
        now = time.time_ns() // 1000
        if now <= self._last_stamp:
            now = self._last_stamp + 1
        self._last_stamp = now
        return now

    async def _call(self, op: Callable[[Any], T], *, short: bool = False) -> T:
        """Run ``op`` on a connection (a read, or one autocommitted statement); ``short``: bounded, may run inline.

        Not shielded: a cancelled read leaves nothing to finish (the runner drops or returns the connection),
        and one autocommitted statement is atomic either way.
        """
        return await self._write(lambda conn, _flag: op(conn), short=short, shield=False)

    async def _write(
        self,
        op: Callable[[Any, _sql.Flag], T] | None = None,
        *,
        short: bool = False,
        shield: bool = True,
        native: Callable[[Any, _sql.Flag], Awaitable[T]] | None = None,
    ) -> T:
        """Run ``op``; a cancelled caller's transaction rolls back unless it had already committed.

        A ``short`` call (bounded work) first tries to run inline on the event loop (SQLite, when it need not
        wait for a lock); it cannot be cancelled half way there. Otherwise the work runs in a task of its
        own, shielded: on cancellation we set the flag the transaction checks before committing, and wait
        for it to end, so the outcome is final (and the connection back in the pool) when the cancellation
        reaches the caller.
        """
        if self._runner.loop_bound and self._guarded_loop is not asyncio.get_running_loop():
            await self._watch_loop()
        if not self._ready:
            await self._prepare()
        flag = _sql.Flag()
        if native is not None:
            # The driver's own async API (asyncpg, asyncmy), in a task of its own like the others.
            work: Awaitable[T] = self._runner.run_native(lambda call: native(call, flag))
        else:
            assert op is not None
            if short:
                result = self._runner.run_inline(lambda conn: op(conn, flag))
                if result is not None:
                    return result
            if not shield:
                return await self._runner.run(lambda conn: op(conn, flag))
            work = self._runner.run(lambda conn: op(conn, flag))
        task: Awaitable[T] = asyncio.ensure_future(work)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            flag.is_set = True
            with contextlib.suppress(BaseException):  # the cancellation is what the caller sees
                await task
            raise

    async def _watch_loop(self) -> None:
        """Release the pool's connections when this event loop shuts down (``asyncio.run`` ending).

        The loop closes the async generators it started before it stops, so the generator's ``finally``
        runs while the loop still works and the connections close cleanly; a later ``asyncio.run`` then
        opens new ones.
        """
        self._guarded_loop = asyncio.get_running_loop()

        async def guard() -> AsyncIterator[None]:
            try:
                yield
            finally:
                if not self.closed and self._guarded_loop is asyncio.get_running_loop():
                    self._guarded_loop = None
                    await self._runner.release()

        self._guard = guard()
        await self._guard.__anext__()

    @checked
    async def migrate(self) -> str:
        """Create or upgrade chatkeep's tables to this release's schema; returns the revision (``chatkeep migrate``)."""
        revision = await self._runner.prepare(upgrade=True)
        self._ready = True
        return revision

    @checked
    async def schema_revision(self) -> str:
        """The schema revision of the database (created in an empty one, as a first call does); never migrates."""
        revision = await self._runner.prepare()
        self._ready = True
        return revision

    def _head(self, key: SessionKey) -> tuple[bytes, bytes, bytes, bytes]:
        return (
            key_hash(key.tenant, key.session_id),
            tenant_hash(key.tenant),
            key.tenant.encode(),
            key.session_id.encode(),
        )

    def _decode(self, records: Sequence[str]) -> list[Message]:
        self._records_read += len(records)
        return decode_records(records)

    # -- messages ------------------------------------------------------------------------------------

    async def _append(self, key: SessionKey, messages: Sequence[Message], records: Sequence[str]) -> int:
        """Append atomically, skipping ids the session holds (a unique index on the id's hash)."""
        rows = [(message_hash(message.message_id), record) for message, record in zip(messages, records, strict=True)]
        head, now, sql = self._head(key), self._stamp(), self._sql
        if sql.append_one and len(rows) <= _SHORT_ROWS and self._runner.native:
            return await self._append_native(head, now, rows)
        if sql.mysql and self._runner.native:
            return await self._write(native=lambda call, flag: _sql.append_native(call, sql, flag, head, now, rows))
        if sql.append_one and len(rows) <= _SHORT_ROWS:
            return await self._write(lambda conn, flag: _sql.append_one(conn, sql, flag, head, now, rows))
        return await self._write(
            lambda conn, flag: _sql.append(conn, sql, flag, head, now, rows), short=len(rows) <= _SHORT_ROWS
        )

    async def _append_native(
        self, head: tuple[bytes, bytes, bytes, bytes], now: int, rows: list[tuple[bytes, str]]
    ) -> int:
        """PostgreSQL on asyncpg: the one-statement append straight on the driver, run again if it rolled back."""
        params = _sql.append_one_params(head, now, rows)
        for attempt in range(_sql.ATTEMPTS):
            try:
                found = await self._fetch_native(self._sql.append_one, params)
                return int(found[0][0])
            except StoreUnavailableError as exc:
                cause = exc.__cause__
                if cause is None or attempt + 1 == _sql.ATTEMPTS or not _sql.append_one_retryable(cause):
                    raise
            await asyncio.sleep(random.uniform(0.0, 0.002) * attempt)
        raise AssertionError("unreachable")

    async def _fetch_native(self, statement: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
        if self._guarded_loop is not asyncio.get_running_loop():
            await self._watch_loop()
        if not self._ready:
            await self._prepare()
        return await self._runner.fetch_native(statement, params)

    async def _load(self, key: SessionKey, last: int | None) -> list[Message]:
        """The history in append order; with ``last=k`` only the k newest, reading only those rows."""
        digest = key_hash(key.tenant, key.session_id)
        if last is None:
            rows = await self._call(partial(_sql.fetch, statement=self._sql.load_all, params=(digest,)))
            return self._decode([row[0] for row in rows])
        if self._runner.native:
            rows = await self._fetch_native(self._sql.load_last, (digest, last))
        else:
            rows = await self._call(
                partial(_sql.fetch, statement=self._sql.load_last, params=(digest, last)), short=last <= _SHORT_ROWS
            )
        return self._decode([row[0] for row in reversed(rows)])

    async def _iter_messages(self, key: SessionKey, batch: int) -> AsyncIterator[Message]:
        """Iterate over the history in append order, ``batch`` rows per read (keyset pages on the sequence)."""
        rows = await self._call(
            partial(_sql.fetch, statement=self._sql.page_first, params=(key_hash(key.tenant, key.session_id), batch))
        )
        while rows:
            # Following pages name the session row: a session deleted (and re-created) meanwhile ends the iteration.
            session_ref, seq = rows[-1][0], rows[-1][1]
            for message in self._decode([row[2] for row in rows]):
                yield message
            if len(rows) < batch:
                return
            rows = await self._call(
                partial(_sql.fetch, statement=self._sql.page_next, params=(session_ref, seq, batch))
            )

    async def _count(self, key: SessionKey) -> int:
        """How many messages the session holds (a counter kept with the session: no messages are read)."""
        rows = await self._call(
            partial(_sql.fetch, statement=self._sql.count, params=(key_hash(key.tenant, key.session_id),))
        )
        return int(rows[0][0]) if rows else 0

    async def _delete(self, key: SessionKey) -> bool:
        """Delete the session's messages and document; ``True`` if anything was there."""
        changed = await self._call(
            partial(_sql.execute, statement=self._sql.delete, params=(key_hash(key.tenant, key.session_id),))
        )
        return changed > 0

    async def _trim(self, key: SessionKey, keep_last: int) -> int:
        """Delete all but the ``keep_last`` newest messages; returns how many were deleted."""
        digest, now, sql = key_hash(key.tenant, key.session_id), self._stamp(), self._sql
        return await self._write(lambda conn, flag: _sql.trim(conn, sql, flag, digest, keep_last, now))

    async def _pop(self, key: SessionKey) -> Message | None:
        """Delete the newest message and return it, in one transaction holding the session row's lock."""
        digest, now, sql = key_hash(key.tenant, key.session_id), self._stamp(), self._sql
        record = await self._write(lambda conn, flag: _sql.pop(conn, sql, flag, digest, now), short=True)
        return None if record is None else self._decode([record])[0]

    # -- sessions ------------------------------------------------------------------------------------

    async def _list_sessions(self, tenant: str, limit: int, cursor: str | None) -> SessionPage:
        """One tenant's sessions, most recently updated first, ``limit`` per page (keyset pagination)."""
        digest = tenant_hash(tenant)
        params: tuple[Any, ...]
        if cursor is None:
            statement, params = self._sql.list_first, (digest, limit + 1)
        else:
            updated_at, row_id = _decode_cursor(cursor)
            statement, params = self._sql.list_after, (digest, updated_at, updated_at, row_id, limit + 1)
        rows = await self._call(partial(_sql.fetch, statement=statement, params=params))
        items = [
            SessionInfo(bytes(session_id).decode(), tenant, int(count), _time(created), _time(updated))
            for _, session_id, count, created, updated in rows[:limit]
        ]
        if len(rows) > limit:
            last = rows[limit - 1]
            return SessionPage(items, _encode_cursor(int(last[4]), int(last[0])))
        return SessionPage(items)

    async def _save_session(
        self, key: SessionKey, session: AgentSession, expected_version: str | None, owner: str | None
    ) -> str:
        """Store a whole-session document (version and owner checked in the same transaction)."""
        document = session_document(session)
        head, now, sql = self._head(key), self._stamp(), self._sql
        owner_bytes = None if owner is None else owner.encode()
        return await self._write(
            lambda conn, flag: _sql.save_document(
                conn, sql, flag, head, now, document, expected_version, owner_bytes, key.session_id
            )
        )

    async def _load_session(self, key: SessionKey) -> StoredSession | None:
        rows = await self._call(
            partial(_sql.fetch, statement=self._sql.doc_read, params=(key_hash(key.tenant, key.session_id),))
        )
        if not rows or rows[0][2] is None:
            return None
        row_id, doc_version, document, stored_owner = rows[0]
        session = AgentSession.from_dict(json.loads(document), tenant=key.tenant)
        owner = None if stored_owner is None else bytes(stored_owner).decode()
        return StoredSession(session, f"{row_id}.{doc_version}", owner)

    # -- retention -----------------------------------------------------------------------------------

    async def _prune(self, cutoff_at: datetime, tenant: str | None) -> int:
        """Delete sessions last updated before ``cutoff_at``; returns how many."""
        cutoff = _us(cutoff_at)
        sql = self._sql
        params: tuple[Any, ...]
        if tenant is None:
            select, params = sql.old_sessions, (cutoff,)
        else:
            select, params = sql.old_tenant_sessions, (tenant_hash(tenant), cutoff)
        return await self._call(lambda conn: _sql.delete_sessions(conn, sql, select, params, cutoff))

    async def _delete_tenant(self, tenant: str) -> int:
        """Delete every session of ``tenant``; returns how many."""
        sql = self._sql
        return await self._call(
            lambda conn: _sql.delete_sessions(conn, sql, sql.tenant_sessions, (tenant_hash(tenant),), None)
        )


def open_store(url: str = "sqlite://", **options: Any) -> SQLHistoryStore:
    """Open a SQL store by URL; no connection is made until the first call.

    URLs: ``sqlite://`` (``history.db`` in the user's data folder), ``sqlite:///relative.db``,
    ``sqlite:////absolute/path.db``, ``postgresql://user:pass@host/db`` (asyncpg; ``+psycopg`` also works),
    ``mysql://user:pass@host/db`` and ``mariadb://...`` (asyncmy). chatkeep's options may be given in the
    query or as keywords (``max_message_bytes``, ``schema``, ``busy_timeout``, ``connect_timeout``,
    ``statement_timeout``, ``pool_size``, ``max_overflow``, ``pool_recycle``, ``pool_pre_ping``); other query
    parameters go to the driver.

    Raises:
        SQLURLError: the URL or an option is malformed.
        MissingExtraError: the URL's driver is not installed; the message names the package.
    """
    return SQLHistoryStore(url, **options)


async def migrate(url: str = "sqlite://", **options: Any) -> str:
    """Create or upgrade chatkeep's schema in the database ``url`` names; returns the schema revision.

    Raises:
        SchemaVersionError: the database's schema is newer than this release.
        StoreUnavailableError: the database cannot be reached.
    """
    async with open_store(url, **options) as store:
        return await store.migrate()


class SQLHistoryProvider(BackendHistoryProvider):
    """A history provider keeping each session's messages in a SQL database.

    Takes the arguments every named provider takes: ``SQLHistoryProvider("sqlite:///app.db", max_messages=20)``
    (``None`` opens ``sqlite://``, the file in the user's data folder).
    """

    store_class = SQLHistoryStore
    default_url = "sqlite://"
