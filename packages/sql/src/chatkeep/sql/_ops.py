"""The storage operations, written once for every transport: the statements of ``_sql`` run on a lent connection.

Each function takes a :class:`~chatkeep.sql._transport.Connection` in autocommit mode and the
:class:`~chatkeep.sql._sql.Statements` of its database. A write runs in its own transaction (or, on
PostgreSQL, a short append as one statement), run again on a deadlock, a serialization failure or a busy
database, with a growing, jittered pause; it commits only if the caller was not cancelled meanwhile.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

from chatkeep.core.backend import ABSENT, Absent, SessionUsage, conflict_error, owner_error, record_retry
from chatkeep.sql import _chain
from chatkeep.sql._errors import retryable, stale_snapshot
from chatkeep.sql._sql import Statements, pg_batch_rows
from chatkeep.sql._transport import Cancelled, Connection

__all__ = [
    "ATTEMPTS",
    "SHORT_ROWS",
    "Head",
    "Row",
    "TargetExists",
    "append",
    "append_params",
    "delete",
    "delete_sessions",
    "fork",
    "insert",
    "one_statement",
    "pop",
    "save_document",
    "transaction",
    "trim",
    "update_info",
    "usage_text",
]

T = TypeVar("T")
#: (key hash, tenant hash, tenant, session id): what a write needs to create a session's row.
Head = tuple[bytes, bytes, bytes, bytes]
#: (message hash, record, the message's usage as JSON or ``None``): one message an append stores.
Row = tuple[bytes, str, str | None]

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


def usage_text(used: SessionUsage) -> str | None:
    """How a usage is stored (JSON; ``None`` for none)."""
    return json.dumps(used.to_dict()) if used else None


def _usage(texts: Iterable[str | None]) -> SessionUsage:
    """The sum of stored usages (``None``: none)."""
    total = SessionUsage()
    for text in texts:
        if text is not None:
            total += SessionUsage.from_dict(json.loads(text))
    return total


async def _add_usage(conn: Connection, sql: Statements, session_ref: int, change: SessionUsage, sign: int) -> None:
    """Inside a transaction holding the session row's lock: add (``sign`` 1) or remove (-1) ``change``."""
    if not change:
        return
    current = _usage(row[0] for row in await conn.fetch(sql.session_usage, (session_ref,)))
    await conn.execute(sql.set_usage, (usage_text(current + change if sign > 0 else current - change), session_ref))


def _chunks(rows: Sequence[Row]) -> list[Sequence[Row]]:
    chunks: list[Sequence[Row]] = []
    start, chars = 0, 0
    for i, (_, record, _used) in enumerate(rows):
        if i > start and (i - start >= _ROWS_PER_INSERT or chars + len(record) > _CHARS_PER_INSERT):
            chunks.append(rows[start:i])
            start, chars = i, 0
        chars += len(record)
    chunks.append(rows[start:])
    return chunks


async def append(conn: Connection, sql: Statements, head: Head, now: int, rows: Sequence[Row]) -> int:
    """Append ``rows`` (message hash, record) to the session ``head`` names; returns how many were new.

    On PostgreSQL a short batch is one autocommitted statement (see ``_sql``), run again when it found its
    snapshot stale (a batch without usage contents: the statement keeps no usage); otherwise a transaction: the
    upsert of the session row reserving the sequence range under its lock, the idempotent inserts, the count
    corrected for messages already stored, and the usage of the new messages added.
    """
    n = len(rows)
    if sql.appends_in_one_statement and n <= SHORT_ROWS:
        statement = sql.pg_append(n, usage=any(used is not None for _, _, used in rows))
        appended = int((await one_statement(conn, statement, append_params(head, now, rows)))[0][0])
        if appended >= 0:
            return appended
        # -1: the session is a fork, whose inherited ids only the transaction below checks.

    async def body() -> int:
        inserted = await insert(conn, sql, head, now, rows)
        if inserted == 0:
            raise _NothingNew  # a retry of messages all stored: change nothing, not even updated_at
        return inserted

    try:
        return await transaction(conn, sql, body)
    except _NothingNew:
        return 0


def append_params(head: Head, now: int, rows: Sequence[Row], gate: Sequence[Any] = ()) -> list[Any]:
    """The parameters of PostgreSQL's one-statement append (``_sql.pg_append_ctes``) of ``rows``, with those of
    its ``gate`` condition, if any."""
    if pg_batch_rows(len(rows)) is None:
        batch: list[Any] = [list(column) for column in zip(*rows, strict=True)]
    else:
        batch = [value for row in rows for value in row]
    return [*batch, *gate, head[0], *head, now, now]


