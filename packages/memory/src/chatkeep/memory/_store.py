"""The process-local store: every store opened on one namespace shares its data, guarded by one lock.

The critical sections never await, so every call is atomic even when its task is cancelled, and the
lock (a ``threading.Lock``) also serializes stores used from other threads' event loops.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from chatkeep.core import AgentSession, BackendHistoryProvider, Message, SessionInfo, SessionKey, SessionPage
from chatkeep.core.backend import (
    Candidate,
    IndexInfo,
    Rankings,
    SearchableStore,
    SearchScope,
    StoredSession,
    check_index,
    conflict_error,
    decode_cursor,
    decode_records,
    decode_session_document,
    encode_cursor,
    keyword_terms,
    owner_error,
    session_document,
    stamp_time,
    time_stamp,
    write_stamp,
)
from chatkeep.memory._config import parse_url

__all__ = ["MemoryHistoryProvider", "MemoryHistoryStore", "open_store"]


# BM25's constants: term-frequency saturation and length normalization (the usual values).
_BM25_K1 = 1.2
_BM25_B = 0.75


@dataclass(eq=False, slots=True)
class _Entry:
    """What the search index holds of one message: its unit vector and its keyword counts."""

    role: str
    vector: tuple[float, ...]
    terms: Counter[str]
    length: int


def _unit(vector: Sequence[float]) -> tuple[float, ...]:
    norm = math.sqrt(sum(x * x for x in vector))
    return tuple(vector) if norm == 0 else tuple(x / norm for x in vector)


def _entry(message: Message, vector: Sequence[float]) -> _Entry:
    terms = keyword_terms(message.text)
    return _Entry(message.role, _unit(vector), Counter(terms), len(terms))


@dataclass(eq=False)
class _Session:
    """One session's data. ``records[i]`` has sequence number ``first_seq + i``; trims advance ``first_seq``."""

    created_at: datetime
    updated_at: datetime
    records: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    id_set: set[str] = field(default_factory=set)
    first_seq: int = 0
    expires_at: float | None = None  # deadline on the writing store's clock (time.monotonic unless given)
    document: str | None = None
    version: str | None = None
    owner: str | None = None
    entries: dict[str, _Entry] = field(default_factory=dict)  # message id -> its search index entry

    def seq_of(self) -> dict[str, int]:
        """Each stored message id's sequence number."""
        return {message_id: self.first_seq + n for n, message_id in enumerate(self.ids)}


