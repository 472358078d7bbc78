"""What the SQL store's search index does the same way on every database: the indexed append and the index's writes.

A database's index (``_search`` for PostgreSQL, ``_sqlite_search`` for SQLite) subclasses :class:`SearchIndex`
and says how it records the embedder, finds stored messages and writes index rows. The rules here: an indexed
append is ONE transaction (the recorded embedder checked, the new messages stored as a plain append stores them,
the index rows written), and the first indexed write makes the index (in a transaction of its own) and runs again.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from chatkeep.core.backend import IndexInfo
from chatkeep.sql import _ops
from chatkeep.sql._sql import Statements
from chatkeep.sql._transport import Connection

__all__ = ["IndexRow", "NoIndex", "Scope", "SearchIndex"]

#: One message to index: (message hash, role, its keywords, its vector), as the database's index stores them.
IndexRow = tuple[bytes, str, str, Any]


@dataclass(frozen=True, slots=True)
class Scope:
    """What a search looks in, as the tables key it: a tenant, and one session of it or one owner's sessions."""

    tenant: bytes  # the tenant's hash
    session: bytes | None = None  # the session's key hash
    owner: bytes | None = None
    before_seq: int | None = None
    roles: tuple[str, ...] | None = None


class NoIndex(Exception):
    """No embedder is recorded yet: the index must be made first (in a transaction of its own)."""


class SearchIndex(abc.ABC):
    """A database's search index, for one store."""

    def __init__(self, sql: Statements, description: str) -> None:
        self.sql = sql
        self.description = description

    async def append(
        self,
        conn: Connection,
        head: _ops.Head,
        now: int,
        rows: Sequence[_ops.Row],
        info: IndexInfo,
        index: Sequence[IndexRow],
    ) -> int:
        """Append ``rows`` and index ``index`` in one transaction; returns how many messages were new."""
        sql = self.sql

        async def body() -> int:
            checked = await self._checked(conn, info)
            found = await conn.fetch(sql.lock_session, (head[0],))
            new = rows
            if found:
                stored = await self._stored(conn, found[0][0], [row[0] for row in rows])
                new = [row for row in rows if row[0] not in stored]
            inserted = await _ops.insert(conn, sql, head, now, new) if new else 0
            await self._write_index(conn, checked, head, index)
            return inserted

        return await self._with_index(conn, info, body)

    async def index(self, conn: Connection, head: _ops.Head, info: IndexInfo, index: Sequence[IndexRow]) -> int:
        """Index stored messages (skipping any gone or indexed meanwhile); returns how many were indexed."""

        async def body() -> int:
            return await self._write_index(conn, await self._checked(conn, info), head, index)

        return await self._with_index(conn, info, body)

    async def _with_index(self, conn: Connection, info: IndexInfo, body: Callable[[], Awaitable[int]]) -> int:
        await self._usable(conn)
        try:
            return await _ops.transaction(conn, self.sql, body)
        except NoIndex:
            await self.switch(conn, info, replace=False)  # the first indexed write makes the index
        return await _ops.transaction(conn, self.sql, body)

    @abc.abstractmethod
    async def _usable(self, conn: Connection) -> None:
        """Raise ``SearchUnsupportedError`` when this database cannot index (before any transaction)."""

    @abc.abstractmethod
    async def index_info(self, conn: Connection) -> IndexInfo | None:
        """The recorded embedder; ``None`` when nothing is indexed yet."""

    @abc.abstractmethod
    async def unindexed(self, conn: Connection, key: bytes, info: IndexInfo, hashes: list[bytes]) -> set[bytes]:
        """Those of ``hashes`` the session stores that are not indexed (none when the index has another embedder)."""

    @abc.abstractmethod
    async def rankings(
        self, conn: Connection, scope: Scope, vector: Sequence[float] | None, terms: list[str], limit: int
    ) -> tuple[list[Sequence[Any]], list[Sequence[Any]]]:
        """Rows (session id, seq, record, score) of the best ``limit`` in ``scope`` by vector and by keywords."""

    @abc.abstractmethod
    async def unindex(self, conn: Connection, scope: Scope) -> int:
        """Delete the index rows of ``scope``'s sessions (a session, or a whole tenant); how many were deleted."""

    @abc.abstractmethod
    def rows(
        self, hashes: Sequence[bytes], roles: Sequence[str], texts: Sequence[str], vectors: Sequence[Any]
    ) -> list[IndexRow]:
        """The index rows of messages with a vector (those without one are not indexed)."""

    @abc.abstractmethod
    async def switch(self, conn: Connection, info: IndexInfo, *, replace: bool) -> None:
        """Record ``info`` and make the index for its width (dropping the old entries when it changes).

        Without ``replace``, an index already built with another embedder raises ``EmbedderMismatchError``.
        """

    @abc.abstractmethod
    async def _checked(self, conn: Connection, info: IndexInfo) -> Any:
        """In a transaction: check the recorded embedder against ``info`` (raise :class:`NoIndex` when none)."""

    @abc.abstractmethod
    async def _stored(self, conn: Connection, session_ref: int, hashes: list[bytes]) -> set[bytes]:
        """Those of ``hashes`` the session stores."""

    @abc.abstractmethod
    async def _write_index(self, conn: Connection, checked: Any, head: _ops.Head, rows: Sequence[IndexRow]) -> int:
        """Write the index rows of stored messages (``checked``: what :meth:`_checked` returned); how many."""
