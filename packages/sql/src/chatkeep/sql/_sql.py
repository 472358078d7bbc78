"""The SQL of every store call, written once per database family in the driver's parameter style.

The operations in ``_ops`` run these statements on a transport's connection in autocommit mode; a write
opens its own transaction with ``BEGIN`` (``BEGIN IMMEDIATE`` on SQLite) and ends it. Statements bypass
SQLAlchemy's compiler: they are plain SQL, prepared and cached by the driver.

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
  read that follows sees the newest version. It names the inserted row's values with a row alias
  (``VALUES (...) AS incoming``) on MySQL 8.0.19 and later, where ``VALUES()`` is deprecated (8.0.20 warns on
  every statement), and with ``VALUES()`` on MariaDB, which has no row alias, and before the server's version
  is known (:meth:`Statements.use_server`, at the first connection).
* SQLite: ``BEGIN IMMEDIATE`` takes the database's write lock before the first read, so no other writer
  (thread or process) runs between reading ``next_seq`` and committing.
* Retries are idempotent: ``message_hash`` is unique per session, so a message already stored is skipped
  (``ON CONFLICT DO NOTHING`` / ``INSERT IGNORE``), also against a concurrent writer still in flight (the
  unique index waits for it). ``message_count`` is corrected in the same transaction when rows were skipped.

PostgreSQL does the whole append in ONE autocommitted statement (``Statements.pg_append``, run by
``_ops.append``; the form for a batch without usage leaves the session's usage as it is): one round trip, no
``BEGIN``/``COMMIT``. A batch of at most :data:`PG_VALUES_ROWS` messages is given as a ``VALUES`` list of that
many rows, so the statement has one plan whatever the values: the server plans it once per connection (a
generic plan) instead of at every run, which is about 0.3 ms of an append's 0.8 ms. (An array's length is not
known to a generic plan, which so looks costlier than one planned for the values at hand, and the server would
re-plan it every time.) A longer batch is given as arrays. Why it is still correct:

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
  with a fresh snapshot (``_ops.append``). A batch whose messages are all stored changes nothing.
"""

from __future__ import annotations

from chatkeep.sql._schema import MESSAGES, SESSIONS, TAGS

__all__ = [
    "CHAIN_END",
    "MYSQL_ROW_ALIAS",
    "PG_APPEND_CHECKED",
    "PG_VALUES_ROWS",
    "Statements",
    "mysql_upsert",
    "pg_append_ctes",
    "pg_batch_rows",
    "pg_usage_sum",
]

#: The first MySQL release that takes a row alias in ``INSERT`` (8.0.20 deprecates ``VALUES()`` for it).
MYSQL_ROW_ALIAS = (8, 0, 19)
#: The first MariaDB release whose ``INSERT`` takes ``RETURNING``.
MARIADB_INSERT_RETURNING = (10, 5, 0)
_COLUMNS = "key_hash, tenant_hash, tenant, session_id, created_at, updated_at, next_seq, message_count"


def mysql_upsert(*, row_alias: bool) -> str:
    """MySQL/MariaDB's upsert of a session row, adding the batch to ``next_seq`` and ``message_count``.

    ``row_alias``: name the inserted values ``incoming.column`` (MySQL 8.0.19+), else ``VALUES(column)``
    (MariaDB, older MySQL). Unqualified names are the stored row's columns in both.
    """

    def inserted(column: str) -> str:
        return f"incoming.{column}" if row_alias else f"VALUES({column})"

    return (
        f"INSERT INTO {SESSIONS} ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        + (" AS incoming" if row_alias else "")
        + f" ON DUPLICATE KEY UPDATE next_seq = next_seq + {inserted('next_seq')}, "
        f"message_count = message_count + {inserted('message_count')}, "
        f"updated_at = GREATEST(updated_at, {inserted('updated_at')})"
    )


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