class _Namespace:
    """The data every store opened on one name shares: tenant -> session id -> session."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tenants: dict[str, dict[str, _Session]] = {}
        self.index: IndexInfo | None = None  # the embedder the search index was built with

    def get(self, key: SessionKey, now: float) -> _Session | None:
        """The live session at ``key`` at time ``now``; an expired one is removed on the way."""
        sessions = self.tenants.get(key.tenant)
        session = None if sessions is None else sessions.get(key.session_id)
        if session is not None and _expired(session, now):
            self.remove(key.tenant, key.session_id)
            return None
        return session

    def live(self, tenant: str, now: float) -> Iterator[tuple[str, _Session]]:
        """The live sessions of ``tenant`` at time ``now``, purging expired ones."""
        sessions = self.tenants.get(tenant, {})
        for session_id in [sid for sid, s in sessions.items() if _expired(s, now)]:
            self.remove(tenant, session_id)
        yield from list(self.tenants.get(tenant, {}).items())

    def remove(self, tenant: str, session_id: str) -> None:
        sessions = self.tenants[tenant]
        del sessions[session_id]
        if not sessions:
            del self.tenants[tenant]


def _expired(session: _Session, now: float) -> bool:
    return session.expires_at is not None and session.expires_at <= now


_namespaces: dict[str, _Namespace] = {}
_namespaces_lock = threading.Lock()


def _namespace(name: str) -> _Namespace:
    with _namespaces_lock:
        return _namespaces.setdefault(name, _Namespace())


class MemoryHistoryStore(SearchableStore):
    """A :class:`~chatkeep.core.HistoryStore` in this process's memory, for tests, demos and single-process apps.

    Stores opened with the same namespace share their data (within the process), so several instances
    behave like several connections to one server. Messages are kept as the same versioned records other
    backends store, so the size limit and the record format are exercised here too. It can search its messages
    (:class:`~chatkeep.core.SupportsSearch`): a vector and a BM25 keyword index per session, scanned whole.

    Args:
        url: ``memory://[NAME][?ttl=SECONDS&max_message_bytes=N]``; ``NAME`` is the namespace (default ``default``).
        clock: the time source of ``ttl``, in seconds (default :func:`time.monotonic`). Stores sharing a
            namespace share one clock: tests pass a fake one (``chatkeep.testing.FakeClock``) to each, to let
            sessions expire without waiting.
        **options: the URL's options as keywords: ``namespace``, ``ttl`` (seconds or a ``timedelta`` an idle
            session lives; each write by this store restarts it), ``max_message_bytes``.

    Raises:
        MemoryURLError: the URL or an option is unknown or malformed.
    """

    serves_any_loop = True  # its data is guarded by a threading.Lock: nothing belongs to an event loop

    def __init__(self, url: str | None = None, *, clock: Callable[[], float] = time.monotonic, **options: Any) -> None:
        settings = parse_url(url, **options)
        self._clock = clock
        super().__init__(max_message_bytes=settings.max_message_bytes)
        self.namespace = settings.namespace
        self.ttl = settings.ttl
        self._data = _namespace(settings.namespace)
        self._messages_read = 0

    @property
    def messages_read(self) -> int:
        """How many message records this instance has read (the conformance kit's read probe)."""
        return self._messages_read

    def describe(self) -> dict[str, Any]:
        """What this store is, for logs and the CLI."""
        return {"type": type(self).__name__, "namespace": self.namespace, "ttl": self.ttl}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} namespace={self.namespace!r}{' closed' if self.closed else ''}>"

    def _touch(self, session: _Session, now: datetime) -> None:
        session.updated_at = now
        if self.ttl is not None:
            session.expires_at = self._clock() + self.ttl

    def _decode(self, records: Sequence[str]) -> list[Message]:
        self._messages_read += len(records)
        return decode_records(records)

    async def _append(self, key: SessionKey, messages: Sequence[Message], records: Sequence[str]) -> int:
        with self._data.lock:
            return self._store(key, messages, records, [None] * len(messages))

    def _store(
        self,
        key: SessionKey,
        messages: Sequence[Message],
        records: Sequence[str],
        vectors: Sequence[Sequence[float] | None],
    ) -> int:
        """Store the new messages (indexing those with a vector); the caller holds the lock."""
        data = self._data
        session = data.get(key, self._clock())
        new = []
        for message, record, vector in zip(messages, records, vectors, strict=True):
            if session is None or message.message_id not in session.id_set:
                new.append((message, record, vector))
            elif vector is not None and message.message_id not in session.entries:
                session.entries[message.message_id] = _entry(message, vector)  # stored before, indexed now
        if not new:
            return 0
        now = stamp_time(write_stamp())
        if session is None:
            session = data.tenants.setdefault(key.tenant, {})[key.session_id] = _Session(now, now)
        for message, record, vector in new:
            session.ids.append(message.message_id)
            session.records.append(record)
            session.id_set.add(message.message_id)
            if vector is not None:
                session.entries[message.message_id] = _entry(message, vector)
        self._touch(session, now)
        return len(new)

    async def _append_indexed(
        self,
        key: SessionKey,
        messages: Sequence[Message],
        records: Sequence[str],
        info: IndexInfo,
        vectors: Sequence[tuple[float, ...] | None],
    ) -> int:
        data = self._data
        with data.lock:
            check_index(data.index, info)
            if data.index is None and any(vector is not None for vector in vectors):
                data.index = info
            return self._store(key, messages, records, vectors)

    async def _index_info(self) -> IndexInfo | None:
        with self._data.lock:
            return self._data.index

    def _scope(self, scope: SearchScope) -> list[tuple[str, _Session]]:
        """The live sessions ``scope`` covers; the caller holds the lock."""
        if isinstance(scope, SessionKey):
            session = self._data.get(scope, self._clock())
            return [] if session is None else [(scope.session_id, session)]
        return [
            (sid, s)
            for sid, s in self._data.live(scope.tenant, self._clock())
            if scope.owner is None or s.owner == scope.owner
        ]

    async def _rankings(
        self,
        scope: SearchScope,
        vector: tuple[float, ...] | None,
        terms: list[str],
        limit: int,
        before_seq: int | None,
        roles: frozenset[str] | None,
    ) -> Rankings:
        query = None if vector is None else _unit(vector)
        with self._data.lock:
            found: list[tuple[str, _Session, int, _Entry]] = []
            for session_id, session in self._scope(scope):
                seqs = session.seq_of()
                for message_id, entry in session.entries.items():
                    seq = seqs[message_id]
                    if (before_seq is None or seq < before_seq) and (roles is None or entry.role in roles):
                        found.append((session_id, session, seq, entry))
            by_vector = [] if query is None else sorted(found, key=lambda f: -_dot(query, f[3].vector))[:limit]
            by_words = _bm25(found, terms, limit)
            chosen = {(f[0], f[2]): f for f in (*by_vector, *by_words)}
            records = {ident: f[1].records[f[2] - f[1].first_seq] for ident, f in chosen.items()}
        decoded = dict(zip(records, self._decode(list(records.values())), strict=True))

        def ranked(rows: list[tuple[str, _Session, int, _Entry]]) -> list[Candidate]:
            return [Candidate(sid, seq, decoded[(sid, seq)]) for sid, _, seq, _ in rows]

        return Rankings(ranked(by_vector), ranked(by_words))

    async def _begin_reindex(self, info: IndexInfo) -> None:
        data = self._data
        with data.lock:
            if data.index != info:
                for sessions in data.tenants.values():
                    for session in sessions.values():
                        session.entries.clear()
                data.index = info

    async def _unindexed(self, key: SessionKey, info: IndexInfo, messages: Sequence[Message]) -> list[Message]:
        with self._data.lock:
            session = self._data.get(key, self._clock())
            if session is None or self._data.index != info:
                return []
            return [m for m in messages if m.message_id in session.id_set and m.message_id not in session.entries]

    async def _index(
        self, key: SessionKey, info: IndexInfo, messages: Sequence[Message], vectors: Sequence[tuple[float, ...]]
    ) -> int:
        data = self._data
        with data.lock:
            check_index(data.index, info)  # another reindex may have switched the embedder meanwhile
            session = data.get(key, self._clock())
            if session is None:
                return 0
            indexed = 0
            for message, vector in zip(messages, vectors, strict=True):
                if message.message_id in session.id_set and message.message_id not in session.entries:
                    session.entries[message.message_id] = _entry(message, vector)
                    indexed += 1
            return indexed

    async def _load(self, key: SessionKey, last: int | None) -> list[Message]:
        with self._data.lock:
            session = self._data.get(key, self._clock())
            if session is None:
                return []
            records = session.records[-last:] if last is not None else list(session.records)
        return self._decode(records)

    async def _iter_messages(self, key: SessionKey, batch: int) -> AsyncIterator[Message]:
        origin: _Session | None = None
        seq: int | None = None
        while True:
            with self._data.lock:
                session = self._data.get(key, self._clock())
                if session is None or (origin is not None and session is not origin):
                    return  # deleted (and maybe re-created) while we read
                origin = session
                start = 0 if seq is None else max(seq - session.first_seq, 0)
                records = session.records[start : start + batch]
                seq = session.first_seq + start + len(records)
            if not records:
                return
            for message in self._decode(records):
                yield message

    async def _count(self, key: SessionKey) -> int:
        with self._data.lock:
            session = self._data.get(key, self._clock())
            return 0 if session is None else len(session.records)

    async def _delete(self, key: SessionKey) -> bool:
        with self._data.lock:
            if self._data.get(key, self._clock()) is None:
                return False
            self._data.remove(key.tenant, key.session_id)
            return True

    async def _trim(self, key: SessionKey, keep_last: int) -> int:
        data = self._data
        with data.lock:
            session = data.get(key, self._clock())
            if session is None:
                return 0
            removed = max(len(session.records) - keep_last, 0)
            if removed:  # a trim that deletes is a write; one that deletes nothing changes nothing
                session.id_set.difference_update(session.ids[:removed])
                for message_id in session.ids[:removed]:
                    session.entries.pop(message_id, None)
                del session.ids[:removed], session.records[:removed]
                session.first_seq += removed
                self._touch(session, stamp_time(write_stamp()))
            return removed

    async def _pop(self, key: SessionKey) -> Message | None:
        data = self._data
        with data.lock:
            session = data.get(key, self._clock())
            if session is None or not session.records:
                return None
            record = session.records.pop()
            popped_id = session.ids.pop()
            session.id_set.discard(popped_id)
            session.entries.pop(popped_id, None)
            self._touch(session, stamp_time(write_stamp()))
        return self._decode([record])[0]

    async def _list_sessions(self, tenant: str, limit: int, cursor: str | None) -> SessionPage:
        after = None if cursor is None else decode_cursor(cursor, int, str)
        with self._data.lock:
            rows = [
                (s.updated_at, session_id, len(s.records), s.created_at)
                for session_id, s in self._data.live(tenant, self._clock())
            ]
        # Keyset pagination on (updated_at, session_id): stable while sessions are added between pages.
        rows.sort(reverse=True)
        if after is not None:
            rows = [row for row in rows if (time_stamp(row[0]), row[1]) < after]
        page = [
            SessionInfo(session_id, tenant, count, created, updated) for updated, session_id, count, created in rows
        ]
        if len(page) > limit:
            last = page[limit - 1]
            return SessionPage(page[:limit], encode_cursor(time_stamp(last.updated_at), last.session_id))
        return SessionPage(page)

    async def _save_session(
        self, key: SessionKey, session: AgentSession, expected_version: str | None, owner: str | None
    ) -> str:
        document = session_document(session)
        data = self._data
        with data.lock:
            stored = data.get(key, self._clock())
            if owner is not None and stored is not None and stored.owner not in (None, owner):
                raise owner_error()
            current = None if stored is None else stored.version
            if expected_version is not None and current != expected_version:
                raise conflict_error(key.session_id, expected_version, exists=current is not None)
            now = stamp_time(write_stamp())
            if stored is None:
                stored = data.tenants.setdefault(key.tenant, {})[key.session_id] = _Session(now, now)
            stored.document, stored.version = document, uuid.uuid4().hex
            if owner is not None:
                stored.owner = owner
            self._touch(stored, now)
            return stored.version

    async def _load_session(self, key: SessionKey) -> StoredSession | None:
        with self._data.lock:
            stored = self._data.get(key, self._clock())
            if stored is None or stored.document is None or stored.version is None:
                return None
            document, version, owner = stored.document, stored.version, stored.owner
        return decode_session_document(key, document, version, owner)

    async def _prune(self, cutoff: datetime, tenant: str | None) -> int:
        removed = 0
        with self._data.lock:
            for name in [tenant] if tenant is not None else list(self._data.tenants):
                for session_id, session in self._data.live(name, self._clock()):
                    if session.updated_at < cutoff:
                        self._data.remove(name, session_id)
                        removed += 1
        return removed

    async def _list_tenants(self) -> list[str]:
        with self._data.lock:
            # live() drops expired sessions, and a tenant left without any.
            return [tenant for tenant in list(self._data.tenants) if next(self._data.live(tenant, self._clock()), None)]

    async def _delete_tenant(self, tenant: str) -> int:
        with self._data.lock:
            removed = len(list(self._data.live(tenant, self._clock())))
            self._data.tenants.pop(tenant, None)
        return removed


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def _bm25(found: list[tuple[str, _Session, int, _Entry]], terms: list[str], limit: int) -> list[Any]:
    """The ``limit`` entries of ``found`` that hold any of ``terms``, best first by BM25 over ``found``."""
    if not terms or not found:
        return []
    count = len(found)
    average = sum(f[3].length for f in found) / count or 1.0
    wanted = set(terms)
    frequency = Counter(term for f in found for term in wanted.intersection(f[3].terms))
    idf = {term: math.log(1 + (count - n + 0.5) / (n + 0.5)) for term, n in frequency.items()}
    scored = []
    for f in found:
        entry = f[3]
        score = 0.0
        for term in terms:
            tf = entry.terms.get(term, 0)
            if tf:
                norm = _BM25_K1 * (1 - _BM25_B + _BM25_B * entry.length / average)
                score += idf[term] * tf * (_BM25_K1 + 1) / (tf + norm)
        if score > 0:
            scored.append((score, f))
    scored.sort(key=lambda pair: -pair[0])
    return [f for _, f in scored[:limit]]


def open_store(url: str = "memory://", **options: Any) -> MemoryHistoryStore:
    """Open a store from ``memory://[NAME][?ttl=SECONDS&max_message_bytes=N]``; keyword options override the query.

    Raises:
        MemoryURLError: the URL or an option is unknown or malformed.
    """
    return MemoryHistoryStore(url, **options)


class MemoryHistoryProvider(BackendHistoryProvider):
    """A history provider keeping each session's messages in this process's memory (``memory://``).

    Takes the arguments every named provider takes: ``MemoryHistoryProvider("memory://app", max_messages=20)``.
    """

    store_class = MemoryHistoryStore
    default_url = "memory://"
