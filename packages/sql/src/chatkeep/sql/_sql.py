"""The statements of every store call, written once per database family, run on a DBAPI connection.

Every function here is synchronous and takes a DBAPI connection in autocommit mode; a write opens its
own transaction with ``BEGIN`` (``BEGIN IMMEDIATE`` on SQLite) and ends it. The runners in ``_runner``
call them in a worker thread (SQLite's ``sqlite3``) or in SQLAlchemy's greenlet bridge (async drivers),
so one call costs one hop to the driver, and statements bypass SQLAlchemy's compiler (they are plain
SQL with the driver's parameter style, prepared and cached by the driver).

Why appends are contiguous and lose nothing, on each database:

* The first statement of an append is an upsert of the session row that adds the batch's size to
  ``next_seq`` and returns it; the rows take the sequence numbers just below. The upsert holds the
  session row's write lock until the transaction ends, so appends to one session run one after another
  and each reserves a range no other append can share.
* PostgreSQL: ``INSERT ... ON CONFLICT DO UPDATE`` locks the existing row, and after waiting for a
  concurrent writer it updates the newest committed version (READ COMMITTED), so ``next_seq`` is never
  read stale; two first appends to a new session are resolved by the unique index on ``key_hash``.
* MySQL/MariaDB (InnoDB, READ COMMITTED): ``INSERT ... ON DUPLICATE KEY UPDATE`` takes an exclusive lock on
  the row at once (no shared-then-exclusive upgrade, which would deadlock two writers), and the locked
  read that follows sees the newest version.
* SQLite: ``BEGIN IMMEDIATE`` takes the database's write lock before the first read, so no other writer
  (thread or process) runs between reading ``next_seq`` and committing.
* Retries are idempotent: ``message_hash`` is unique per session, so a message already stored is skipped
  (``ON CONFLICT DO NOTHING`` / ``INSERT IGNORE``), also against a concurrent writer still in flight (the
  unique index waits for it). ``message_count`` is corrected in the same transaction when rows were skipped.

PostgreSQL does the whole append in ONE autocommitted statement (see ``Statements.append_one`` and
:func:`append_one`): one round trip, no ``BEGIN``/``COMMIT``. Why it is still correct:

* Serialization: the statement's ``INSERT ... ON CONFLICT (key_hash) DO UPDATE`` of the session row locks
  that row; a concurrent appender to the same session blocks on the lock until our statement (its own
  transaction) commits, then updates the newest committed row version, so it reads the ``next_seq`` we
  left. Two first appends to a new session meet on the unique index of ``key_hash`` the same way.
* Contiguity: the range ``[next_seq, next_seq + c)`` is reserved under that lock and only the ``c`` new
  messages take numbers from it, in batch order; no other append can use a number in it.
* Idempotency and an exact ``message_count``: which messages are new is decided from the statement's
  snapshot (``old``), taken before the lock. If a concurrent writer committed one of our message ids after
  that snapshot (a retry racing its original), the insert skips it (``ON CONFLICT DO NOTHING``) and fewer
  rows are inserted than were counted; likewise the session row may have been deleted and re-created or
  changed since the snapshot that found old messages. The statement checks both at its end and, if so,
  fails with a division by zero (SQLSTATE 22012) so the whole statement rolls back; it is then run again
  with a fresh snapshot (:func:`append_one`). A batch whose messages are all stored changes nothing.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from chatkeep.core.backend import conflict_error, owner_error
from chatkeep.sql._schema import MESSAGES, SESSIONS

__all__ = ["Cancelled", "Cursor", "DBConnection", "Flag", "Statements"]

T = TypeVar("T")

# Rows per INSERT statement, and record characters per statement (MySQL's max_allowed_packet is often 16 MB,
# and escaping can double a record's size on the wire).
_ROWS_PER_INSERT = 500
_CHARS_PER_INSERT = 4 * 1024 * 1024
ATTEMPTS = _ATTEMPTS = 8


class Cursor(Protocol):
    """The part of a DBAPI cursor the statements use."""

    rowcount: int

    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Any: ...
    def fetchall(self) -> Sequence[Sequence[Any]]: ...


class DBConnection(Protocol):
    """The part of a DBAPI connection the statements use."""

    def cursor(self) -> Any: ...


class Flag:
    """Set by the event loop when the calling task is cancelled; a write checks it just before committing."""

    __slots__ = ("is_set",)

    def __init__(self) -> None:
        self.is_set = False


class Cancelled(Exception):
    """A write saw its task cancelled before it committed and rolled back."""


class _NothingNew(Exception):
    """An append found every message already stored: roll back, touching nothing."""


def _convert(sql: str, paramstyle: str) -> str:
    """Turn ``?`` placeholders into the driver's parameter style (the SQL here holds no literal ``?`` or ``%``)."""
    if paramstyle == "qmark":
        return sql
    if paramstyle in ("format", "pyformat"):
        return sql.replace("?", "%s")
    parts = sql.split("?")
    if paramstyle == "numeric_dollar":
        return "".join(p + (f"${n}" if n < len(parts) else "") for n, p in enumerate(parts, 1))
    if paramstyle == "numeric":
        return "".join(p + (f":{n}" if n < len(parts) else "") for n, p in enumerate(parts, 1))
    raise ValueError(f"chatkeep-sql does not support the driver parameter style {paramstyle!r}")