#: The count of new messages of :func:`pg_append_ctes`, divided by zero (rolling the statement back) when the
#: snapshot was stale (see the module docstring); -1 when the session is a fork: nothing was stored, and the
#: transaction's way appends (it checks the ids the fork inherited).
PG_APPEND_CHECKED = (
    "CASE WHEN EXISTS (SELECT 1 FROM snap WHERE snap.base_ref IS NOT NULL) THEN -1 "
    "ELSE done.i / (CASE WHEN done.i = n.c AND (n.c = 0 OR NOT EXISTS (SELECT 1 FROM old) "
    "OR COALESCE((SELECT s.id = snap.id AND s.next_seq - n.c = snap.next_seq FROM s, snap), false)) "
    "THEN 1 ELSE 0 END) END"
)


def pg_usage_sum(texts: str) -> str:
    """SQL: the sum of the usage JSON texts (``SessionUsage.to_dict``'s form) that query ``texts`` yields as ``u``.

    ``NULL`` when none of them is a usage, as ``_ops.usage_text`` stores no usage. Per-model counts are summed by
    model name. It lets PostgreSQL's one-statement append keep a session's usage in the same statement.
    """
    total = ", ".join(f"'{name}', sum((j->>'{name}')::bigint)" for name in _USAGE_TOTALS)
    counts = ", ".join(f"sum((m.value->>{n})::bigint) AS c{n}" for n in range(4))
    return (
        f"(SELECT CASE WHEN count(*) = 0 THEN NULL ELSE jsonb_build_object({total}, 'models', COALESCE(("
        "SELECT jsonb_object_agg(k, jsonb_build_array(c0, c1, c2, c3)) FROM ("
        f"SELECT m.key AS k, {counts} FROM ({texts}) AS mu, jsonb_each(mu.u::jsonb->'models') AS m "
        "WHERE mu.u IS NOT NULL GROUP BY m.key) AS per_model), '{}'::jsonb))::text END "
        f"FROM (SELECT u::jsonb AS j FROM ({texts}) AS tu WHERE u IS NOT NULL) AS used)"
    )


#: The end of the newest stretch of a history (``_chain``): above any sequence number.
CHAIN_END = 2**62

#: The totals of a stored usage (``SessionUsage.to_dict``), beside its per-model counts.
_USAGE_TOTALS = ("input_tokens", "output_tokens", "total_tokens", "calls")


#: The longest batch :func:`pg_append_ctes` takes as a ``VALUES`` list (one statement per length) rather than arrays.
PG_VALUES_ROWS = 8


def pg_append_ctes(*, rows: int | None = None, first: str = "", gate: str = "", usage: bool = True) -> str:
    """PostgreSQL's append as data-modifying CTEs (``WITH ... done``), in ``?`` style; see the module docstring.

    Parameters (as ``_ops.append_params`` lists them): the batch, then ``gate``'s, then the session's key hash,
    its row's head (key hash, tenant hash, tenant, session id) and the time twice. The batch is ``rows``
    messages' hash, record and usage (JSON text or ``NULL``, as ``_ops.usage_text`` makes them) each, in a
    ``VALUES`` list; without ``rows``, three arrays (the hashes, the records, the usages). ``first``: CTEs to put
    before them (with their trailing comma); ``gate``: a condition the batch must meet to be stored at all.
    ``old`` holds the session's stored messages of the batch (``message_hash, session_ref, seq``), ``ins`` the
    new ones. The session's usage grows by the new messages' (those of ``fresh``: the statement stores all of
    them or, rolled back by ``PG_APPEND_CHECKED``, none). ``usage=False``: for a batch that carries no usage
    (the same parameters): the session's usage is left as it is, without the two sums (about a tenth of the
    statement's time on the server).
    """
    new_usage = pg_usage_sum("SELECT u FROM fresh") if usage else "NULL"
    kept_usage = (
        f", token_usage = {pg_usage_sum(f'SELECT {SESSIONS}.token_usage AS u UNION ALL SELECT u FROM fresh')} "
        if usage
        else " "
    )
    if rows is None:
        source = "unnest(?::bytea[], ?::text[], ?::text[]) WITH ORDINALITY AS b(h, r, u, ord)"
    else:
        values = ", ".join(f"(?::bytea, ?::text, ?::text, {n})" for n in range(1, rows + 1))
        source = f"(VALUES {values}) AS b(h, r, u, ord)"
    return (
        f"WITH {first}batch AS (SELECT h, r, u, ord FROM {source}" + (f" WHERE {gate}" if gate else "") + "), "
        f"snap AS (SELECT id, next_seq, base_ref FROM {SESSIONS} WHERE key_hash = ?), "
        f"old AS (SELECT m.message_hash, m.session_ref, m.seq FROM {MESSAGES} m JOIN snap ON m.session_ref = snap.id "
        "WHERE m.message_hash IN (SELECT h FROM batch)), "
        # A fork stores nothing here: its inherited ids are checked by the transaction (see PG_APPEND_CHECKED).
        "fresh AS (SELECT h, r, u, row_number() OVER (ORDER BY ord) AS k FROM batch "
        "WHERE NOT EXISTS (SELECT 1 FROM old WHERE old.message_hash = batch.h) "
        "AND NOT EXISTS (SELECT 1 FROM snap WHERE snap.base_ref IS NOT NULL)), "
        "n AS (SELECT count(*) AS c FROM fresh), "
        f"s AS (INSERT INTO {SESSIONS} ({_COLUMNS}, token_usage) "
        f"SELECT ?, ?, ?, ?, ?, ?, c, c, {new_usage} FROM n WHERE c > 0 "
        f"ON CONFLICT (key_hash) DO UPDATE SET next_seq = {SESSIONS}.next_seq + excluded.next_seq, "
        f"message_count = {SESSIONS}.message_count + excluded.message_count, "
        f"updated_at = GREATEST({SESSIONS}.updated_at, excluded.updated_at){kept_usage}"
        "RETURNING id, next_seq), "
        f"ins AS (INSERT INTO {MESSAGES} (session_ref, seq, message_hash, record, token_usage) "
        "SELECT s.id, s.next_seq - n.c + fresh.k - 1, fresh.h, fresh.r, fresh.u FROM s, n, fresh "
        "ON CONFLICT (session_ref, message_hash) DO NOTHING RETURNING session_ref, seq, message_hash), "
        "done AS (SELECT count(*) AS i FROM ins)"
    )


