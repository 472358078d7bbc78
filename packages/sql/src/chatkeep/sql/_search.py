"""The search index of the SQL store on PostgreSQL: pgvector (HNSW, cosine) for meaning, ``tsvector`` for words.

``chatkeep_search`` (migration 0002) holds one row per indexed message: its role, its keywords as a
``tsvector`` (GIN index) and, once the first message is indexed, its vector in a column ``embedding
vector(N)`` (HNSW index, cosine distance) that this module adds with the width of the index's embedder, in
the schema where the ``vector`` extension lives. A row references its message with ``ON DELETE CASCADE``, so
``delete``, ``trim``, ``pop``, ``prune`` and ``delete_tenant`` remove what was indexed in the same statement.
``chatkeep_search_index`` names the embedder (name and width) the index was built with.

An indexed append is one transaction: the index's record read under a share lock (a reindex switching the
embedder holds it exclusively), the messages stored as a plain append stores them, and their index rows; up to
``SHORT_ROWS`` messages, once the index exists, all of it is one statement, as a plain append is.
A search sets the HNSW scan's settings for its transaction, then runs one statement for both rankings.
The keywords are :func:`~chatkeep.core.backend.keyword_terms`, the rule every backend shares, written as a
``tsvector`` literal (so PostgreSQL's own parser and dictionaries do not split them differently).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chatkeep.core import SearchUnsupportedError
from chatkeep.core.backend import IndexInfo, check_index, keyword_terms
from chatkeep.sql import _ops
from chatkeep.sql._errors import sqlstate
from chatkeep.sql._index import IndexRow, NoIndex, Scope, SearchIndex
from chatkeep.sql._sql import PG_APPEND_CHECKED, Statements, pg_append_ctes, pg_batch_rows
from chatkeep.sql._transport import Connection

__all__ = ["PG_SEARCH_HINT", "PostgresSearch", "tsquery", "tsvector", "vector_text"]

#: What to do on a PostgreSQL without pgvector.
PG_SEARCH_HINT = (
    "install pgvector on the server (https://github.com/pgvector/pgvector#installation: e.g. the package "
    "postgresql-<version>-pgvector, or the pgvector/pgvector Docker image), then run CREATE EXTENSION vector in "
    "the database as a superuser (or let chatkeep run it once with a role allowed to)"
)
# tsvector limits: a lexeme of at most 2047 bytes, positions 1..16383.
_MAX_LEXEME = 2046
_MAX_POSITION = 16383


def tsvector(text: str) -> str:
    """The ``tsvector`` literal of ``text``'s keyword terms, with their positions (so term frequencies count)."""
    positions: dict[str, list[int]] = {}
    for n, term in enumerate(keyword_terms(text), start=1):
        if len(term.encode()) <= _MAX_LEXEME:
            positions.setdefault(term, []).append(min(n, _MAX_POSITION))
    # \w+ terms hold no quote or backslash: quoting each lexeme is enough.
    return " ".join(f"'{term}':{','.join(map(str, sorted(set(at))[:256]))}" for term, at in positions.items())


def tsquery(terms: Sequence[str]) -> str:
    """The ``tsquery`` literal matching any of ``terms``."""
    return " | ".join(f"'{term}'" for term in dict.fromkeys(terms) if len(term.encode()) <= _MAX_LEXEME)


