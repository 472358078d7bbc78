"""The search index of the SQL store on SQLite: sqlite-vec (``vec0``) for meaning, FTS5 (bm25) for words.

Only the ``apsw`` transport can load sqlite-vec, so the index exists only in files an apsw store indexed. It is
made when the first message is indexed, with the width of the embedder's vectors (the ``vec0`` table's column
is declared with it), in one ``BEGIN IMMEDIATE`` transaction:

* ``chatkeep_search_index``: the embedder the index was built with, and the layout of these tables (one row);
* ``chatkeep_search``: one row per indexed message (``id``, ``session_ref``, ``seq``, ``role``), referencing its
  message with ``ON DELETE CASCADE``: deleting, trimming, popping or pruning messages deletes these rows;
* ``chatkeep_search_vec`` (``vec0``: the vector scaled to length 1, the tenant as a partition key, the session,
  sequence number and role as metadata columns a KNN query filters on) and ``chatkeep_search_fts`` (FTS5,
  contentless, the keyword terms), both keyed by ``chatkeep_search.id``: a trigger on ``chatkeep_search``
  deletes their rows with it.

Vectors are stored, and queries made, at length 1 and compared by Euclidean (L2) distance: between unit vectors
it ranks exactly as cosine distance does (``|a - b|^2 = 2 - 2 cos(a, b)``), and sqlite-vec computes it with SIMD
instructions (from 0.1.10) where its cosine distance is scalar code: the tenant's scan, all of a search's cost at
100,000 messages, takes about 40% less time. A zero vector is stored as zeros: at distance 1 from every query
(cosine distance 0.5: unrelated).

A file indexed with another layout of these tables (an older release's, recorded or not, or a newer one's) is
refused with :class:`SearchIndexLayoutError`, which names ``chatkeep reindex``: a reindex drops the tables and
makes them again in this release's layout. The messages are not touched.

A file with this index can only be changed with sqlite-vec loaded (the trigger reaches the ``vec0`` table): the
``sqlite3`` transport refuses such a file with an error that says to open it with ``?transport=apsw``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

from chatkeep.core import SearchUnsupportedError
from chatkeep.core.backend import IndexInfo, check_index, keyword_terms
from chatkeep.sql import _ops
from chatkeep.sql._index import IndexRow, NoIndex, Scope, SearchIndex
from chatkeep.sql._schema import SchemaVersionError
from chatkeep.sql._transport import Connection

__all__ = ["LAYOUT", "SQLITE_SEARCH_HINT", "VEC_TABLE", "SQLiteSearch", "SearchIndexLayoutError"]

#: The layout of the index's tables this release makes and reads. Raise it with any change to them: files of
#: another layout are then refused until ``chatkeep reindex`` makes the tables again. 1: the first layout that
#: records itself (files of the first release of SQLite search record none); 2: unit vectors compared by L2
#: distance (layout 1 stored them as given and compared by cosine distance).
LAYOUT = 2

VEC_TABLE = "chatkeep_search_vec"
#: What to do when SQLite cannot search.
SQLITE_SEARCH_HINT = (
    'install the recall extra (pip install "chatkeep-sql[recall]": apsw and sqlite-vec) and open the file with '
    "?transport=apsw (sqlite:///path/to/file.db?transport=apsw)"
)
# vec0's largest k.
_MAX_K = 4096


def _unit_blob(vector: Sequence[float]) -> bytes:
    """``vector`` scaled to length 1 (a zero vector stays zeros), as the ``vec0`` column stores it."""
    length = math.hypot(*vector)
    scale = 1.0 / length if length > 0.0 else 0.0
    return struct.pack(f"<{len(vector)}f", *[x * scale for x in vector])


def _marks(n: int) -> str:
    return ", ".join(["?"] * n)


class SearchIndexLayoutError(SchemaVersionError):
    """A SQLite file's search index has another layout than this release's: ``chatkeep reindex`` remakes it."""


def _layout_error(description: str, found: int | None) -> SearchIndexLayoutError:
    made_by = "an older chatkeep-sql (before layouts were recorded)" if found is None else f"layout {found}"
    if found is not None and found > LAYOUT:
        made_by += ", from a newer chatkeep-sql (upgrade this one, or reindex, which the newer one then refuses)"
    return SearchIndexLayoutError(
        f"{description}'s search index was made by {made_by}, and this chatkeep-sql reads layout {LAYOUT}; "
        "rebuild the index with: chatkeep reindex --store 'sqlite:///path/to/file.db?transport=apsw' (or "
        "store.reindex(embedder)): it drops the index's tables and indexes every message again; the messages "
        "themselves are not touched. Until then the history works, but indexing and searching do not"
    )


class SQLiteSearch(SearchIndex):
    """The index's statements and writes on SQLite (with sqlite-vec loaded), for one store."""

    def rows(
        self, hashes: Sequence[bytes], roles: Sequence[str], texts: Sequence[str], vectors: Sequence[Any]
    ) -> list[IndexRow]:
        """The index rows of messages with a vector (those without one are not indexed)."""
        return [
            (h, role, " ".join(keyword_terms(text)), _unit_blob(vector))
            for h, role, text, vector in zip(hashes, roles, texts, vectors, strict=True)
            if vector is not None
        ]

    async def _usable(self, conn: Connection) -> None:
        try:
            await conn.fetch("SELECT vec_version()")
        except Exception as exc:
            if "no such function" not in str(exc).lower():
                raise
            raise SearchUnsupportedError(
                f"{self.description} cannot index or search messages: sqlite-vec is not loaded; {SQLITE_SEARCH_HINT}"
            ) from exc

    async def _read(self, conn: Connection) -> tuple[IndexInfo | None, int | None]:
        """The recorded embedder (``None``: none) and the tables' layout (``None``: not recorded, the oldest)."""
        made = await conn.fetch("SELECT 1 FROM sqlite_master WHERE name = 'chatkeep_search_index'")
        if not made:
            return None, LAYOUT
        try:
            rows = await conn.fetch("SELECT embedder, dimensions, layout FROM chatkeep_search_index WHERE id = 1")
        except Exception as exc:
            if "no such column" not in str(exc).lower():
                raise
            rows = await conn.fetch("SELECT embedder, dimensions, NULL FROM chatkeep_search_index WHERE id = 1")
        if not rows or rows[0][0] is None:
            return None, LAYOUT  # nothing indexed: the first indexed write makes the tables
        return IndexInfo(str(rows[0][0]), int(rows[0][1])), None if rows[0][2] is None else int(rows[0][2])

    async def _recorded(self, conn: Connection) -> IndexInfo | None:
        recorded, layout = await self._read(conn)
        if layout != LAYOUT:
            raise _layout_error(self.description, layout)
        return recorded

    async def index_info(self, conn: Connection) -> IndexInfo | None:
        """The recorded embedder; ``None`` when nothing is indexed yet."""
        await self._usable(conn)
        return await self._recorded(conn)

    async def switch(self, conn: Connection, info: IndexInfo, *, replace: bool) -> None:
        """Record ``info`` and make the index's tables for its width (dropping the old ones when it changes)."""
        await self._usable(conn)

        async def body() -> None:
            recorded, layout = await self._read(conn) if replace else (await self._recorded(conn), LAYOUT)
            if recorded == info and layout == LAYOUT:
                return
            if recorded is not None and not replace:
                check_index(recorded, info)
            for statement in (
                "DROP TRIGGER IF EXISTS chatkeep_search_gone",
                f"DROP TABLE IF EXISTS {VEC_TABLE}",
                "DROP TABLE IF EXISTS chatkeep_search_fts",
                "DROP TABLE IF EXISTS chatkeep_search",
                "DROP TABLE IF EXISTS chatkeep_search_index",
                "CREATE TABLE chatkeep_search_index "
                "(id INTEGER PRIMARY KEY CHECK (id = 1), embedder TEXT, dimensions INTEGER, layout INTEGER)",
                "CREATE TABLE chatkeep_search (id INTEGER PRIMARY KEY AUTOINCREMENT, session_ref INTEGER NOT NULL, "
                "seq INTEGER NOT NULL, role TEXT NOT NULL, UNIQUE (session_ref, seq), "
                "FOREIGN KEY (session_ref, seq) REFERENCES chatkeep_messages (session_ref, seq) ON DELETE CASCADE)",
                f"CREATE VIRTUAL TABLE {VEC_TABLE} USING vec0(embedding float[{int(info.dimensions)}] "
                "distance_metric=L2, tenant_key text partition key, session_ref integer, seq integer, role text)",
                "CREATE VIRTUAL TABLE chatkeep_search_fts USING fts5(terms, content='', contentless_delete=1)",
                "CREATE TRIGGER chatkeep_search_gone AFTER DELETE ON chatkeep_search BEGIN "
                f"DELETE FROM {VEC_TABLE} WHERE rowid = old.id; "
                "DELETE FROM chatkeep_search_fts WHERE rowid = old.id; END",
            ):
                await conn.execute(statement)
            await conn.execute(
                "INSERT INTO chatkeep_search_index VALUES (1, ?, ?, ?)", (info.embedder, info.dimensions, LAYOUT)
            )

        await _ops.transaction(conn, self.sql, body)

    async def _checked(self, conn: Connection, info: IndexInfo) -> None:
        recorded = await self._recorded(conn)
        if recorded is None:
            raise NoIndex
        check_index(recorded, info)

    async def _stored(self, conn: Connection, session_ref: int, hashes: list[bytes]) -> set[bytes]:
        rows = await conn.fetch(
            "SELECT message_hash FROM chatkeep_messages WHERE session_ref = ? "
            f"AND message_hash IN ({_marks(len(hashes))})",
            (session_ref, *hashes),
        )
        return {bytes(row[0]) for row in rows}

    async def _write_index(self, conn: Connection, checked: Any, head: _ops.Head, rows: Sequence[IndexRow]) -> int:
        key, tenant = head[0], head[1]
        written = 0
        for message_hash, role, terms, vector in rows:
            made = await conn.fetch(
                "INSERT OR IGNORE INTO chatkeep_search (session_ref, seq, role) "
                "SELECT session_ref, seq, ? FROM chatkeep_messages "
                "WHERE session_ref = (SELECT id FROM chatkeep_sessions WHERE key_hash = ?) AND message_hash = ? "
                "RETURNING id, session_ref, seq",
                (role, key, message_hash),
            )
            if not made:
                continue  # gone, or indexed already
            row_id, session_ref, seq = made[0]
            await conn.execute(
                f"INSERT INTO {VEC_TABLE} (rowid, embedding, tenant_key, session_ref, seq, role) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (row_id, vector, tenant.hex(), session_ref, seq, role),
            )
            await conn.execute("INSERT INTO chatkeep_search_fts (rowid, terms) VALUES (?, ?)", (row_id, terms))
            written += 1
        return written

    async def unindexed(self, conn: Connection, key: bytes, info: IndexInfo, hashes: list[bytes]) -> set[bytes]:
        """Those of ``hashes`` the session stores that are not indexed (none when the index has another embedder)."""
        if await self._recorded(conn) != info:
            return set()
        rows = await conn.fetch(
            "SELECT m.message_hash FROM chatkeep_messages m "
            "LEFT JOIN chatkeep_search x ON x.session_ref = m.session_ref AND x.seq = m.seq "
            "WHERE m.session_ref = (SELECT id FROM chatkeep_sessions WHERE key_hash = ?) "
            f"AND m.message_hash IN ({_marks(len(hashes))}) AND x.id IS NULL",
            (key, *hashes),
        )
        return {bytes(row[0]) for row in rows}

    async def unindex(self, conn: Connection, scope: Scope) -> int:
        """Delete the index rows of ``scope``'s sessions (the trigger deletes their vectors and keywords)."""
        await self._usable(conn)  # the trigger reaches the vec0 table
        if await self._recorded(conn) is None:
            return 0  # nothing indexed: the tables may not exist yet
        if scope.session is not None:
            sessions, params = "SELECT id FROM chatkeep_sessions WHERE key_hash = ?", [scope.session]
        else:
            sessions, params = "SELECT id FROM chatkeep_sessions WHERE tenant_hash = ?", [scope.tenant]
        return await conn.execute(f"DELETE FROM chatkeep_search WHERE session_ref IN ({sessions})", params)

    async def rankings(
        self, conn: Connection, scope: Scope, vector: Sequence[float] | None, terms: list[str], limit: int
    ) -> tuple[list[Sequence[Any]], list[Sequence[Any]]]:
        """Rows (session id, seq, record, score) of the best ``limit`` in ``scope`` by vector and by keywords.

        Each ranking is chosen first (the ``vec0`` KNN in the tenant's partition, filtered inside by the scope's
        sessions, sequence numbers and roles; the FTS5 matches of the scope's rows, ordered by bm25), and only the
        chosen rows are joined with their sessions and messages.
        """
        if await self._recorded(conn) is None:
            return [], []
        filters, params = "", list[Any]()
        if scope.session is not None:
            filters, params = (
                " AND {t}.session_ref = (SELECT id FROM chatkeep_sessions WHERE key_hash = ?)",
                [scope.session],
            )
        elif scope.owner is not None:
            sessions = "SELECT id FROM chatkeep_sessions WHERE tenant_hash = ? AND owner = ?"
            filters, params = f" AND {{t}}.session_ref IN ({sessions})", [scope.tenant, scope.owner]
        if scope.before_seq is not None:
            filters, params = filters + " AND {t}.seq < ?", [*params, scope.before_seq]
        if scope.roles is not None:
            filters, params = filters + f" AND {{t}}.role IN ({_marks(len(scope.roles))})", [*params, *scope.roles]
        found = (
            ") best JOIN chatkeep_sessions s ON s.id = best.session_ref "
            "JOIN chatkeep_messages m ON m.session_ref = best.session_ref AND m.seq = best.seq"
        )
        by_vector: list[Sequence[Any]] = []
        if vector is not None:
            by_vector = list(
                await conn.fetch(
                    "SELECT s.session_id, best.seq, m.record, best.distance FROM (SELECT v.session_ref, v.seq, "
                    f"v.distance FROM {VEC_TABLE} v WHERE v.embedding MATCH ? AND k = ? AND v.tenant_key = ?"
                    + filters.format(t="v")
                    + found
                    + " ORDER BY best.distance, s.session_id, best.seq",
                    (_unit_blob(vector), min(limit, _MAX_K), scope.tenant.hex(), *params),
                )
            )
        by_words: list[Sequence[Any]] = []
        if terms:
            query = " OR ".join(f'"{term}"' for term in dict.fromkeys(terms))
            by_words = list(
                await conn.fetch(
                    "SELECT s.session_id, best.seq, m.record, best.r FROM (SELECT x.session_ref, x.seq, "
                    "bm25(chatkeep_search_fts) AS r FROM chatkeep_search_fts f "
                    "JOIN chatkeep_search x ON x.id = f.rowid "
                    "WHERE chatkeep_search_fts MATCH ? AND x.session_ref IN "
                    "(SELECT id FROM chatkeep_sessions WHERE tenant_hash = ?)"
                    + filters.format(t="x")
                    + " ORDER BY r, x.session_ref, x.seq LIMIT ?"
                    + found
                    + " ORDER BY best.r, s.session_id, best.seq",
                    (query, scope.tenant, *params, limit),
                )
            )
        return by_vector, by_words