class Statements:
    """The SQL of every call for one database family and driver parameter style."""

    def __init__(self, family: str, paramstyle: str, *, is_mariadb: bool = False) -> None:
        self.family = family
        self.mysql = family in ("mysql", "mariadb")
        self.sqlite = family == "sqlite"
        self._paramstyle = paramstyle
        self._inserts: dict[int, str] = {}
        c = self._c
        greatest = "max" if self.sqlite else "GREATEST"
        lock = "" if self.sqlite else " FOR UPDATE"
        self.begin = "BEGIN IMMEDIATE" if self.sqlite else "BEGIN"
        self.lock = lock
        columns = "key_hash, tenant_hash, tenant, session_id, created_at, updated_at, next_seq, message_count"
        if self.mysql:
            upsert = (
                f"INSERT INTO {SESSIONS} ({columns}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE "
                "next_seq = next_seq + VALUES(next_seq), message_count = message_count + VALUES(message_count), "
                "updated_at = GREATEST(updated_at, VALUES(updated_at))"
            )
            # MariaDB returns the row from the upsert itself; MySQL needs a locked read (we hold the row's lock).
            self.append_returns = is_mariadb
            self.upsert = c(upsert + (" RETURNING id, next_seq" if is_mariadb else ""))
            self.session_after_upsert = c(f"SELECT id, next_seq FROM {SESSIONS} WHERE key_hash = ?{lock}")
            self.insert_ignore = "INSERT IGNORE INTO"
            self.conflict_nothing = ""
            self.create_session = c(
                f"INSERT INTO {SESSIONS} ({columns}) VALUES (?, ?, ?, ?, ?, ?, 0, 0) "
                "ON DUPLICATE KEY UPDATE doc_version = doc_version"  # an exclusive lock on an existing row at once
            )
        else:
            upsert = (
                f"INSERT INTO {SESSIONS} ({columns}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (key_hash) DO UPDATE "
                f"SET next_seq = {SESSIONS}.next_seq + excluded.next_seq, "
                f"message_count = {SESSIONS}.message_count + excluded.message_count, "
                f"updated_at = {greatest}({SESSIONS}.updated_at, excluded.updated_at) RETURNING id, next_seq"
            )
            self.append_returns = True
            self.upsert = c(upsert)
            self.session_after_upsert = ""
            self.insert_ignore = "INSERT INTO"
            self.conflict_nothing = " ON CONFLICT (session_ref, message_hash) DO NOTHING"
            self.create_session = c(
                f"INSERT INTO {SESSIONS} ({columns}) VALUES (?, ?, ?, ?, ?, ?, 0, 0) ON CONFLICT (key_hash) DO NOTHING"
            )
        # PostgreSQL: the whole append in one statement (data-modifying CTEs); see the module docstring.
        self.append_one = ""
        if family == "postgresql":
            self.append_one = c(
                "WITH batch AS (SELECT h, r, ord FROM unnest(?::bytea[], ?::text[]) WITH ORDINALITY AS b(h, r, ord)), "
                f"snap AS (SELECT id, next_seq FROM {SESSIONS} WHERE key_hash = ?), "
                f"old AS (SELECT m.message_hash FROM {MESSAGES} m JOIN snap ON m.session_ref = snap.id "
                "WHERE m.message_hash = ANY(?::bytea[])), "
                "fresh AS (SELECT h, r, row_number() OVER (ORDER BY ord) AS k FROM batch "
                "WHERE NOT EXISTS (SELECT 1 FROM old WHERE old.message_hash = batch.h)), "
                "n AS (SELECT count(*) AS c FROM fresh), "
                f"s AS (INSERT INTO {SESSIONS} ({columns}) SELECT ?, ?, ?, ?, ?, ?, c, c FROM n WHERE c > 0 "
                f"ON CONFLICT (key_hash) DO UPDATE SET next_seq = {SESSIONS}.next_seq + excluded.next_seq, "
                f"message_count = {SESSIONS}.message_count + excluded.message_count, "
                f"updated_at = GREATEST({SESSIONS}.updated_at, excluded.updated_at) RETURNING id, next_seq), "
                f"ins AS (INSERT INTO {MESSAGES} (session_ref, seq, message_hash, record) "
                "SELECT s.id, s.next_seq - n.c + fresh.k - 1, fresh.h, fresh.r FROM s, n, fresh "
                "ON CONFLICT (session_ref, message_hash) DO NOTHING RETURNING 1), "
                "done AS (SELECT count(*) AS i FROM ins) "
                # Divides by zero (rolling the statement back) when the snapshot was stale; see the docstring.
                "SELECT done.i / (CASE WHEN done.i = n.c AND (n.c = 0 OR NOT EXISTS (SELECT 1 FROM old) "
                "OR COALESCE((SELECT s.id = snap.id AND s.next_seq - n.c = snap.next_seq FROM s, snap), false)) "
                "THEN 1 ELSE 0 END) FROM done, n"
            )
        self.uncount = c(f"UPDATE {SESSIONS} SET message_count = message_count - ? WHERE id = ?")
        sub = f"(SELECT id FROM {SESSIONS} WHERE key_hash = ?)"
        self.load_all = c(f"SELECT record FROM {MESSAGES} WHERE session_ref = {sub} ORDER BY seq")
        self.load_last = c(f"SELECT record FROM {MESSAGES} WHERE session_ref = {sub} ORDER BY seq DESC LIMIT ?")
        self.page_first = c(
            f"SELECT session_ref, seq, record FROM {MESSAGES} WHERE session_ref = {sub} ORDER BY seq LIMIT ?"
        )
        self.page_next = c(
            f"SELECT session_ref, seq, record FROM {MESSAGES} WHERE session_ref = ? AND seq > ? ORDER BY seq LIMIT ?"
        )
        self.count = c(f"SELECT message_count FROM {SESSIONS} WHERE key_hash = ?")
        self.delete = c(f"DELETE FROM {SESSIONS} WHERE key_hash = ?")
        self.lock_session = c(f"SELECT id FROM {SESSIONS} WHERE key_hash = ?{lock}")
        self.trim_boundary = c(f"SELECT seq FROM {MESSAGES} WHERE session_ref = ? ORDER BY seq DESC LIMIT 1 OFFSET ?")
        self.trim_delete = c(f"DELETE FROM {MESSAGES} WHERE session_ref = ? AND seq <= ?")
        # pop: MySQL has no DELETE ... RETURNING, so it reads the newest row with a lock, then deletes it.
        self.pop_returns = not (self.mysql and not is_mariadb)
        if not self.pop_returns:
            self.pop_delete = c(
                f"SELECT seq, record FROM {MESSAGES} WHERE session_ref = ? ORDER BY seq DESC LIMIT 1{lock}"
            )
        elif self.mysql:  # MariaDB refuses a subquery on the table a DELETE changes, but takes ORDER BY ... LIMIT
            self.pop_delete = c(
                f"DELETE FROM {MESSAGES} WHERE session_ref = ? ORDER BY seq DESC LIMIT 1 RETURNING record"
            )
        else:
            self.pop_delete = c(
                f"DELETE FROM {MESSAGES} WHERE session_ref = ? AND seq = "
                f"(SELECT max(seq) FROM {MESSAGES} WHERE session_ref = ?) RETURNING record"
            )
        self.pop_remove = c(f"DELETE FROM {MESSAGES} WHERE session_ref = ? AND seq = ?")
        # pop and trim: fewer messages, and a write (it moves updated_at).
        self.remove_messages = c(
            f"UPDATE {SESSIONS} SET message_count = message_count - ?, "
            f"updated_at = {greatest}(updated_at, ?) WHERE id = ?"
        )
        listing = f"SELECT id, session_id, message_count, created_at, updated_at FROM {SESSIONS} WHERE tenant_hash = ?"
        order = " ORDER BY updated_at DESC, id DESC LIMIT ?"
        self.list_first = c(listing + order)
        self.list_after = c(listing + " AND (updated_at < ? OR (updated_at = ? AND id < ?))" + order)
        self.doc_for_update = c(
            f"SELECT id, doc_version, document IS NOT NULL, owner FROM {SESSIONS} WHERE key_hash = ?{lock}"
        )
        self.doc_write = c(
            f"UPDATE {SESSIONS} SET document = ?, doc_version = doc_version + 1, owner = COALESCE(?, owner), "
            f"updated_at = {greatest}(updated_at, ?) WHERE id = ?"
        )
        self.doc_read = c(f"SELECT id, doc_version, document, owner FROM {SESSIONS} WHERE key_hash = ?")
        self.old_sessions = c(f"SELECT id FROM {SESSIONS} WHERE updated_at < ? LIMIT ?")
        self.old_tenant_sessions = c(f"SELECT id FROM {SESSIONS} WHERE tenant_hash = ? AND updated_at < ? LIMIT ?")
        self.tenant_sessions = c(f"SELECT id FROM {SESSIONS} WHERE tenant_hash = ? LIMIT ?")

    def _c(self, sql: str) -> str:
        return _convert(sql, self._paramstyle)

    def insert_messages(self, rows: int) -> str:
        """A multi-row INSERT of ``rows`` messages that skips those already stored."""
        sql = self._inserts.get(rows)
        if sql is None:
            values = ", ".join(["(?, ?, ?, ?)"] * rows)
            sql = self._c(
                f"{self.insert_ignore} {MESSAGES} (session_ref, seq, message_hash, record) VALUES {values}"
                + self.conflict_nothing
            )
            self._inserts[rows] = sql
        return sql

    def delete_ids(self, ids: int, *, older: bool) -> str:
        """DELETE of sessions by id (re-checking the age when pruning, against a concurrent write)."""
        marks = ", ".join(["?"] * ids)
        return self._c(f"DELETE FROM {SESSIONS} WHERE id IN ({marks})" + (" AND updated_at < ?" if older else ""))


