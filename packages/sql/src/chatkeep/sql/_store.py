"""The SQL history store: SQLite (the embedded default), PostgreSQL and MySQL/MariaDB."""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from chatkeep.core import (
    AgentSession,
    BackendHistoryProvider,
    Message,
    SessionInfo,
    SessionKey,
    SessionPage,
)
from chatkeep.core.backend import (
    Absent,
    ForkInfo,
    HistoryStore,
    PerLoop,
    SessionUsage,
    StoredSession,
    TelemetryTarget,
    checked,
    decode_cursor,
    decode_records,
    decode_session_document,
    encode_cursor,
    fork_source_error,
    fork_target_exists_error,
    session_document,
    stamp_time,
    time_stamp,
    usage_of,
    write_stamp,
)
from chatkeep.sql import _chain, _ops
from chatkeep.sql._config import SQLConfig, SQLURLError, parse_url, sqlite_pragmas
from chatkeep.sql._schema import key_hash, message_hash, tag_hash, tenant_hash
from chatkeep.sql._transport import Connection, Transport

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["SQLHistoryProvider", "SQLHistoryStore", "migrate", "open_store"]

T = TypeVar("T")


class SQLHistoryStore(HistoryStore):
    """A :class:`~chatkeep.core.HistoryStore` in a SQL database: SQLite, PostgreSQL, or MySQL/MariaDB.

    Open one with :func:`open_store` (``sqlite://``, ``postgresql://...``, ``mysql://...``), or hand it an
    ``AsyncEngine`` you already have. Nothing connects until the first call; the first call on an empty
    database creates chatkeep's tables. There is no native TTL: run :meth:`prune` as a scheduled job.

    Args:
        url: a store URL (see :func:`open_store`); ``None`` with no ``client`` opens ``sqlite://``.
        client: an existing SQLAlchemy ``AsyncEngine`` instead of a URL; the store uses its pool and leaves it
            open on close.
        **options: the URL's options as keywords: the fields of :class:`~chatkeep.sql._config.SQLSettings`
            (``max_message_bytes``, ``schema``, ``busy_timeout``, ``synchronous``, ``connect_timeout``,
            ``statement_timeout``, ``pool_size``, ``max_overflow``, ``pool_recycle``, ``pool_pre_ping``,
            ``transport``). With ``client``, only ``max_message_bytes``: the engine keeps its own settings.

    Raises:
        SQLURLError: the URL or an option is malformed or unknown, or both a URL and a client are given, or a
            ``client`` comes with an option its engine sets itself.
        MissingExtraError: the URL's driver is not installed.
    """

    creates_if_absent = True

    def __new__(cls, url: str | None = None, *, client: AsyncEngine | None = None, **options: Any) -> SQLHistoryStore:
        """A :class:`~chatkeep.sql._searchable.SearchableSQLHistoryStore` for a database that can search."""
        if cls is SQLHistoryStore and _can_search(url, client, options):
            from chatkeep.sql._searchable import SearchableSQLHistoryStore

            cls = SearchableSQLHistoryStore
        return super().__new__(cls)

    def __init__(self, url: str | None = None, *, client: AsyncEngine | None = None, **options: Any) -> None:
        if url is not None and client is not None:
            raise SQLURLError("give SQLHistoryStore a URL or a client= engine, not both")
        if client is not None:
            from chatkeep.sql._engine import EngineTransport

            engine_options = sorted(set(options) - {"max_message_bytes"})
            if engine_options:  # the engine's own pool, timeouts and schema apply: nothing would read these
                raise SQLURLError(
                    f"with client=, the engine you pass keeps its own settings: {', '.join(engine_options)} "
                    "would be ignored. Set them on the engine (create_async_engine(url, pool_size=..., "
                    "connect_args=...)) or pass a URL instead; only max_message_bytes is the store's own option"
                )
            config = parse_url("sqlite://", **options)  # only max_message_bytes is read from it
            transport: Transport[Any] = EngineTransport(client, owned=False)
        else:
            config = parse_url(url or "sqlite://", **options)
            transport = _open_transport(config)
        super().__init__(max_message_bytes=config.settings.max_message_bytes)
        self.config = config
        self._transport = transport
        self.serves_any_loop = transport.serves_any_loop
        self._sql = transport.statements
        self._ready = False
        # One first-use schema check at a time on each event loop (loops racing it is safe, as processes are).
        self._prepare_locks: PerLoop[asyncio.Lock] = PerLoop(asyncio.Lock, close=_nothing, abandon=_forget)
        self._records_read = 0

    # -- plumbing ------------------------------------------------------------------------------------

    @property
    def messages_read(self) -> int:
        """How many message rows this store has fetched (the conformance kit's read probe)."""
        return self._records_read

    @property
    def transport(self) -> str:
        """What runs the statements (option ``transport``): sqlite3, apsw, asyncpg, asyncmy or sqlalchemy."""
        return self._transport.name

    @property
    def dialect(self) -> str:
        """The database family: ``sqlite``, ``postgresql``, ``mysql`` or ``mariadb``."""
        return self._sql.family

    def _telemetry_target(self) -> TelemetryTarget:
        """The database family (``postgresql``, ``mysql``, ``mariadb``, ``sqlite``); a server's host and port."""
        return TelemetryTarget(self.dialect, self._transport.address, self._transport.port)

    async def missing_storage(self) -> str | None:
        """The SQLite file, when it does not exist (nothing is created); ``None`` for a server or an existing file.

        The read commands of ``chatkeep`` ask first (:class:`~chatkeep.core.backend.SupportsExistenceCheck`), so a
        misspelled path is reported instead of created empty and listed as holding no sessions.
        """
        path = self.config.sqlite_path
        if path is None or await asyncio.to_thread(os.path.exists, path):
            return None
        return f"the SQLite file {os.path.abspath(path)}"  # noqa: ASYNC240 - no I/O: the path as text

    def describe(self) -> dict[str, Any]:
        """What this store is, for logs and the CLI (no secrets)."""
        return {"type": type(self).__name__, "database": self._transport.description, "transport": self.transport}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._transport.description}{' closed' if self.closed else ''}>"

    def _one_loop_reason(self) -> str:
        return "it runs on the SQLAlchemy engine handed to it (client=), whose connections belong to one loop"

    async def _prepare(self) -> None:
        """Check (or create) the schema once: concurrent first calls wait for the first instead of racing it."""
        async with self._prepare_locks.get():
            if not self._ready:
                await self._transport.prepare()
                self._ready = True

    def _on_loop_change(self) -> None:
        self._transport.on_loop_change()

    async def _aclose(self) -> None:
        await self._transport.aclose()
        await self._prepare_locks.aclose()

    async def _run(self, op: Callable[[Connection], Awaitable[T]], *, write: bool = False) -> T:
        """Run ``op`` on a connection the transport lends; a ``write`` is final when a cancellation reaches us."""
        if not self._ready:
            await self._prepare()
        return await self._transport.run(op, write=write)

    async def _fetch(self, statement: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
        """The rows of one read statement (autocommit: one consistent snapshot)."""
        return await self._run(lambda conn: conn.fetch(statement, params))

    @checked
    async def migrate(self) -> str:
        """Create or upgrade chatkeep's tables to this release's schema; returns the revision (``chatkeep migrate``)."""
        revision = await self._transport.prepare(upgrade=True)
        self._ready = True
        return revision

    @checked
    async def schema_revision(self) -> str:
        """The schema revision of the database (created in an empty one, as a first call does); never migrates."""
        revision = await self._transport.prepare()
        self._ready = True
        return revision

    def _head(self, key: SessionKey) -> _ops.Head:
        return (
            key_hash(key.tenant, key.session_id),
            tenant_hash(key.tenant),
            key.tenant.encode(),
            key.session_id.encode(),
        )

    @staticmethod
    def _rows(messages: Sequence[Message], records: Sequence[str]) -> list[_ops.Row]:
        """What an append stores of each message: its id's hash, its record and its usage (``usage_of`` it)."""
        return [
            (message_hash(message.message_id), record, _ops.usage_text(usage_of([message])))
            for message, record in zip(messages, records, strict=True)
        ]

    def _decode(self, records: Sequence[str]) -> list[Message]:
        self._records_read += len(records)
        return decode_records(records)

    # -- messages ------------------------------------------------------------------------------------

    async def _append(self, key: SessionKey, messages: Sequence[Message], records: Sequence[str]) -> int:
        """Append atomically, skipping ids the session holds (a unique index on the id's hash); adds their usage."""
        rows = self._rows(messages, records)
        head, now, sql = self._head(key), write_stamp(), self._sql
        return await self._run(lambda conn: _ops.append(conn, sql, head, now, rows), write=True)

    async def _load(self, key: SessionKey, last: int | None) -> list[Message]:
        """The history in append order; with ``last=k`` only the k newest, reading only those rows."""
        digest = key_hash(key.tenant, key.session_id)
        if last is None:
            rows = await self._fetch(self._sql.load_all, (digest,))
            records = [row[0] for row in rows]
        else:
            rows = await self._fetch(self._sql.load_last, (digest, last))
            records = [row[0] for row in reversed(rows)]
        if not records:  # none, or a fork: its history is a chain of rows (``_chain``)
            records = await self._run(lambda conn: _chain.read_window(conn, self._sql, digest, last))
        return self._decode(records)

    async def _load_before(self, key: SessionKey, before: int, last: int | None) -> list[Message]:
        """The range ending before position ``before`` (:func:`_chain.read_range`), decoding only its rows.

        Cost: the session row, then one indexed read of the range with an offset from the nearer end (the server
        steps over the rows skipped, which are never sent or decoded); on a fork, a count of each stretch of its
        chain first, then a read of each stretch the range overlaps.
        """
        digest, sql = key_hash(key.tenant, key.session_id), self._sql
        records = await self._run(lambda conn: _chain.read_range(conn, sql, digest, before, last))
        return self._decode(records)

    async def _iter_messages(self, key: SessionKey, batch: int) -> AsyncIterator[Message]:
        """Iterate over the history in append order, ``batch`` rows per read (keyset pages on the sequence)."""
        digest = key_hash(key.tenant, key.session_id)
        rows = await self._fetch(self._sql.page_first, (digest, batch))
        if not rows:
            async for message in self._iter_chain(digest, batch):
                yield message
            return
        while rows:
            # Following pages name the session row: a session deleted (and re-created) meanwhile ends the iteration.
            session_ref, seq = rows[-1][0], rows[-1][1]
            for message in self._decode([row[2] for row in rows]):
                yield message
            if len(rows) < batch:
                return
            rows = await self._fetch(self._sql.page_next, (session_ref, seq, batch))

    async def _iter_chain(self, digest: bytes, batch: int) -> AsyncIterator[Message]:
        """Iterate over a fork's history, stretch by stretch of its chain (read again for each page)."""
        seq = -1
        while True:
            rows = await self._run(
                functools.partial(_chain.read_page, sql=self._sql, key=digest, after_seq=seq, batch=batch)
            )
            if not rows:
                return
            for message in self._decode([record for _, record in rows]):
                yield message
            seq = rows[-1][0]
            if len(rows) < batch:
                return

    async def _count(self, key: SessionKey) -> int:
        """How many messages the session holds (a counter kept with the session: no messages are read)."""
        rows = await self._fetch(self._sql.count, (key_hash(key.tenant, key.session_id),))
        return int(rows[0][0]) if rows else 0

    async def _delete(self, key: SessionKey) -> bool:
        """Delete the session's messages and document; ``True`` if anything was there."""
        digest, sql = key_hash(key.tenant, key.session_id), self._sql
        return await self._run(lambda conn: _ops.delete(conn, sql, digest))

    async def _trim(self, key: SessionKey, keep_last: int) -> int:
        """Delete all but the ``keep_last`` newest messages; returns how many were deleted."""
        head, now, sql = self._head(key), write_stamp(), self._sql
        return await self._run(lambda conn: _ops.trim(conn, sql, head, keep_last, now), write=True)

    async def _pop(self, key: SessionKey) -> Message | None:
        """Delete the newest message and return it, in one transaction holding the session row's lock."""
        head, now, sql = self._head(key), write_stamp(), self._sql
        record = await self._run(lambda conn: _ops.pop(conn, sql, head, now), write=True)
        return None if record is None else self._decode([record])[0]

    # -- sessions ------------------------------------------------------------------------------------

    async def _list_sessions(self, tenant: str, limit: int, cursor: str | None) -> SessionPage:
        """One tenant's sessions, most recently updated first, ``limit`` per page (keyset pagination)."""
        sql = self._sql
        return await self._page(tenant, (sql.list_first, sql.list_after), tenant_hash(tenant), limit, cursor)

    async def _session_info(self, key: SessionKey) -> SessionInfo | None:
        """The session's listing row, read by its key hash (one statement on the unique key index)."""
        rows = await self._fetch(self._sql.info_by_key, (key_hash(key.tenant, key.session_id),))
        return _session_info(key.tenant, rows[0]) if rows else None

    async def _list_tagged_sessions(self, tenant: str, tag: str, limit: int, cursor: str | None) -> SessionPage:
        """One tenant's sessions carrying ``tag``, newest first: the tag index names them, no other row is read."""
        sql = self._sql
        return await self._page(tenant, (sql.tagged_first, sql.tagged_after), tag_hash(tenant, tag), limit, cursor)

    async def _page(
        self, tenant: str, statements: tuple[str, str], digest: bytes, limit: int, cursor: str | None
    ) -> SessionPage:
        """One page of a listing (``statements``: its first page's and the following pages', keyed by ``digest``)."""
        params: tuple[Any, ...]
        if cursor is None:
            statement, params = statements[0], (digest, limit + 1)
        else:
            updated_at, row_id = decode_cursor(cursor, int, int)
            statement, params = statements[1], (digest, updated_at, updated_at, row_id, limit + 1)
        rows = await self._fetch(statement, params)
        items = [_session_info(tenant, row) for row in rows[:limit]]
        if len(rows) > limit:
            last = rows[limit - 1]
            return SessionPage(items, encode_cursor(int(last[4]), int(last[0])))
        return SessionPage(items)

    async def _fork(self, source: SessionKey, target: SessionKey, through: str | None) -> int:
        """Make ``target`` a row referring to ``source``'s (a cut in its chain), in one transaction: no copy."""
        source_digest, head, now, sql = (
            key_hash(source.tenant, source.session_id),
            self._head(target),
            write_stamp(),
            self._sql,
        )
        through_hash = None if through is None else message_hash(through)
        names = (source.session_id.encode(), None if through is None else through.encode())

        def message_id(record: str) -> str:
            return decode_records([record])[0].message_id

        try:
            taken = await self._run(
                lambda conn: _ops.fork(conn, sql, source_digest, head, through_hash, now, message_id, names),
                write=True,
            )
        except _ops.TargetExists:
            raise fork_target_exists_error(target) from None
        if taken is None:
            raise fork_source_error(source, through)
        return taken

    async def _usage(self, key: SessionKey) -> SessionUsage:
        """The usage kept with the session row by every write (no message is read)."""
        rows = await self._fetch(self._sql.usage, (key_hash(key.tenant, key.session_id),))
        return _usage(rows[0][0] if rows else None)

    async def _update_info(
        self, key: SessionKey, title: str | None, tags: frozenset[str] | None, metadata: dict[str, Any] | None
    ) -> bool:
        """Set the title, tags and metadata given, and the tag index's rows, in one transaction."""
        fields: dict[str, str | None] = {}
        if title is not None:
            fields["title"] = title or None
        if tags is not None:
            fields["tags"] = json.dumps(sorted(tags), ensure_ascii=False) if tags else None
        if metadata is not None:
            fields["metadata"] = json.dumps(metadata, ensure_ascii=False) if metadata else None
        hashes = None if tags is None else [tag_hash(key.tenant, tag) for tag in sorted(tags)]
        digest, now, sql = key_hash(key.tenant, key.session_id), write_stamp(), self._sql
        return await self._run(lambda conn: _ops.update_info(conn, sql, digest, now, fields, hashes), write=True)

    async def _save_session(
        self, key: SessionKey, session: AgentSession, expected_version: str | Absent | None, owner: str | None
    ) -> str:
        """Store a whole-session document (version, absence and owner checked in the same transaction)."""
        document = session_document(session)
        head, now, sql = self._head(key), write_stamp(), self._sql
        owner_bytes = None if owner is None else owner.encode()
        return await self._run(
            lambda conn: _ops.save_document(
                conn, sql, head, now, document, expected_version, owner_bytes, key.session_id
            ),
            write=True,
        )

    async def _load_session(self, key: SessionKey) -> StoredSession | None:
        rows = await self._fetch(self._sql.doc_read, (key_hash(key.tenant, key.session_id),))
        if not rows or rows[0][2] is None:
            return None
        row_id, doc_version, document, stored_owner = rows[0]
        owner = None if stored_owner is None else bytes(stored_owner).decode()
        return decode_session_document(key, document, f"{row_id}.{doc_version}", owner)

    # -- retention -----------------------------------------------------------------------------------

    async def _prune(self, cutoff_at: datetime, tenant: str | None) -> int:
        """Delete sessions last updated before ``cutoff_at``; returns how many."""
        cutoff = time_stamp(cutoff_at)
        sql = self._sql
        params: tuple[Any, ...]
        if tenant is None:
            select, params = sql.old_sessions, (cutoff, _chain.HIDDEN_TENANT)
        else:
            select, params = sql.old_tenant_sessions, (tenant_hash(tenant), cutoff)
        return await self._run(lambda conn: _ops.delete_sessions(conn, sql, select, params, cutoff))

    async def _list_tenants(self) -> list[str]:
        """Every tenant with a session row, in one statement over the tenant index."""
        return [bytes(tenant).decode() for (tenant,) in await self._fetch(self._sql.tenants, (_chain.HIDDEN_TENANT,))]

    async def _delete_tenant(self, tenant: str) -> int:
        """Delete every session of ``tenant``; returns how many."""
        sql = self._sql
        return await self._run(
            lambda conn: _ops.delete_sessions(conn, sql, sql.tenant_sessions, (tenant_hash(tenant),), None)
        )


def _usage(stored: str | None) -> SessionUsage:
    return SessionUsage() if stored is None else SessionUsage.from_dict(json.loads(stored))


def _session_info(tenant: str, row: Sequence[Any]) -> SessionInfo:
    """The :class:`SessionInfo` of a listing row (see ``Statements.list_first``)."""
    _, session_id, count, created, updated, used, title, tags, metadata, forked_from, through = row
    return SessionInfo(
        bytes(session_id).decode(),
        tenant,
        int(count),
        stamp_time(created),
        stamp_time(updated),
        usage=_usage(used),
        title=title,
        tags=frozenset(json.loads(tags)) if tags else frozenset(),
        metadata=json.loads(metadata) if metadata else {},
        forked_from=None if forked_from is None else ForkInfo(bytes(forked_from).decode(), bytes(through).decode()),
    )


def _can_search(url: str | None, client: AsyncEngine | None, options: dict[str, Any]) -> bool:
    """Whether a store of this URL (or engine) gets the search capability: PostgreSQL's (pgvector) and SQLite's on
    the apsw transport (sqlite-vec); the standard ``sqlite3`` module cannot load sqlite-vec."""
    if client is not None:
        return bool(client.dialect.name == "postgresql")
    try:
        config = parse_url(url or "sqlite://", **options)
    except SQLURLError:
        return False  # __init__ raises it
    return config.family == "postgresql" or config.transport == "apsw"


def _open_transport(config: SQLConfig) -> Transport[Any]:
    """The transport the parsed URL selects (``config.transport``), on a new engine for the server transports."""
    if config.transport in ("sqlite3", "apsw"):
        from chatkeep.sql._sqlite import SQLiteTransport

        sqlite_kind = SQLiteTransport
        if config.transport == "apsw":
            from chatkeep.sql._apsw import ApswTransport

            sqlite_kind = ApswTransport
        assert config.sqlite_path is not None
        return sqlite_kind(
            config.sqlite_path,
            busy_timeout=config.settings.busy_timeout,
            pool_size=config.settings.pool_size,
            pragmas=sqlite_pragmas(config.settings.synchronous, config.settings.mmap_size),
        )
    from chatkeep.sql._engine import EngineTransport, create_engine
    from chatkeep.sql._native import AsyncmyTransport, AsyncpgTransport

    natives: dict[str, type[EngineTransport[Any]]] = {"asyncpg": AsyncpgTransport, "asyncmy": AsyncmyTransport}
    kind = natives.get(config.transport, EngineTransport)
    settings = config.settings
    return kind(
        create_engine(config),
        owned=True,
        schema=settings.schema_,
        statement_timeout=settings.statement_timeout,
        make=lambda: create_engine(config),
        recycle=settings.pool_recycle,
        pre_ping=settings.pool_pre_ping,
    )


async def _nothing(_lock: asyncio.Lock) -> None:
    """A lock holds nothing to close."""


def _forget(_lock: asyncio.Lock) -> None:
    """A lock of a closed loop is simply dropped."""


def open_store(url: str = "sqlite://", **options: Any) -> SQLHistoryStore:
    """Open a SQL store by URL; no connection is made until the first call.

    URLs: ``sqlite://`` (``history.db`` in the user's data folder), ``sqlite:///relative.db``,
    ``sqlite:////absolute/path.db``, ``postgresql://user:pass@host/db`` (asyncpg; ``+psycopg`` also works),
    ``mysql://user:pass@host/db`` and ``mariadb://...`` (asyncmy). chatkeep's options may be given in the
    query or as keywords (``max_message_bytes``, ``schema``, ``busy_timeout``, ``connect_timeout``,
    ``statement_timeout``, ``pool_size``, ``max_overflow``, ``pool_recycle``, ``pool_pre_ping``, ``transport``);
    other query parameters go to the driver.

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