async def one_statement(conn: Connection, statement: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
    """Run a one-statement write (autocommitted), again when it found its snapshot stale or met a conflict."""

    async def attempt() -> Sequence[Sequence[Any]]:
        if conn.cancelled:
            raise Cancelled  # not sent yet: nothing to undo
        return await conn.fetch(statement, params)

    return await _retried(conn, attempt, lambda exc: stale_snapshot(exc) or retryable(exc))


async def insert(conn: Connection, sql: Statements, head: Head, now: int, rows: Sequence[Row]) -> int:
    """Inside a transaction: store ``rows`` in the session ``head`` names; how many were new.

    The upsert of the session row reserves the sequence range under its lock, the inserts skip messages already
    stored, the count is corrected for them, and the usage of the new messages is added to the session's: those
    stored in the reserved range (no other writer can store there) are the new ones.
    """
    n = len(rows)
    found = await conn.fetch(sql.upsert, (*head, now, now, n, n))
    if not found:  # the engine's upsert returns nothing (MySQL): read the reserved range back under the row's lock
        found = await conn.fetch(sql.session_after_upsert, (head[0],))
    session_ref, next_seq, base_ref = found[0]
    seq = next_seq - n
    if base_ref is not None:  # a fork: skip the ids its source's stretch of the chain holds (its own: the index)
        segments = (await _chain.chain(conn, sql, ref=session_ref))[1:]
        inherited = await _chain.held(conn, sql, segments, [row[0] for row in rows]) if segments else set()
        rows = [row for row in rows if row[0] not in inherited]
    inserted = 0
    for chunk in _chunks(rows) if rows else []:
        params: list[Any] = []
        for message_hash, record, used in chunk:
            params += (session_ref, seq, message_hash, record, used)
            seq += 1
        inserted += await conn.execute(sql.insert_messages(len(chunk)), params)
    if inserted < n:
        await conn.execute(sql.uncount, (n - inserted, session_ref))
    if any(used is not None for _, _, used in rows):
        if inserted == len(rows):
            added = _usage(used for _, _, used in rows)
        else:
            found = await conn.fetch(sql.inserted_usages, (session_ref, next_seq - n, next_seq))
            added = _usage(row[1] for row in found)
        await _add_usage(conn, sql, session_ref, added, 1)
    return inserted


async def _own_row(conn: Connection, sql: Statements, head: Head) -> tuple[int, int | None, int] | None:
    """Inside a transaction: lock the session's row; (row id, base row, message count), on a row of its own.

    A row that forks refer to never loses a message: the session is first moved onto a new row on top of it.
    """
    found = await conn.fetch(sql.head_for_update, (head[0],))
    if not found:
        return None
    session_ref, base_ref, forks, count, _ = found[0]
    if forks > 0:
        base_ref, session_ref = session_ref, await _chain.move(conn, sql, session_ref, head[0], head[1])
    return int(session_ref), base_ref, int(count)


async def trim(conn: Connection, sql: Statements, head: Head, keep_last: int, now: int) -> int:
    """Delete all but the ``keep_last`` newest messages of the session; returns how many were deleted.

    A trim that deletes is a write: like a pop, it moves the session's ``updated_at`` to ``now``. On a fork it
    raises the first sequence number the session shows, and deletes the rows of its own below it.
    """

    async def body() -> int:
        found = await _own_row(conn, sql, head)
        if found is None:
            return 0
        session_ref, base_ref, count = found
        if base_ref is None:
            boundary = await conn.fetch(sql.trim_boundary, (session_ref, keep_last))
            if not boundary:
                return 0
            last = boundary[0][0]
            used = _usage(row[0] for row in await conn.fetch(sql.trim_usages, (session_ref, last)))
            removed = await conn.execute(sql.trim_delete, (session_ref, last))
        else:
            if count <= keep_last:
                return 0
            segments = await _chain.chain(conn, sql, ref=session_ref)
            found_last = await _chain.boundary(conn, sql, segments, keep_last)
            if found_last is None:
                return 0
            used = _usage(await _chain.usages_through(conn, sql, segments, found_last))
            await conn.execute(sql.set_first_seq, (found_last + 1, session_ref))
            await conn.execute(sql.trim_delete, (session_ref, found_last))
            removed = count - keep_last
        if removed:
            await conn.execute(sql.remove_messages, (removed, now, session_ref))
            await _add_usage(conn, sql, session_ref, used, -1)
        return removed

    return await transaction(conn, sql, body)


async def pop(conn: Connection, sql: Statements, head: Head, now: int) -> str | None:
    """Delete the session's newest message and return its record (``None``: no messages), in one transaction.

    The session row's lock (``BEGIN IMMEDIATE`` on SQLite) orders it after appends, trims and other pops of
    the session, so two pops never read the same newest row. On a fork whose own rows are all popped, the
    newest is its source's: the cut is lowered below it instead.
    """

    async def body() -> str | None:
        found = await _own_row(conn, sql, head)
        if found is None:
            return None
        session_ref, base_ref, _ = found
        statement, returns = sql.pop
        if base_ref is not None:
            newest = await _chain.newest(conn, sql, await _chain.chain(conn, sql, ref=session_ref))
            if newest is None:
                return None
            holder, seq, record, used = newest
            if holder == session_ref:
                await conn.execute(sql.pop_remove, (session_ref, seq))
            else:
                await conn.execute(sql.set_base_cut, (seq, session_ref))
        elif not returns:
            newest_row = await conn.fetch(statement, (session_ref,))
            if not newest_row:
                return None
            await conn.execute(sql.pop_remove, (session_ref, newest_row[0][0]))
            record, used = newest_row[0][1], newest_row[0][2]
        else:
            deleted = await conn.fetch(statement, (session_ref,) if sql.mysql else (session_ref, session_ref))
            if not deleted:
                return None
            record, used = deleted[0][0], deleted[0][1]
        await conn.execute(sql.remove_messages, (1, now, session_ref))
        await _add_usage(conn, sql, session_ref, _usage([used]), -1)
        return str(record)

    return await transaction(conn, sql, body)


async def delete(conn: Connection, sql: Statements, key: bytes) -> bool:
    """Delete the session's row, or hide it when forks refer to it; ``True`` if it was there.

    A session that is no fork and has none is one statement; the others a transaction (``_chain.drop``).
    """
    if await conn.execute(sql.delete_plain, (key,)):
        return True

    async def body() -> bool:
        found = await conn.fetch(sql.row_by_key, (key,))
        return bool(found) and await _chain.drop(conn, sql, int(found[0][0]))

    return await transaction(conn, sql, body)


async def fork(
    conn: Connection,
    sql: Statements,
    source: bytes,
    target: Head,
    through: bytes | None,
    now: int,
    message_id: Callable[[str], str],
    names: tuple[bytes, bytes | None],
) -> int | None:
    """Make ``target`` a new session whose history is ``source``'s up to ``through`` (its newest: ``None``).

    Returns how many messages it holds; ``None`` when the source holds no such message. Raises
    :class:`_TargetExists` when ``target`` has a row. ``message_id`` reads a record's id (for the newest);
    ``names``: the source's session id and ``through`` as given (``None``: the newest's).
    """

    async def body() -> int | None:
        found = await conn.fetch(sql.head_for_update, (source,))
        if await conn.fetch(sql.row_by_key, (target[0],)):
            raise TargetExists
        if not found or not found[0][3]:
            return None
        source_ref, _, _, count, _ = found[0]
        segments = await _chain.chain(conn, sql, ref=int(source_ref))
        through_id = names[1]
        if through is None:
            newest = await _chain.newest(conn, sql, segments)
            if newest is None:
                return None
            seq, through_id = newest[1], message_id(newest[2]).encode()
        else:
            found_seq = await _chain.find(conn, sql, segments, through)
            if found_seq is None:
                return None
            seq = found_seq
        later, usages = await _chain.after(conn, sql, segments, seq + 1)
        current = _usage(row[0] for row in await conn.fetch(sql.session_usage, (source_ref,)))
        taken = int(count) - later
        used = usage_text(current - _usage(usages))
        await conn.execute(
            sql.fork_insert,
            (*target, now, now, seq + 1, taken, used, seq + 1, names[0], through_id, source_ref),
        )
        made = int((await conn.fetch(sql.row_by_key, (target[0],)))[0][0])
        await conn.execute(sql.add_forks, (1, source_ref))
        await conn.execute(sql.copy_tags, (made, source_ref))
        return taken

    return await transaction(conn, sql, body)


class TargetExists(Exception):
    """The fork's target session exists."""


async def save_document(
    conn: Connection,
    sql: Statements,
    head: Head,
    now: int,
    document: str,
    expected_version: str | Absent | None,
    owner: bytes | None,
    session_id: str,
) -> str:
    """Store a session document under optimistic concurrency and owner binding; returns the new version.

    A version is ``"<row id>.<counter>"``: the row id is never reused (a deleted and re-created session
    gets a new one), so a version from before a delete can never match again. On PostgreSQL a document written
    over a stored one is one statement (``Statements.doc_write_one``); the first document of a session (``ABSENT``
    always is, or fails), and a write the statement refuses (another version, another owner), take the
    transaction, which says why. Its row lock makes concurrent ``ABSENT`` creators take turns: one writes.
    """
    expected = _version_parts(expected_version) if isinstance(expected_version, str) else None
    if sql.doc_write_one and (expected_version is None or expected is not None):
        ref, counter = expected or (None, None)
        params = (document, owner, now, head[0], owner, owner, ref, ref, counter)
        found = await one_statement(conn, sql.doc_write_one, params)
        if found:
            return f"{found[0][0]}.{found[0][1]}"

    async def body() -> str:
        await conn.execute(sql.create_session, (*head, now, now))
        found = (await conn.fetch(sql.doc_for_update, (head[0],)))[0]
        session_ref, doc_version, has_document, stored_owner, doc_ref = found
        if owner is not None and stored_owner is not None and bytes(stored_owner) != owner:
            raise owner_error()
        current = f"{doc_ref}.{doc_version}" if has_document else None
        if expected_version is ABSENT and current is not None:
            raise conflict_error(session_id, ABSENT, exists=True)
        if isinstance(expected_version, str) and current != expected_version:
            raise conflict_error(session_id, expected_version, exists=current is not None)
        await conn.execute(sql.doc_write, (document, owner, now, session_ref))
        return f"{doc_ref}.{doc_version + 1}"

    return await transaction(conn, sql, body)


def _version_parts(version: str) -> tuple[int, int] | None:
    """``(row id, counter)`` of a version this store made; ``None`` for any other string (it matches no version)."""
    ref, _, counter = version.partition(".")
    if not (ref.isascii() and ref.isdigit() and counter.isascii() and counter.isdigit()):
        return None
    parts = int(ref), int(counter)
    return parts if f"{parts[0]}.{parts[1]}" == version and max(parts) < 2**63 else None


async def update_info(
    conn: Connection,
    sql: Statements,
    key: bytes,
    now: int,
    fields: dict[str, str | None],
    tags: Sequence[bytes] | None,
) -> bool:
    """Set a session's info (``fields``: title, tags, metadata as stored) and its tag index rows (``tags``: their
    hashes, ``None``: unchanged), as a write; ``False`` when there is no such session."""

    async def body() -> bool:
        found = await conn.fetch(sql.lock_session, (key,))
        if not found:
            return False
        session_ref = found[0][0]
        statement = sql.update_info(title="title" in fields, tags="tags" in fields, metadata="metadata" in fields)
        values = [fields[name] for name in ("title", "tags", "metadata") if name in fields]
        await conn.execute(statement, (*values, now, session_ref))
        if tags is not None:
            await conn.execute(sql.untag, (session_ref,))
            if tags:
                await conn.execute(sql.insert_tags(len(tags)), [p for tag in tags for p in (session_ref, tag)])
        return True

    return await transaction(conn, sql, body)


async def _drop_listed(conn: Connection, sql: Statements, select: str, params: Sequence[Any]) -> int:
    """Inside a transaction: delete (or hide) the rows ``select`` finds; how many."""
    return sum([await _chain.drop(conn, sql, int(row[0])) for row in await conn.fetch(select, params)])


async def delete_sessions(
    conn: Connection, sql: Statements, select: str, params: Sequence[Any], cutoff: int | None
) -> int:
    """Delete the sessions ``select`` finds, in batches (each batch its own statement); returns how many.

    Forks and sessions forks refer to are left by the batch's statement and deleted one by one after it, in a
    transaction (``_chain.drop``).
    """
    removed = 0
    older = cutoff is not None
    while True:
        ids = [row[0] for row in await conn.fetch(select, (*params, _DELETE_BATCH))]
        if not ids:
            return removed
        checks = (*ids, cutoff) if older else tuple(ids)
        removed += await conn.execute(sql.delete_ids(len(ids), older=older), checks)
        chained_ids = sql.chained_ids(len(ids), older=older)
        if await conn.fetch(chained_ids, checks):
            removed += await transaction(conn, sql, functools.partial(_drop_listed, conn, sql, chained_ids, checks))
        if len(ids) < _DELETE_BATCH:
            return removed