def _retryable(exc: BaseException) -> bool:
    """A deadlock, serialization failure, lock timeout or busy database: the transaction can be run again."""
    code = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    if code in ("40001", "40P01", "55P03"):
        return True
    args = getattr(exc, "args", ())
    if args and isinstance(args[0], int) and args[0] in (1213, 1205):  # MySQL deadlock, lock wait timeout
        return True
    text = str(exc).lower()
    return "database is locked" in text or "deadlock" in text


def _may_wait(conn: DBConnection) -> bool:
    """False on SQLite's inline connection (on the event loop): a busy database goes back to a worker thread."""
    return not getattr(conn, "no_wait", False)


def _rollback(cur: Any) -> None:
    """``ROLLBACK``, unless the database already ended the transaction itself.

    SQLite rolls a transaction back on its own after some errors (a full disk, an I/O error): a ROLLBACK then
    fails with "no transaction is active" and would hide the error that matters.
    """
    try:
        cur.execute("ROLLBACK")
    except Exception as exc:
        if "no transaction is active" not in str(exc).lower():
            raise


def transaction(conn: DBConnection, sql: Statements, cancel: Flag, body: Callable[[Any], T]) -> T:
    """Run ``body(cursor)`` in a transaction, retried on deadlocks; committed only if the caller was not cancelled."""
    for attempt in range(_ATTEMPTS):
        cur = conn.cursor()
        cur.execute(sql.begin)
        try:
            result = body(cur)
            if cancel.is_set:
                raise Cancelled
            cur.execute("COMMIT")
            return result
        except BaseException as exc:
            _rollback(cur)
            if attempt + 1 < _ATTEMPTS and _retryable(exc) and not cancel.is_set and _may_wait(conn):
                time.sleep(random.uniform(0.001, 0.01) * (attempt + 1))
                continue
            raise
    raise AssertionError("unreachable")


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