def vector_text(vector: Sequence[float]) -> str:
    """pgvector's text form of a vector."""
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class PostgresSearch(SearchIndex):
    """The index's statements and writes on PostgreSQL, for one store (it remembers the extension's schema)."""

    def __init__(self, sql: Statements, description: str) -> None:
        super().__init__(sql, description)
        self._namespace: str | None = None  # the vector extension's schema, quoted, once found
        # (namespace, batch rows as pg_batch_rows gives them) -> the one-statement indexed append
        self._append_statements: dict[tuple[str, int | None], str] = {}
        # Whether chatkeep_search's vector column exists: made with the index (then only ever remade in the same
        # transaction as it is dropped), so once seen it stays.
        self._has_column = False
        c = sql.convert
        self.info = "SELECT embedder, dimensions FROM chatkeep_search_index WHERE id = 1"
        self.info_shared = self.info + " FOR SHARE"
        self.info_locked = self.info + " FOR UPDATE"
        self.set_info = c("UPDATE chatkeep_search_index SET embedder = ?, dimensions = ? WHERE id = 1")
        self.stored = c(
            "SELECT message_hash FROM chatkeep_messages WHERE session_ref = ? AND message_hash = ANY(?::bytea[])"
        )
        self.unindexed_of = c(
            "SELECT m.message_hash FROM chatkeep_messages m JOIN chatkeep_sessions s ON s.id = m.session_ref "
            "LEFT JOIN chatkeep_search x ON x.session_ref = m.session_ref AND x.seq = m.seq "
            "WHERE s.key_hash = ? AND m.message_hash = ANY(?::bytea[]) AND x.seq IS NULL"
        )

    # -- the extension -------------------------------------------------------------------------------

    async def namespace(self, conn: Connection, *, create: bool) -> str:
        """The quoted schema of the ``vector`` extension; with ``create``, create the extension when it is missing.

        Raises:
            SearchUnsupportedError: the server has no pgvector (or it may not be created here).
        """
        if self._namespace is not None:
            return self._namespace
        found = await conn.fetch(
            "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
            "WHERE e.extname = 'vector'"
        )
        if not found:
            available = await conn.fetch("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
            if not available:
                raise SearchUnsupportedError(
                    f"the PostgreSQL server of {self.description} has no pgvector extension, which chatkeep "
                    f"needs to index and search messages; {PG_SEARCH_HINT}"
                )
            if not create:
                return ""
            try:
                await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            except Exception as exc:
                if sqlstate(exc) != "42501":  # insufficient privilege
                    raise
                raise SearchUnsupportedError(
                    f"the pgvector extension is installed on the server of {self.description} but not created in "
                    "its database, and this role may not create it; run CREATE EXTENSION vector there as a "
                    "superuser"
                ) from exc
            found = await conn.fetch(
                "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
                "WHERE e.extname = 'vector'"
            )
        self._namespace = _quote(str(found[0][0]))
        return self._namespace

    # -- the recorded embedder -----------------------------------------------------------------------

    async def index_info(self, conn: Connection) -> IndexInfo | None:
        """The recorded embedder; ``None`` when nothing is indexed yet (on a server that has pgvector)."""
        rows = await conn.fetch(self.info)
        if rows and rows[0][0] is not None:
            return IndexInfo(str(rows[0][0]), int(rows[0][1]))
        await self.namespace(conn, create=False)  # a server without pgvector says so, instead of finding nothing
        return None

    async def switch(self, conn: Connection, info: IndexInfo, *, replace: bool) -> None:
        """Record ``info`` and make the vector column of its width (dropping the old entries when it changes)."""
        namespace = await self.namespace(conn, create=True)

        async def body() -> None:
            rows = await conn.fetch(self.info_locked)
            recorded = IndexInfo(str(rows[0][0]), int(rows[0][1])) if rows[0][0] is not None else None
            if recorded == info:
                return
            if recorded is not None and not replace:
                check_index(recorded, info)
            await conn.execute("DELETE FROM chatkeep_search")
            await conn.execute("DROP INDEX IF EXISTS ix_chatkeep_search_embedding")
            await conn.execute("ALTER TABLE chatkeep_search DROP COLUMN IF EXISTS embedding")
            await conn.execute(
                f"ALTER TABLE chatkeep_search ADD COLUMN embedding {namespace}.vector({int(info.dimensions)}) NOT NULL"
            )
            await conn.execute(
                "CREATE INDEX ix_chatkeep_search_embedding ON chatkeep_search "
                f"USING hnsw (embedding {namespace}.vector_cosine_ops)"
            )
            await conn.execute(self.set_info, (info.embedder, info.dimensions))

        await _ops.transaction(conn, self.sql, body)

    async def _checked(self, conn: Connection, info: IndexInfo) -> str:
        """In a transaction: the recorded embedder, share-locked and checked against ``info``; the namespace."""
        rows = await conn.fetch(self.info_shared)
        if rows[0][0] is None:
            raise NoIndex
        check_index(IndexInfo(str(rows[0][0]), int(rows[0][1])), info)
        return await self.namespace(conn, create=False)

    def _insert_index(self, namespace: str) -> str:
        return self.sql.convert(
            "INSERT INTO chatkeep_search (session_ref, seq, role, terms, embedding) "
            f"SELECT m.session_ref, m.seq, u.role, u.terms::tsvector, u.vec::{namespace}.vector "
            "FROM unnest(?::bytea[], ?::text[], ?::text[], ?::text[]) AS u(h, role, terms, vec) "
            "JOIN chatkeep_messages m ON m.message_hash = u.h "
            "WHERE m.session_ref = (SELECT id FROM chatkeep_sessions WHERE key_hash = ?) "
            "ON CONFLICT (session_ref, seq) DO NOTHING"
        )

    async def append(
        self,
        conn: Connection,
        head: _ops.Head,
        now: int,
        rows: Sequence[_ops.Row],
        info: IndexInfo,
        index: Sequence[IndexRow],
    ) -> int:
        """Append ``rows`` and index ``index``: a short batch in ONE statement, as a plain append is.

        The plain append's data-modifying CTEs (``_sql.pg_append_ctes``), with the index's record read under a
        share lock first and the batch stored only when it names ``info``, and the index rows of the new messages
        and of the batch's messages already stored (``ON CONFLICT DO NOTHING``: those indexed stay as they are).
        The statement returns the recorded embedder too: another than ``info``, and it stored nothing and the
        mismatch is raised. Until this store has seen the index made (the vector column exists), and for a long
        batch, the transaction of :meth:`SearchIndex.append` does it.
        """
        namespace = self._namespace if len(rows) <= _ops.SHORT_ROWS and self._has_column else ""
        if not namespace:  # a long batch, or the vector column not seen yet: the transaction's way makes it
            inserted = await super().append(conn, head, now, rows, info, index)
            self._has_column = True
            return inserted
        columns = [list(c) for c in zip(*index, strict=True)] if index else [[], [], [], []]
        # The batch, the gate's embedder, the session's head and time, then the index rows' four arrays.
        params = [*_ops.append_params(head, now, rows, gate=(info.embedder, info.dimensions)), *columns]
        found = await _ops.one_statement(conn, self._append_indexed(namespace, len(rows)), params)
        inserted, embedder, dimensions, _ = found[0]
        if embedder is None or inserted < 0:  # no embedder recorded, or a fork (nothing stored): the transaction's way
            return await super().append(conn, head, now, rows, info, index)
        check_index(IndexInfo(str(embedder), int(dimensions)), info)
        return int(inserted)

    def _append_indexed(self, namespace: str, count: int) -> str:
        shape = (namespace, pg_batch_rows(count))
        statement = self._append_statements.get(shape)
        if statement is None:
            ctes = pg_append_ctes(
                rows=shape[1],
                first="info AS (SELECT embedder, dimensions FROM chatkeep_search_index WHERE id = 1 FOR SHARE), ",
                gate="EXISTS (SELECT 1 FROM info WHERE embedder = ? AND dimensions = ?)",
            )
            statement = self.sql.convert(
                ctes + ", rows AS (SELECT session_ref, seq, message_hash FROM ins "
                "UNION ALL SELECT session_ref, seq, message_hash FROM old), "
                "indexed AS (INSERT INTO chatkeep_search (session_ref, seq, role, terms, embedding) "
                f"SELECT rows.session_ref, rows.seq, u.role, u.terms::tsvector, u.vec::{namespace}.vector "
                "FROM unnest(?::bytea[], ?::text[], ?::text[], ?::text[]) AS u(h, role, terms, vec) "
                "JOIN rows ON rows.message_hash = u.h WHERE EXISTS (SELECT 1 FROM batch) "  # the gate passed
                "ON CONFLICT (session_ref, seq) DO NOTHING RETURNING 1) "
                f"SELECT {PG_APPEND_CHECKED}, (SELECT embedder FROM info), (SELECT dimensions FROM info), "
                "(SELECT count(*) FROM indexed) FROM done, n"
            )
            self._append_statements[shape] = statement
        return statement

    async def _usable(self, conn: Connection) -> None:
        await self.namespace(conn, create=False)  # a server without pgvector says how to get it

    async def _stored(self, conn: Connection, session_ref: int, hashes: list[bytes]) -> set[bytes]:
        return {bytes(row[0]) for row in await conn.fetch(self.stored, (session_ref, hashes))}

    async def _write_index(self, conn: Connection, checked: Any, head: _ops.Head, rows: Sequence[IndexRow]) -> int:
        if not rows:
            return 0
        columns = list(zip(*rows, strict=True))
        return await conn.execute(self._insert_index(checked), (*(list(c) for c in columns), head[0]))

    # -- writes --------------------------------------------------------------------------------------

    def rows(
        self, hashes: Sequence[bytes], roles: Sequence[str], texts: Sequence[str], vectors: Sequence[Any]
    ) -> list[IndexRow]:
        """The index rows of messages with a vector (those without one are not indexed)."""
        return [
            (h, role, tsvector(text), vector_text(vector))
            for h, role, text, vector in zip(hashes, roles, texts, vectors, strict=True)
            if vector is not None
        ]

    async def unindexed(self, conn: Connection, key: bytes, info: IndexInfo, hashes: list[bytes]) -> set[bytes]:
        """Those of ``hashes`` the session stores that are not indexed (none when the index has another embedder)."""
        rows = await conn.fetch(self.info)
        if rows[0][0] is None or IndexInfo(str(rows[0][0]), int(rows[0][1])) != info:
            return set()
        return {bytes(row[0]) for row in await conn.fetch(self.unindexed_of, (key, hashes))}

    async def unindex(self, conn: Connection, scope: Scope) -> int:
        """Delete the index rows of ``scope``'s sessions (one statement); how many were deleted."""
        where, params = _scope_filter(scope)
        return await conn.execute(self.sql.convert(f"DELETE FROM chatkeep_search x WHERE {where}"), params)

    # -- reads ---------------------------------------------------------------------------------------

    async def rankings(
        self, conn: Connection, scope: Scope, vector: Sequence[float] | None, terms: list[str], limit: int
    ) -> tuple[list[Sequence[Any]], list[Sequence[Any]]]:
        """Rows (session id, seq, record, score) of the best ``limit`` in ``scope`` by vector and by keywords.

        One statement for both rankings (after the HNSW settings, in the same transaction): each is chosen in
        ``chatkeep_search`` alone (the HNSW index for the vector's, the GIN index or a scan for the keywords',
        the scope's sessions as a semi-join), and only the chosen rows are joined with their sessions and messages.
        """
        namespace = await self.namespace(conn, create=False)
        where, params = _scope_filter(scope)
        parts: list[str] = []
        values: list[Any] = []
        by_vector_too = vector is not None and bool(namespace)
        if vector is not None and namespace:
            distance = f"x.embedding OPERATOR({namespace}.<=>) ?::text::{namespace}.vector"
            parts.append(
                f"(SELECT 0 AS ranking, x.session_ref, x.seq, {distance} AS score FROM chatkeep_search x "
                f"WHERE {where} ORDER BY score LIMIT ?)"
            )
            values += [vector_text(vector), *params, limit]
        if terms:
            query = "?::text::tsquery"
            parts.append(
                f"(SELECT 1 AS ranking, x.session_ref, x.seq, ts_rank(x.terms, {query}) AS score "
                f"FROM chatkeep_search x WHERE x.terms @@ {query} AND {where} "
                "ORDER BY score DESC, x.session_ref, x.seq LIMIT ?)"
            )
            values += [tsquery(terms), tsquery(terms), *params, limit]
        if not parts:
            return [], []
        statement = self.sql.convert(
            "WITH best AS ("
            + " UNION ALL ".join(parts)
            + ") SELECT best.ranking, s.session_id, best.seq, m.record, best.score FROM best "
            "JOIN chatkeep_sessions s ON s.id = best.session_ref "
            "JOIN chatkeep_messages m ON m.session_ref = best.session_ref AND m.seq = best.seq"
        )
        found: list[Sequence[Any]] = []

        async def body() -> None:
            # Enough candidates from the HNSW graph, and more when the scope's filter drops some (pgvector >= 0.8,
            # iterative scan): both settings in one round trip, for this transaction only (as SET LOCAL).
            await conn.fetch(
                "SELECT set_config('hnsw.ef_search', "
                f"'{max(40, min(limit, 1000))}', true), set_config('hnsw.iterative_scan', 'relaxed_order', true)",
                (),
            )
            found.extend(await conn.fetch(statement, values))

        if by_vector_too:
            await _ops.transaction(conn, self.sql, body)
        else:  # words only: no settings, one autocommitted statement
            found.extend(await conn.fetch(statement, values))
        rows = found
        by_vector = sorted((row[1:] for row in rows if row[0] == 0), key=lambda row: float(row[3]))
        by_words = sorted(
            (row[1:] for row in rows if row[0] == 1), key=lambda row: (-float(row[3]), bytes(row[0]), int(row[1]))
        )
        return by_vector, by_words


def _scope_filter(scope: Scope) -> tuple[str, list[Any]]:
    """The condition on ``chatkeep_search x`` that keeps the scope's rows, and its parameters.

    The scope's sessions are a subquery on ``chatkeep_sessions`` (a semi-join), so a ranking reads only
    ``chatkeep_search`` and never returns a row of a session outside the scope.
    """
    params: list[Any]
    if scope.session is not None:
        where, params = "x.session_ref IN (SELECT id FROM chatkeep_sessions WHERE key_hash = ?)", [scope.session]
    elif scope.owner is not None:
        where = "x.session_ref IN (SELECT id FROM chatkeep_sessions WHERE tenant_hash = ? AND owner = ?)"
        params = [scope.tenant, scope.owner]
    else:
        where, params = "x.session_ref IN (SELECT id FROM chatkeep_sessions WHERE tenant_hash = ?)", [scope.tenant]
    if scope.before_seq is not None:
        where, params = where + " AND x.seq < ?", [*params, scope.before_seq]
    if scope.roles is not None:
        where, params = where + " AND x.role = ANY(?::text[])", [*params, list(scope.roles)]
    return where, params