def pg_batch_rows(count: int) -> int | None:
    """How :func:`pg_append_ctes` takes a batch of ``count`` messages: ``rows`` for a ``VALUES`` list, or None."""
    return count if count <= PG_VALUES_ROWS else None


class Statements:
    """The SQL of every call for one database family and driver parameter style."""

    #: The upsert of a session's row reserving an append's range; it returns the range unless the server cannot.
    upsert: str
    #: pop's statement, and whether it deletes the newest row returning its record (else it reads it, locked).
    pop: tuple[str, bool]

    def __init__(
        self,
        family: str,
        paramstyle: str,
        *,
        is_mariadb: bool = False,
        found_rows: bool = True,
        server_version: tuple[object, ...] | None = None,
    ) -> None:
        """``server_version``: the server's, when known (else :meth:`use_server` gives it later).

        ``found_rows``: MySQL/MariaDB connections report rows matched, not changed (``CLIENT_FOUND_ROWS``, which
        SQLAlchemy's dialects always set): an append then skips stored messages with ``INSERT IGNORE``, whose
        count does not depend on it, but which makes the server raise one warning per skipped message (the
        drivers fetch them with ``SHOW WARNINGS`` and log each). Without the flag (the engines chatkeep makes),
        ``ON DUPLICATE KEY UPDATE`` with a no-op counts exactly and raises no warning."""
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
        columns = _COLUMNS
        self.row_alias = False
        if self.mysql:
            # MariaDB returns the row from the upsert itself; MySQL needs a locked read (we hold the row's lock).
            self.use_server(is_mariadb=is_mariadb, version=server_version)
            self.session_after_upsert = c(f"SELECT id, next_seq, base_ref FROM {SESSIONS} WHERE key_hash = ?{lock}")
            self.insert_ignore = "INSERT IGNORE INTO" if found_rows else "INSERT INTO"
            self.conflict_nothing = "" if found_rows else " ON DUPLICATE KEY UPDATE message_hash = message_hash"
            self.create_session = c(
                f"INSERT INTO {SESSIONS} ({columns}) VALUES (?, ?, ?, ?, ?, ?, 0, 0) "
                "ON DUPLICATE KEY UPDATE doc_version = doc_version"  # an exclusive lock on an existing row at once
            )
        else:
            upsert = (
                f"INSERT INTO {SESSIONS} ({columns}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (key_hash) DO UPDATE "
                f"SET next_seq = {SESSIONS}.next_seq + excluded.next_seq, "
                f"message_count = {SESSIONS}.message_count + excluded.message_count, "
                f"updated_at = {greatest}({SESSIONS}.updated_at, excluded.updated_at) RETURNING id, next_seq, base_ref"
            )
            self.upsert = c(upsert)
            self.session_after_upsert = ""
            self.insert_ignore = "INSERT INTO"
            self.conflict_nothing = " ON CONFLICT (session_ref, message_hash) DO NOTHING"
            self.create_session = c(
                f"INSERT INTO {SESSIONS} ({columns}) VALUES (?, ?, ?, ?, ?, ?, 0, 0) ON CONFLICT (key_hash) DO NOTHING"
            )
        # PostgreSQL: the whole append in one statement (data-modifying CTEs); see the module docstring.
        self._pg_appends: dict[tuple[int | None, bool], str] = {}
        self.uncount = c(f"UPDATE {SESSIONS} SET message_count = message_count - ? WHERE id = ?")
        # The reads by key read a session that is not a fork (a fork's history is a chain: see ``_chain``).
        sub = f"(SELECT id FROM {SESSIONS} WHERE key_hash = ? AND base_ref IS NULL)"
        self.load_all = c(f"SELECT record FROM {MESSAGES} WHERE session_ref = {sub} ORDER BY seq")
        self.load_last = c(f"SELECT record FROM {MESSAGES} WHERE session_ref = {sub} ORDER BY seq DESC LIMIT ?")
        self.page_first = c(
            f"SELECT session_ref, seq, record FROM {MESSAGES} WHERE session_ref = {sub} ORDER BY seq LIMIT ?"
        )
        self.page_next = c(
            f"SELECT session_ref, seq, record FROM {MESSAGES} WHERE session_ref = ? AND seq > ? ORDER BY seq LIMIT ?"
        )
        self.count = c(f"SELECT message_count FROM {SESSIONS} WHERE key_hash = ?")
        # A range by position (``_chain.read_range``): the session row's count and end, then an offset from the
        # nearer end of its messages (positions are not sequence numbers: a pop or a retried append leaves gaps).
        self.range_head = c(f"SELECT id, base_ref, message_count, next_seq FROM {SESSIONS} WHERE key_hash = ?")
        self.range_oldest = c(f"SELECT record FROM {MESSAGES} WHERE session_ref = ? ORDER BY seq LIMIT ? OFFSET ?")
        self.range_newest = c(
            f"SELECT record FROM {MESSAGES} WHERE session_ref = ? AND seq < ? ORDER BY seq DESC LIMIT ? OFFSET ?"
        )
        self.delete = c(f"DELETE FROM {SESSIONS} WHERE key_hash = ?")
        self.lock_session = c(f"SELECT id FROM {SESSIONS} WHERE key_hash = ?{lock}")
        self.trim_boundary = c(f"SELECT seq FROM {MESSAGES} WHERE session_ref = ? ORDER BY seq DESC LIMIT 1 OFFSET ?")
        self.trim_delete = c(f"DELETE FROM {MESSAGES} WHERE session_ref = ? AND seq <= ?")
        if not self.mysql:  # (MySQL and MariaDB: use_server)
            self.pop = (
                c(
                    f"DELETE FROM {MESSAGES} WHERE session_ref = ? AND seq = "
                    f"(SELECT max(seq) FROM {MESSAGES} WHERE session_ref = ?) RETURNING record, token_usage"
                ),
                True,
            )
        self.pop_remove = c(f"DELETE FROM {MESSAGES} WHERE session_ref = ? AND seq = ?")
        # pop and trim: fewer messages, and a write (it moves updated_at).
        self.remove_messages = c(
            f"UPDATE {SESSIONS} SET message_count = message_count - ?, "
            f"updated_at = {greatest}(updated_at, ?) WHERE id = ?"
        )
        info = (
            "id, session_id, message_count, created_at, updated_at, token_usage, title, tags, metadata, forked_from, "
            "forked_through"
        )
        listing = f"SELECT {info} FROM {SESSIONS} WHERE tenant_hash = ?"
        order = " ORDER BY updated_at DESC, id DESC LIMIT ?"
        self.list_first = c(listing + order)
        self.list_after = c(listing + " AND (updated_at < ? OR (updated_at = ? AND id < ?))" + order)
        # One session's listing row, by its key (session_info): the key hash is unique, a hidden row has its own.
        self.info_by_key = c(f"SELECT {info} FROM {SESSIONS} WHERE key_hash = ?")
        # By tag: the tag index gives the tagged sessions (never the whole tenant); the tenant's hash is in the tag's.
        tagged = f"SELECT {info} FROM {SESSIONS} WHERE id IN (SELECT session_ref FROM {TAGS} WHERE tag_hash = ?)"
        self.tagged_first = c(tagged + order)
        self.tagged_after = c(tagged + " AND (updated_at < ? OR (updated_at = ? AND id < ?))" + order)
        # Usage: the session's, kept by every write; a message's, read back by the pop or trim that removes it.
        self.usage = c(f"SELECT token_usage FROM {SESSIONS} WHERE key_hash = ?")
        self.session_usage = c(f"SELECT token_usage FROM {SESSIONS} WHERE id = ?")
        self.set_usage = c(f"UPDATE {SESSIONS} SET token_usage = ? WHERE id = ?")
        self.inserted_usages = c(
            f"SELECT seq, token_usage FROM {MESSAGES} WHERE session_ref = ? AND seq >= ? AND seq < ? "
            "AND token_usage IS NOT NULL"
        )
        self.trim_usages = c(
            f"SELECT token_usage FROM {MESSAGES} WHERE session_ref = ? AND seq <= ? AND token_usage IS NOT NULL"
        )
        # Forks (``_chain``): a history's chain of rows, and reads of one stretch (row, first seq, end seq).
        walk = (
            "WITH RECURSIVE chain (id, base_ref, base_cut, first_seq, depth) AS ("
            f"SELECT id, base_ref, base_cut, first_seq, 0 FROM {SESSIONS} WHERE {{}} = ? UNION ALL "
            f"SELECT s.id, s.base_ref, s.base_cut, s.first_seq, chain.depth + 1 FROM {SESSIONS} s "
            "JOIN chain ON s.id = chain.base_ref) SELECT id, base_ref, base_cut, first_seq FROM chain ORDER BY depth"
        )
        self.chain_by_key = c(walk.format("key_hash"))
        self.chain_by_id = c(walk.format("id"))
        stretch = f"FROM {MESSAGES} WHERE session_ref = ? AND seq >= ? AND seq < ?"
        self.seg_load = c(f"SELECT record {stretch} ORDER BY seq")
        self.seg_last = c(f"SELECT record {stretch} ORDER BY seq DESC LIMIT ?")
        self.seg_page = c(f"SELECT seq, record {stretch} ORDER BY seq LIMIT ?")
        self.seg_newest = c(f"SELECT seq, record, token_usage {stretch} ORDER BY seq DESC LIMIT 1")
        self.seg_find = c(f"SELECT seq {stretch} AND message_hash = ?")
        self.seg_count = c(f"SELECT count(*) {stretch}")
        self.seg_usages = c(f"SELECT token_usage {stretch} AND token_usage IS NOT NULL")
        self.seg_offset = c(f"SELECT seq {stretch} ORDER BY seq DESC LIMIT 1 OFFSET ?")
        self.seg_range = c(f"SELECT record {stretch} ORDER BY seq LIMIT ? OFFSET ?")
        self._stretch = stretch
        # PostgreSQL reads a fork's window in ONE statement: the walk of the chain, each row's stretch
        # (``_chain.chain``'s rule, in SQL) and, per stretch, at most the rows the window needs (a LATERAL index scan),
        # newest stretch first: one round trip, one snapshot, however long the chain. ``""`` elsewhere.
        self.chain_all = self.chain_last = self.chain_page = ""
        if family == "postgresql":
            stretches = (
                "WITH RECURSIVE chain (id, base_ref, base_cut, first_seq, hi) AS ("
                f"SELECT id, base_ref, base_cut, first_seq, {CHAIN_END}::bigint FROM {SESSIONS} WHERE key_hash = ? "
                "UNION ALL SELECT s.id, s.base_ref, s.base_cut, chain.first_seq, LEAST(chain.hi, chain.base_cut) "
                f"FROM {SESSIONS} s JOIN chain ON s.id = chain.base_ref), "
                "seg AS (SELECT id, GREATEST(first_seq, CASE WHEN base_ref IS NULL THEN 0 ELSE base_cut END) AS lo, "
                "hi FROM chain) "
            )
            held = f"FROM {MESSAGES} m WHERE m.session_ref = seg.id AND m.seq >= seg.lo AND m.seq < seg.hi"
            self.chain_all = c(
                stretches + f"SELECT m.record FROM seg JOIN {MESSAGES} m ON m.session_ref = seg.id "
                "AND m.seq >= seg.lo AND m.seq < seg.hi ORDER BY m.seq"
            )
            self.chain_last = c(
                stretches + "SELECT w.record FROM seg CROSS JOIN LATERAL "
                f"(SELECT m.seq, m.record {held} ORDER BY m.seq DESC LIMIT ?) w ORDER BY w.seq DESC LIMIT ?"
            )
            self.chain_page = c(
                stretches + "SELECT w.seq, w.record FROM seg CROSS JOIN LATERAL "
                f"(SELECT m.seq, m.record {held} AND m.seq > ? ORDER BY m.seq LIMIT ?) w ORDER BY w.seq LIMIT ?"
            )
        self.head_for_update = c(
            f"SELECT id, base_ref, forks, message_count, next_seq FROM {SESSIONS} WHERE key_hash = ?{lock}"
        )
        self.row_by_key = c(f"SELECT id FROM {SESSIONS} WHERE key_hash = ?{lock}")
        self.hide = c(f"UPDATE {SESSIONS} SET key_hash = ?, tenant_hash = ? WHERE id = ?")
        kept = "message_count, document, doc_version, owner, token_usage, title, tags, metadata"
        self.move_insert = c(
            f"INSERT INTO {SESSIONS} (key_hash, tenant_hash, tenant, session_id, created_at, updated_at, next_seq, "
            f"{kept}, base_ref, base_cut, first_seq, forks, doc_ref, forked_from, forked_through) "
            f"SELECT ?, ?, tenant, session_id, created_at, updated_at, next_seq, {kept}, id, next_seq, first_seq, 0, "
            f"COALESCE(doc_ref, id), forked_from, forked_through FROM {SESSIONS} WHERE id = ?"
        )
        self.fork_insert = c(
            f"INSERT INTO {SESSIONS} (key_hash, tenant_hash, tenant, session_id, created_at, updated_at, next_seq, "
            "message_count, token_usage, title, tags, metadata, base_ref, base_cut, first_seq, forks, forked_from, "
            "forked_through) SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, title, tags, metadata, id, ?, first_seq, 0, ?, ? "
            f"FROM {SESSIONS} WHERE id = ?"
        )
        self.copy_tags = c(
            f"INSERT INTO {TAGS} (session_ref, tag_hash) SELECT ?, tag_hash FROM {TAGS} WHERE session_ref = ?"
        )
        self.add_forks = c(f"UPDATE {SESSIONS} SET forks = forks + ? WHERE id = ?")
        self.base_state = c(f"SELECT base_ref, forks, tenant_hash FROM {SESSIONS} WHERE id = ?{lock}")
        self.delete_row = c(f"DELETE FROM {SESSIONS} WHERE id = ?")
        self.retag_move = c(f"UPDATE {TAGS} SET session_ref = ? WHERE session_ref = ?")
        self.set_first_seq = c(f"UPDATE {SESSIONS} SET first_seq = ? WHERE id = ?")
        self.set_base_cut = c(f"UPDATE {SESSIONS} SET base_cut = ? WHERE id = ?")
        self.delete_plain = c(f"DELETE FROM {SESSIONS} WHERE key_hash = ? AND forks = 0 AND base_ref IS NULL")
        # Title, tags and metadata (update_info; its SET clause is made per call), and the tag index's rows.
        self.untag = c(f"DELETE FROM {TAGS} WHERE session_ref = ?")
        self._tag_inserts: dict[int, str] = {}
        self.doc_for_update = c(
            # A moved session's versions keep the id of the row it was first stored in (``doc_ref``).
            f"SELECT id, doc_version, document IS NOT NULL, owner, COALESCE(doc_ref, id) FROM {SESSIONS} "
            f"WHERE key_hash = ?{lock}"
        )
        self.doc_write = c(
            f"UPDATE {SESSIONS} SET document = ?, doc_version = doc_version + 1, owner = COALESCE(?, owner), "
            f"updated_at = {greatest}(updated_at, ?) WHERE id = ?"
        )
        self.doc_read = c(
            f"SELECT COALESCE(doc_ref, id), doc_version, document, owner FROM {SESSIONS} WHERE key_hash = ?"
        )
        # PostgreSQL: a document written over a stored one in ONE autocommitted statement (``_ops.save_document``).
        # The UPDATE locks the row and, after waiting for a concurrent writer, checks its WHERE again on the newest
        # row version (READ COMMITTED), so of two writers expecting one version exactly one matches. Parameters:
        # the document, the owner, the time, the key's hash, the owner twice more, the expected row id twice and
        # version (all ``NULL``: write whatever the version). No row back: the transaction says why (or creates).
        self.doc_write_one = ""
        if family == "postgresql":
            self.doc_write_one = c(
                f"UPDATE {SESSIONS} SET document = ?, doc_version = doc_version + 1, "
                "owner = COALESCE(?::bytea, owner), updated_at = GREATEST(updated_at, ?) "
                "WHERE key_hash = ? AND document IS NOT NULL "
                "AND (?::bytea IS NULL OR owner IS NULL OR owner = ?::bytea) "
                "AND (?::bigint IS NULL OR (COALESCE(doc_ref, id) = ? AND doc_version = ?)) "
                "RETURNING COALESCE(doc_ref, id), doc_version"
            )
        self.old_sessions = c(f"SELECT id FROM {SESSIONS} WHERE updated_at < ? AND tenant_hash <> ? LIMIT ?")
        self.old_tenant_sessions = c(f"SELECT id FROM {SESSIONS} WHERE tenant_hash = ? AND updated_at < ? LIMIT ?")
        self.tenant_sessions = c(f"SELECT id FROM {SESSIONS} WHERE tenant_hash = ? LIMIT ?")
        # Each distinct tenant_hash read from the (tenant_hash, updated_at, id) index, then one row's tenant for it.
        self.tenants = c(
            f"SELECT (SELECT s.tenant FROM {SESSIONS} s WHERE s.tenant_hash = t.tenant_hash LIMIT 1) "
            f"FROM (SELECT DISTINCT tenant_hash FROM {SESSIONS} WHERE tenant_hash <> ?) t"
        )
        # Rows of a listing that are forks or that forks refer to: deleted one by one (``_chain.drop``).
        self.chained_rows = "SELECT id FROM " + SESSIONS + " WHERE id IN ({}) AND (forks > 0 OR base_ref IS NOT NULL){}"

    def _c(self, sql: str) -> str:
        return _convert(sql, self._paramstyle)

    @property
    def appends_in_one_statement(self) -> bool:
        """Whether a short append is one statement (:meth:`pg_append`): on PostgreSQL."""
        return self.family == "postgresql"

    def pg_append(self, count: int, *, usage: bool) -> str:
        """PostgreSQL's one-statement append of ``count`` messages (``usage``: some of them carry usage)."""
        shape = (pg_batch_rows(count), usage)
        sql = self._pg_appends.get(shape)
        if sql is None:
            sql = self._pg_appends[shape] = self._c(
                pg_append_ctes(rows=shape[0], usage=usage) + f" SELECT {PG_APPEND_CHECKED} FROM done, n"
            )
        return sql

    def use_server(self, *, is_mariadb: bool, version: tuple[object, ...] | None) -> None:
        """Fit the MySQL/MariaDB statements to the server (``version`` as the driver reports it, ``None``: unknown).

        A ``mysql://`` URL may reach either, and the dialect knows which only after its first connection. MySQL
        8.0.19 and later get the row-alias upsert; MariaDB (which has none), older MySQL and an unknown server get
        ``VALUES()``. MariaDB 10.5 and later return the reserved range from the upsert itself (``RETURNING``),
        saving the locked read back, and every MariaDB deletes the newest row returning it (MySQL reads it under
        its lock, then deletes it). A call running meanwhile is unaffected: the upsert tells by the rows it
        returns, and pop's statement and how to read it are one attribute.
        """
        if not self.mysql:
            return
        numbers = tuple(part for part in (version or ())[:3] if isinstance(part, int))
        self.row_alias = not is_mariadb and len(numbers) == 3 and numbers >= MYSQL_ROW_ALIAS
        returns = is_mariadb and (not numbers or numbers >= MARIADB_INSERT_RETURNING)
        upsert = mysql_upsert(row_alias=self.row_alias)
        self.upsert = self._c(upsert + (" RETURNING id, next_seq, base_ref" if returns else ""))
        if is_mariadb:  # MariaDB refuses a subquery on the table a DELETE changes, but takes ORDER BY ... LIMIT
            statement = (
                f"DELETE FROM {MESSAGES} WHERE session_ref = ? ORDER BY seq DESC LIMIT 1 RETURNING record, token_usage"
            )
            self.pop = (self._c(statement), True)
        else:
            statement = (
                f"SELECT seq, record, token_usage FROM {MESSAGES} WHERE session_ref = ? ORDER BY seq DESC LIMIT 1 "
                "FOR UPDATE"
            )
            self.pop = (self._c(statement), False)

    def convert(self, sql: str) -> str:
        """``sql`` (``?`` placeholders) in the driver's parameter style, for statements made elsewhere."""
        return _convert(sql, self._paramstyle)

    def insert_messages(self, rows: int) -> str:
        """A multi-row INSERT of ``rows`` messages that skips those already stored."""
        sql = self._inserts.get(rows)
        if sql is None:
            values = ", ".join(["(?, ?, ?, ?, ?)"] * rows)
            sql = self._c(
                f"{self.insert_ignore} {MESSAGES} (session_ref, seq, message_hash, record, token_usage) VALUES {values}"
                + self.conflict_nothing
            )
            self._inserts[rows] = sql
        return sql

    def seg_hashes(self, hashes: int) -> str:
        """Which of ``hashes`` message hashes one stretch of a history holds."""
        marks = ", ".join(["?"] * hashes)
        return self._c(f"SELECT message_hash {self._stretch} AND message_hash IN ({marks})")

    def insert_tags(self, tags: int) -> str:
        """An INSERT of ``tags`` rows of the tag index (session ref, tag hash)."""
        sql = self._tag_inserts.get(tags)
        if sql is None:
            sql = self._tag_inserts[tags] = self._c(
                f"INSERT INTO {TAGS} (session_ref, tag_hash) VALUES " + ", ".join(["(?, ?)"] * tags)
            )
        return sql

    def update_info(self, *, title: bool, tags: bool, metadata: bool) -> str:
        """The UPDATE of a session's info setting the fields given (and ``updated_at``: it is a write)."""
        greatest = "max" if self.sqlite else "GREATEST"
        chosen = [name for name, given in (("title", title), ("tags", tags), ("metadata", metadata)) if given]
        assignments = "".join(f"{name} = ?, " for name in chosen)
        return self._c(f"UPDATE {SESSIONS} SET {assignments}updated_at = {greatest}(updated_at, ?) WHERE id = ?")

    def delete_ids(self, ids: int, *, older: bool) -> str:
        """DELETE of sessions by id (re-checking the age when pruning, against a concurrent write)."""
        marks = ", ".join(["?"] * ids)
        return self._c(
            f"DELETE FROM {SESSIONS} WHERE id IN ({marks}) AND forks = 0 AND base_ref IS NULL"
            + (" AND updated_at < ?" if older else "")
        )

    def chained_ids(self, ids: int, *, older: bool) -> str:
        """The rows among ``ids`` that :meth:`delete_ids` leaves: forks and rows forks refer to (locked)."""
        marks = ", ".join(["?"] * ids)
        return self._c(self.chained_rows.format(marks, " AND updated_at < ?" if older else "") + self.lock)