def append(
    conn: DBConnection,
    sql: Statements,
    cancel: Flag,
    head: tuple[bytes, bytes, bytes, bytes],
    now: int,
    rows: Sequence[tuple[bytes, str]],
) -> int:
    """Append ``rows`` (message hash, record) to the session ``head`` names; returns how many were new."""
    n = len(rows)

    def body(cur: Any) -> int:
        cur.execute(sql.upsert, (*head, now, now, n, n))
        if not sql.append_returns:  # the engine's upsert returns nothing: read the reserved range back
            cur.execute(sql.session_after_upsert, (head[0],))
        session_ref, next_seq = cur.fetchall()[0]
        seq = next_seq - n
        inserted = 0
        for chunk in _chunks(rows):
            params: list[Any] = []
            for message_hash, record in chunk:
                params += (session_ref, seq, message_hash, record)
                seq += 1
            cur.execute(sql.insert_messages(len(chunk)), params)
            inserted += cur.rowcount
        if inserted == 0:
            raise _NothingNew  # a retry of messages all stored: change nothing, not even updated_at
        if inserted < n:
            cur.execute(sql.uncount, (n - inserted, session_ref))
        return int(inserted)

    try:
        return transaction(conn, sql, cancel, body)
    except _NothingNew:
        return 0


def append_one_params(
    head: tuple[bytes, bytes, bytes, bytes], now: int, rows: Sequence[tuple[bytes, str]]
) -> tuple[Any, ...]:
    """The parameters of ``Statements.append_one``."""
    hashes = [message_hash for message_hash, _ in rows]
    return (hashes, [record for _, record in rows], head[0], hashes, *head, now, now)


