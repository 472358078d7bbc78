"""The SQL store with the search capability: what ``open_store`` returns for a database that can search.

PostgreSQL stores can search (with the pgvector extension on the server: without it, indexing or searching
raises :class:`~chatkeep.core.SearchUnsupportedError` saying how to get it), and SQLite stores on the ``apsw``
transport (with sqlite-vec). MySQL/MariaDB stores and SQLite on ``sqlite3`` cannot: they are plain
:class:`~chatkeep.sql.SQLHistoryStore` objects without ``search``. The index itself is ``_search`` (PostgreSQL)
or ``_sqlite_search`` (SQLite).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chatkeep.core import Message, SessionKey
from chatkeep.core.backend import Candidate, IndexInfo, Rankings, SearchableStore, SearchScope, write_stamp
from chatkeep.sql._index import Scope, SearchIndex
from chatkeep.sql._schema import key_hash, message_hash, tenant_hash
from chatkeep.sql._search import PostgresSearch
from chatkeep.sql._store import SQLHistoryStore

__all__ = ["SearchableSQLHistoryStore"]


class SearchableSQLHistoryStore(SQLHistoryStore, SearchableStore):
    """A :class:`~chatkeep.sql.SQLHistoryStore` that indexes messages by meaning and by words, and searches them.

    :func:`~chatkeep.sql.open_store` (or ``SQLHistoryStore(url)``) returns one for a PostgreSQL URL and for
    ``sqlite://...?transport=apsw``. See
    ``docs/recall.md`` and :class:`~chatkeep.core.SupportsSearch`.
    """

    def __init__(self, url: str | None = None, *, client: Any = None, **options: Any) -> None:
        super().__init__(url, client=client, **options)
        if self.dialect == "postgresql":
            self._search: SearchIndex = PostgresSearch(self._sql, self._transport.description)
        else:
            from chatkeep.sql._sqlite_search import SQLiteSearch

            self._search = SQLiteSearch(self._sql, self._transport.description)

    async def _append_indexed(
        self,
        key: SessionKey,
        messages: Sequence[Message],
        records: Sequence[str],
        info: IndexInfo,
        vectors: Sequence[tuple[float, ...] | None],
    ) -> int:
        rows = self._rows(messages, records)
        hashes = [row[0] for row in rows]
        index = self._search.rows(hashes, [m.role for m in messages], [m.text for m in messages], vectors)
        head, now, search = self._head(key), write_stamp(), self._search
        return await self._run(lambda conn: search.append(conn, head, now, rows, info, index), write=True)

    async def _index_info(self) -> IndexInfo | None:
        search = self._search
        return await self._run(search.index_info)

    async def _rankings(
        self,
        scope: SearchScope,
        vector: tuple[float, ...] | None,
        terms: list[str],
        limit: int,
        before_seq: int | None,
        roles: frozenset[str] | None,
    ) -> Rankings:
        chosen = None if roles is None else tuple(sorted(roles))
        if isinstance(scope, SessionKey):
            digest = key_hash(scope.tenant, scope.session_id)
            where = Scope(tenant_hash(scope.tenant), digest, None, before_seq, chosen)
        else:
            owner = None if scope.owner is None else scope.owner.encode()
            where = Scope(tenant_hash(scope.tenant), None, owner, before_seq, chosen)
        search = self._search
        by_vector, by_words = await self._run(lambda conn: search.rankings(conn, where, vector, terms, limit))
        return Rankings(self._candidates(by_vector), self._candidates(by_words))

    async def _unindex(self, scope: SearchScope) -> int:
        if isinstance(scope, SessionKey):
            where = Scope(tenant_hash(scope.tenant), key_hash(scope.tenant, scope.session_id))
        else:
            where = Scope(tenant_hash(scope.tenant))
        search = self._search
        return await self._run(lambda conn: search.unindex(conn, where), write=True)

    def _candidates(self, rows: Sequence[Sequence[Any]]) -> list[Candidate]:
        messages = self._decode([row[2] for row in rows])
        return [
            Candidate(bytes(row[0]).decode(), int(row[1]), message) for row, message in zip(rows, messages, strict=True)
        ]

    async def _begin_reindex(self, info: IndexInfo) -> None:
        search = self._search
        await self._run(lambda conn: search.switch(conn, info, replace=True), write=True)

    async def _unindexed(self, key: SessionKey, info: IndexInfo, messages: Sequence[Message]) -> list[Message]:
        if not messages:
            return []
        hashes = [message_hash(message.message_id) for message in messages]
        digest, search = key_hash(key.tenant, key.session_id), self._search
        missing = await self._run(lambda conn: search.unindexed(conn, digest, info, hashes))
        return [message for message, h in zip(messages, hashes, strict=True) if h in missing]

    async def _index(
        self, key: SessionKey, info: IndexInfo, messages: Sequence[Message], vectors: Sequence[tuple[float, ...]]
    ) -> int:
        hashes = [message_hash(message.message_id) for message in messages]
        index = self._search.rows(hashes, [m.role for m in messages], [m.text for m in messages], vectors)
        head, search = self._head(key), self._search
        return await self._run(lambda conn: search.index(conn, head, info, index), write=True)
