"""The storage operations, written once for every transport: the statements of ``_sql`` run on a lent connection.

Each function takes a :class:`~chatkeep.sql._transport.Connection` in autocommit mode and the
:class:`~chatkeep.sql._sql.Statements` of its database. A write runs in its own transaction (or, on
PostgreSQL, a short append as one statement), run again on a deadlock, a serialization failure or a busy
database, with a growing, jittered pause; it commits only if the caller was not cancelled meanwhile.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from chatkeep.core.backend import conflict_error, owner_error, record_retry
from chatkeep.sql._errors import retryable, stale_snapshot
from chatkeep.sql._sql import Statements
from chatkeep.sql._transport import Cancelled, Connection

__all__ = [
    "ATTEMPTS",
    "SHORT_ROWS",
    "Head",
    "append",
    "append_params",
    "delete_sessions",
    "insert",
    "one_statement",
    "pop",
    "save_document",
    "transaction",
    "trim",
]

T = TypeVar("T")
#: (key hash, tenant hash, tenant, session id): what a write needs to create a session's row.
Head = tuple[bytes, bytes, bytes, bytes]

ATTEMPTS = 8
#: Appends of at most this many messages are one statement on PostgreSQL. Longer appends keep a transaction
#: whose COMMIT a cancellation can still prevent (a short statement already sent is over before it could matter).
SHORT_ROWS = 100
# Rows per INSERT statement, and record characters per statement (MySQL's max_allowed_packet is often 16 MB,
# and escaping can double a record's size on the wire).
_ROWS_PER_INSERT = 500
_CHARS_PER_INSERT = 4 * 1024 * 1024
#: Sessions deleted per statement by prune and delete_tenant.
_DELETE_BATCH = 500


class _NothingNew(Exception):
    """An append found every message already stored: roll back, touching nothing."""


async def _retried(
    conn: Connection, attempt: Callable[[], Awaitable[T]], may_retry: Callable[[BaseException], bool]
) -> T:
    """Run ``attempt`` until it succeeds, or fails in a way ``may_retry`` refuses, or ``ATTEMPTS`` are spent."""
    for n in range(ATTEMPTS):
        try:
            return await attempt()
        except BaseException as exc:
            if n + 1 == ATTEMPTS or conn.cancelled or not may_retry(exc):
                raise
        record_retry("conflict")
        await conn.pause(random.uniform(0.001, 0.01) * (n + 1))
    raise AssertionError("unreachable")


async def _rollback(conn: Connection) -> None:
    """``ROLLBACK``, unless the database already ended the transaction itself.

    SQLite rolls a transaction back on its own after some errors (a full disk, an I/O error): a ROLLBACK then
    fails with "no transaction is active" and would hide the error that matters.
    """
    try:
        await conn.execute("ROLLBACK")
    except Exception as exc:
        if "no transaction is active" not in str(exc).lower():
            raise


async def transaction(conn: Connection, sql: Statements, body: Callable[[], Awaitable[T]]) -> T:
    """Run ``body`` in a transaction, again on a deadlock; committed only if the caller was not cancelled."""

    async def attempt() -> T:
        await conn.execute(sql.begin)
        try:
            result = await body()
            if conn.cancelled:
                raise Cancelled
            await conn.execute("COMMIT")
            return result
        except BaseException:
            await _rollback(conn)
            raise

    return await _retried(conn, attempt, retryable)


def _chunks(rows: Sequence[tuple[bytes, str]]) -> list[Sequence[tuple[bytes, str]]]:
    chunks: list[Sequence[tuple[bytes, str]]] = []
    start, chars = 0, 0
    for i, (_, record) in enumerate(rows):
        if i > start and (i - start >= _ROWS_PER_INSERT or chars + len(record) > _CHARS_PER_INSERT):
            chunks.append(rows[start:i])
            start, chars = i, 0
        chars += len(record)
    chunks.append(rows[start:])
    return chunks


async def append(conn: Connection, sql: Statements, head: Head, now: int, rows: Sequence[tuple[bytes, str]]) -> int:
    """Append ``rows`` (message hash, record) to the session ``head`` names; returns how many were new.

    On PostgreSQL a short batch is one autocommitted statement (see ``_sql``), run again when it found its
    snapshot stale; otherwise a transaction: the upsert of the session row reserving the sequence range under
    its lock, the idempotent inserts, and the count corrected for messages already stored.
    """
    n = len(rows)
    if sql.append_one and n <= SHORT_ROWS:
        return int((await one_statement(conn, sql.append_one, append_params(head, now, rows)))[0][0])

    async def body() -> int:
        inserted = await insert(conn, sql, head, now, rows)
        if inserted == 0:
            raise _NothingNew  # a retry of messages all stored: change nothing, not even updated_at
        return inserted

    try:
        return await transaction(conn, sql, body)
    except _NothingNew:
        return 0


def append_params(head: Head, now: int, rows: Sequence[tuple[bytes, str]]) -> list[Any]:
    """The parameters of PostgreSQL's one-statement append (``_sql.pg_append_ctes``) of ``rows``."""
    hashes = [message_hash for message_hash, _ in rows]
    return [hashes, [record for _, record in rows], head[0], hashes, *head, now, now]