def append_one_retryable(exc: BaseException) -> bool:
    """The one-statement append rolled back and may run again: a stale snapshot (22012, on purpose) or a deadlock."""
    code = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    return code == "22012" or _retryable(exc)


def append_one(
    conn: DBConnection,
    sql: Statements,
    cancel: Flag,
    head: tuple[bytes, bytes, bytes, bytes],
    now: int,
    rows: Sequence[tuple[bytes, str]],
) -> int:
    """PostgreSQL: append ``rows`` in one autocommitted statement (see the module docstring); returns how many were new.

    Run again when the statement found its snapshot stale (SQLSTATE 22012, raised on purpose) or hit a
    deadlock; it rolled back as a whole each time, so a retry is safe.
    """
    params = append_one_params(head, now, rows)
    for attempt in range(_ATTEMPTS):
        if cancel.is_set:
            raise Cancelled  # not sent yet: nothing to undo
        cur = conn.cursor()
        try:
            cur.execute(sql.append_one, params)
            return int(cur.fetchall()[0][0])
        except Exception as exc:
            if attempt + 1 < _ATTEMPTS and append_one_retryable(exc) and not cancel.is_set:
                time.sleep(random.uniform(0.0, 0.002) * attempt)
                continue
            raise
    raise AssertionError("unreachable")


async def append_native(
    call: Any,
    sql: Statements,
    cancel: Flag,
    head: tuple[bytes, bytes, bytes, bytes],
    now: int,
    rows: Sequence[tuple[bytes, str]],
) -> int:
    """:func:`append` (the same statements and locking) on the driver's own async API (a ``NativeCall``).

    MySQL/MariaDB: ``BEGIN``, the upsert that locks the session row and returns the reserved range, the
    idempotent insert, ``COMMIT``: four round trips; MySQL's protocol has no way to send them as one
    without multi-statements, which chatkeep does not enable.
    """
    n = len(rows)
    for attempt in range(_ATTEMPTS):
        await call.fetch(sql.begin, ())
        try:
            found, _ = await call.fetch(sql.upsert, (*head, now, now, n, n))
            if not sql.append_returns:
                found, _ = await call.fetch(sql.session_after_upsert, (head[0],))
            session_ref, next_seq = found[0]
            seq = next_seq - n
            inserted = 0
            for chunk in _chunks(rows):
                params: list[Any] = []
                for message_hash, record in chunk:
                    params += (session_ref, seq, message_hash, record)
                    seq += 1
                inserted += (await call.fetch(sql.insert_messages(len(chunk)), params))[1]
            if inserted == 0:
                await call.fetch("ROLLBACK", ())  # a retry of messages all stored: change nothing
                return 0
            if inserted < n:
                await call.fetch(sql.uncount, (n - inserted, session_ref))
            if cancel.is_set:
                raise Cancelled
            await call.fetch("COMMIT", ())
            return inserted
        except BaseException as exc:
            await call.fetch("ROLLBACK", ())
            if attempt + 1 < _ATTEMPTS and _retryable(exc) and not cancel.is_set:
                await asyncio.sleep(random.uniform(0.001, 0.01) * (attempt + 1))
                continue
            raise
    raise AssertionError("unreachable")


def fetch(conn: DBConnection, statement: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
    """Run one read statement (autocommit: one consistent snapshot) and return its rows."""
    cur = conn.cursor()
    cur.execute(statement, params)
    return cur.fetchall()  # type: ignore[no-any-return]


def execute(conn: DBConnection, statement: str, params: Sequence[Any]) -> int:
    """Run one write statement on its own (autocommit makes it atomic) and return the rows it changed."""
    cur = conn.cursor()
    cur.execute(statement, params)
    return int(cur.rowcount)


def trim(conn: DBConnection, sql: Statements, cancel: Flag, key: bytes, keep_last: int, now: int) -> int:
    """Delete all but the ``keep_last`` newest messages of the session; returns how many were deleted.

    A trim that deletes is a write: like a pop, it moves the session's ``updated_at`` to ``now``.
    """

    def body(cur: Any) -> int:
        cur.execute(sql.lock_session, (key,))
        found = cur.fetchall()
        if not found:
            return 0
        session_ref = found[0][0]
        cur.execute(sql.trim_boundary, (session_ref, keep_last))
        boundary = cur.fetchall()
        if not boundary:
            return 0
        cur.execute(sql.trim_delete, (session_ref, boundary[0][0]))
        removed = int(cur.rowcount)
        if removed:
            cur.execute(sql.remove_messages, (removed, now, session_ref))
        return removed

    return transaction(conn, sql, cancel, body)


def pop(conn: DBConnection, sql: Statements, cancel: Flag, key: bytes, now: int) -> str | None:
    """Delete the session's newest message and return its record (``None``: no messages), in one transaction.

    The session row's lock (``BEGIN IMMEDIATE`` on SQLite) orders it after appends, trims and other pops of
    the session, so two pops never read the same newest row.
    """

    def body(cur: Any) -> str | None:
        cur.execute(sql.lock_session, (key,))
        found = cur.fetchall()
        if not found:
            return None
        session_ref = found[0][0]
        if not sql.pop_returns:
            cur.execute(sql.pop_delete, (session_ref,))
            newest = cur.fetchall()
            if not newest:
                return None
            cur.execute(sql.pop_remove, (session_ref, newest[0][0]))
            record = newest[0][1]
        else:
            cur.execute(sql.pop_delete, (session_ref,) if sql.mysql else (session_ref, session_ref))
            deleted = cur.fetchall()
            if not deleted:
                return None
            record = deleted[0][0]
        cur.execute(sql.remove_messages, (1, now, session_ref))
        return str(record)

    return transaction(conn, sql, cancel, body)


def save_document(
    conn: DBConnection,
    sql: Statements,
    cancel: Flag,
    head: tuple[bytes, bytes, bytes, bytes],
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

    def body(cur: Any) -> str:
        cur.execute(sql.create_session, (*head, now, now))
        cur.execute(sql.doc_for_update, (head[0],))
        session_ref, doc_version, has_document, stored_owner = cur.fetchall()[0]
        if owner is not None and stored_owner is not None and bytes(stored_owner) != owner:
            raise owner_error()
        current = f"{session_ref}.{doc_version}" if has_document else None
        if expected_version is not None and current != expected_version:
            raise conflict_error(session_id, expected_version, exists=current is not None)
        cur.execute(sql.doc_write, (document, owner, now, session_ref))
        return f"{session_ref}.{doc_version + 1}"

    return transaction(conn, sql, cancel, body)


def delete_sessions(conn: DBConnection, sql: Statements, select: str, params: Sequence[Any], cutoff: int | None) -> int:
    """Delete the sessions ``select`` finds, in batches of 500 (each batch its own statement); returns how many."""
    removed = 0
    while True:
        ids = [row[0] for row in fetch(conn, select, (*params, 500))]
        if not ids:
            return removed
        if cutoff is None:
            removed += execute(conn, sql.delete_ids(len(ids), older=False), ids)
        else:
            removed += execute(conn, sql.delete_ids(len(ids), older=True), (*ids, cutoff))
        if len(ids) < 500:
            return removed