async def one_statement(conn: Connection, statement: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
    """Run a one-statement write (autocommitted), again when it found its snapshot stale or met a conflict."""

    async def attempt() -> Sequence[Sequence[Any]]:
        if conn.cancelled:
            raise Cancelled  # not sent yet: nothing to undo
        return await conn.fetch(statement, params)

    return await _retried(conn, attempt, lambda exc: stale_snapshot(exc) or retryable(exc))


async def insert(conn: Connection, sql: Statements, head: Head, now: int, rows: Sequence[tuple[bytes, str]]) -> int:
    """Inside a transaction: store ``rows`` (message hash, record) in the session ``head`` names; how many were new.

    The upsert of the session row reserves the sequence range under its lock, the inserts skip messages already
    stored, and the count is corrected for them.
    """
    n = len(rows)
    found = await conn.fetch(sql.upsert, (*head, now, now, n, n))
    if not sql.append_returns:  # the engine's upsert returns nothing: read the reserved range back
        found = await conn.fetch(sql.session_after_upsert, (head[0],))
    session_ref, next_seq = found[0]
    seq = next_seq - n
    inserted = 0
    for chunk in _chunks(rows):
        params: list[Any] = []
        for message_hash, record in chunk:
            params += (session_ref, seq, message_hash, record)
            seq += 1
        inserted += await conn.execute(sql.insert_messages(len(chunk)), params)
    if inserted < n:
        await conn.execute(sql.uncount, (n - inserted, session_ref))
    return inserted


async def trim(conn: Connection, sql: Statements, key: bytes, keep_last: int, now: int) -> int:
    """Delete all but the ``keep_last`` newest messages of the session; returns how many were deleted.

    A trim that deletes is a write: like a pop, it moves the session's ``updated_at`` to ``now``.
    """

    async def body() -> int:
        found = await conn.fetch(sql.lock_session, (key,))
        if not found:
            return 0
        session_ref = found[0][0]
        boundary = await conn.fetch(sql.trim_boundary, (session_ref, keep_last))
        if not boundary:
            return 0
        removed = await conn.execute(sql.trim_delete, (session_ref, boundary[0][0]))
        if removed:
            await conn.execute(sql.remove_messages, (removed, now, session_ref))
        return removed

    return await transaction(conn, sql, body)


async def pop(conn: Connection, sql: Statements, key: bytes, now: int) -> str | None:
    """Delete the session's newest message and return its record (``None``: no messages), in one transaction.

    The session row's lock (``BEGIN IMMEDIATE`` on SQLite) orders it after appends, trims and other pops of
    the session, so two pops never read the same newest row.
    """

    async def body() -> str | None:
        found = await conn.fetch(sql.lock_session, (key,))
        if not found:
            return None
        session_ref = found[0][0]
        if not sql.pop_returns:
            newest = await conn.fetch(sql.pop_delete, (session_ref,))
            if not newest:
                return None
            await conn.execute(sql.pop_remove, (session_ref, newest[0][0]))
            record = newest[0][1]
        else:
            deleted = await conn.fetch(sql.pop_delete, (session_ref,) if sql.mysql else (session_ref, session_ref))
            if not deleted:
                return None
            record = deleted[0][0]
        await conn.execute(sql.remove_messages, (1, now, session_ref))
        return str(record)

    return await transaction(conn, sql, body)


async def save_document(
    conn: Connection,
    sql: Statements,
    head: Head,
    now: int,
    document: str,
    expected_version: str | None,
    owner: bytes | None,
    session_id: str,
) -> str:
    """Store a session document under optimistic concurrency and owner binding; returns the new version.

    A version is ``"<row id>.<counter>"``: the row id is never reused (a deleted and re-created session
    gets a new one), so a version from before a delete can never match again.
    """

    async def body() -> str:
        await conn.execute(sql.create_session, (*head, now, now))
        session_ref, doc_version, has_document, stored_owner = (await conn.fetch(sql.doc_for_update, (head[0],)))[0]
        if owner is not None and stored_owner is not None and bytes(stored_owner) != owner:
            raise owner_error()
        current = f"{session_ref}.{doc_version}" if has_document else None
        if expected_version is not None and current != expected_version:
            raise conflict_error(session_id, expected_version, exists=current is not None)
        await conn.execute(sql.doc_write, (document, owner, now, session_ref))
        return f"{session_ref}.{doc_version + 1}"

    return await transaction(conn, sql, body)


async def delete_sessions(
    conn: Connection, sql: Statements, select: str, params: Sequence[Any], cutoff: int | None
) -> int:
    """Delete the sessions ``select`` finds, in batches (each batch its own statement); returns how many."""
    removed = 0
    while True:
        ids = [row[0] for row in await conn.fetch(select, (*params, _DELETE_BATCH))]
        if not ids:
            return removed
        if cutoff is None:
            removed += await conn.execute(sql.delete_ids(len(ids), older=False), ids)
        else:
            removed += await conn.execute(sql.delete_ids(len(ids), older=True), (*ids, cutoff))
        if len(ids) < _DELETE_BATCH:
            return removed
