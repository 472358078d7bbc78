"""The process-local store: every store opened on one namespace shares its data, guarded by one lock.

The critical sections never await, so every call is atomic even when its task is cancelled, and the
lock (a ``threading.Lock``) also serializes stores used from other threads' event loops.

A session's messages live in a chain of logs (:class:`_Log`): a fork's log refers to its source's log and
numbers its own messages on from the cut. A log a fork refers to is shared and never shrinks: a pop or a trim
of its session moves that session onto a new log (or only raises its first visible sequence number), and a
deleted session's log lives on, by reference, as long as a fork needs it (see docs/writing-a-plugin.md, Forks).
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
    ABSENT,
    Absent,
    Candidate,
    ForkInfo,
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
    fork_source_error,
    fork_target_exists_error,
    keyword_terms,
    owner_error,
    session_document,
    stamp_time,
    time_stamp,
    usage_of,
    write_stamp,
)
from chatkeep.core.backend import SessionUsage as Usage
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
class _Log:
    """Records numbered from ``start``; the sequence numbers below ``start`` are ``base``'s (``None``: none).

    ``shared`` once a fork refers to it: from then on its records never change (appends go on after them).
    """

    start: int = 0
    base: _Log | None = None
    records: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    usages: list[Usage] = field(default_factory=list)
    seq_by_id: dict[str, int] = field(default_factory=dict)
    shared: bool = False

    @property
    def end(self) -> int:
        return self.start + len(self.records)

    def spans(self, low: int, high: int) -> list[tuple[_Log, int, int]]:
        """The pieces of sequence numbers ``[low, high)``, oldest first: (log, first index, end index)."""
        pieces: list[tuple[_Log, int, int]] = []
        log: _Log | None = self
        while log is not None and high > low:
            if log.start < high:
                pieces.append((log, max(low, log.start) - log.start, high - log.start))
                high = log.start
            log = log.base
        return pieces[::-1]

    def records_in(self, low: int, high: int) -> list[str]:
        return [record for log, i, j in self.spans(low, high) for record in log.records[i:j]]

    def usage_in(self, low: int, high: int) -> Usage:
        total = Usage()
        for log, i, j in self.spans(low, high):
            for used in log.usages[i:j]:
                if used:
                    total += used
        return total

    def at(self, seq: int) -> tuple[_Log, int]:
        """The log holding sequence number ``seq`` and its index there."""
        log = self
        while seq < log.start:
            assert log.base is not None
            log = log.base
        return log, seq - log.start

    def find(self, message_id: str, low: int) -> int | None:
        """The sequence number of ``message_id`` among those this chain shows from ``low`` on, or ``None``."""
        log: _Log | None = self
        limit = self.end
        while log is not None and limit > low:
            seq = log.seq_by_id.get(message_id)
            if seq is not None and low <= seq < limit:
                return seq
            limit = min(limit, log.start)
            log = log.base
        return None


@dataclass(eq=False)
class _Session:
    """One session: its log, the first sequence number it shows (trims raise it), its usage, info and document."""

    created_at: datetime
    updated_at: datetime
    log: _Log = field(default_factory=_Log)
    first_seq: int = 0
    usage: Usage = field(default_factory=Usage)
    forked_from: ForkInfo | None = None
    title: str | None = None
    tags: frozenset[str] = frozenset()
    metadata: dict[str, Any] = field(default_factory=dict)
    expires_at: float | None = None  # deadline on the writing store's clock (time.monotonic unless given)
    document: str | None = None
    version: str | None = None
    owner: str | None = None
    entries: dict[str, _Entry] = field(default_factory=dict)  # message id -> its search index entry

    @property
    def records(self) -> list[str]:
        """The records of the session's own log (all of them, for a session that is not a fork)."""
        return self.log.records

    @property
    def count(self) -> int:
        return self.log.end - self.first_seq

    def seq(self, message_id: str) -> int | None:
        """The sequence number of a message the session holds, or ``None``."""
        return self.log.find(message_id, self.first_seq)

    def record(self, seq: int) -> str:
        log, index = self.log.at(seq)
        return log.records[index]

    def own_log(self) -> _Log:
        """The log to change: the session's own, or a new one on top of it when a fork refers to it."""
        if self.log.shared:
            self.log = _Log(self.log.end, self.log)
        return self.log

    def info(self, session_id: str, tenant: str) -> SessionInfo:
        return SessionInfo(
            session_id,
            tenant,
            self.count,
            self.created_at,
            self.updated_at,
            self.forked_from,
            self.usage,
            self.title,
            self.tags,
            dict(self.metadata),
        )


class _Namespace:
    """The data every store opened on one name shares: tenant -> session id -> session."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tenants: dict[str, dict[str, _Session]] = {}
        self.tagged: dict[str, dict[str, set[str]]] = {}  # tenant -> tag -> session ids: list_sessions(tag=...)
        self.index: IndexInfo | None = None  # the embedder the search index was built with

    def retag(self, tenant: str, session_id: str, old: frozenset[str], new: frozenset[str]) -> None:
        """Move ``session_id`` from the tag index entries of ``old`` to those of ``new``."""
        tags = self.tagged.setdefault(tenant, {})
        for tag in old - new:
            ids = tags.get(tag)
            if ids is not None:
                ids.discard(session_id)
                if not ids:
                    del tags[tag]
        for tag in new - old:
            tags.setdefault(tag, set()).add(session_id)
        if not tags:
            del self.tagged[tenant]

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
        # The session's logs stay alive as long as a fork refers to them: that is what keeps forks unchanged.
        removed = sessions.pop(session_id)
        if removed.tags:
            self.retag(tenant, session_id, removed.tags, frozenset())
        if not sessions:
            del self.tenants[tenant]

    def drop_tenant(self, tenant: str) -> None:
        self.tenants.pop(tenant, None)
        self.tagged.pop(tenant, None)


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
    creates_if_absent = True

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
            if session is None or session.seq(message.message_id) is None:
                new.append((message, record, vector))
            elif vector is not None and message.message_id not in session.entries:
                session.entries[message.message_id] = _entry(message, vector)  # stored before, indexed now
        if not new:
            return 0
        now = stamp_time(write_stamp())
        if session is None:
            session = data.tenants.setdefault(key.tenant, {})[key.session_id] = _Session(now, now)
        log = session.log  # appends go on after what a fork took, even on a shared log
        for message, record, vector in new:
            log.seq_by_id[message.message_id] = log.end
            log.ids.append(message.message_id)
            log.records.append(record)
            used = usage_of([message])
            log.usages.append(used)
            if used:
                session.usage += used
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
                for message_id, entry in session.entries.items():
                    seq = session.seq(message_id)
                    if seq is None:
                        continue
                    if (before_seq is None or seq < before_seq) and (roles is None or entry.role in roles):
                        found.append((session_id, session, seq, entry))
            by_vector = [] if query is None else sorted(found, key=lambda f: -_dot(query, f[3].vector))[:limit]
            by_words = _bm25(found, terms, limit)
            chosen = {(f[0], f[2]): f for f in (*by_vector, *by_words)}
            records = {ident: f[1].record(f[2]) for ident, f in chosen.items()}
        decoded = dict(zip(records, self._decode(list(records.values())), strict=True))

        def ranked(rows: list[tuple[str, _Session, int, _Entry]]) -> list[Candidate]:
            return [Candidate(sid, seq, decoded[(sid, seq)]) for sid, _, seq, _ in rows]

        return Rankings(ranked(by_vector), ranked(by_words))

    async def _unindex(self, scope: SearchScope) -> int:
        with self._data.lock:
            removed = 0
            for _, session in self._scope(scope):
                removed += len(session.entries)
                session.entries.clear()
            return removed

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
            return [
                m for m in messages if m.message_id not in session.entries and session.seq(m.message_id) is not None
            ]

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
                if message.message_id not in session.entries and session.seq(message.message_id) is not None:
                    session.entries[message.message_id] = _entry(message, vector)
                    indexed += 1
            return indexed

    async def _load(self, key: SessionKey, last: int | None) -> list[Message]:
        with self._data.lock:
            session = self._data.get(key, self._clock())
            if session is None:
                return []
            end = session.log.end
            low = session.first_seq if last is None else max(session.first_seq, end - last)
            records = session.log.records_in(low, end)
        return self._decode(records)

    async def _load_before(self, key: SessionKey, before: int, last: int | None) -> list[Message]:
        """The range ending before position ``before``: a slice of the log, decoding only its records (O(range))."""
        with self._data.lock:
            session = self._data.get(key, self._clock())
            if session is None:
                return []
            stop = min(session.first_seq + before, session.log.end)
            low = session.first_seq if last is None else max(session.first_seq, stop - last)
            records = session.log.records_in(low, stop)
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
                start = session.first_seq if seq is None else max(seq, session.first_seq)
                stop = min(start + batch, session.log.end)
                records = session.log.records_in(start, stop) if stop > start else []
                seq = stop
            if not records:
                return
            for message in self._decode(records):
                yield message

    async def _count(self, key: SessionKey) -> int:
        with self._data.lock:
            session = self._data.get(key, self._clock())
            return 0 if session is None else session.count

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
            removed = max(session.count - keep_last, 0)
            if removed:  # a trim that deletes is a write; one that deletes nothing changes nothing
                log, first = session.log, session.first_seq + removed
                session.usage -= log.usage_in(session.first_seq, first)
                for piece, i, j in log.spans(session.first_seq, first):
                    for message_id in piece.ids[i:j]:
                        session.entries.pop(message_id, None)
                session.first_seq = first
                if log.base is None and not log.shared:  # nothing else refers to the records: free them
                    cut = first - log.start
                    for message_id in log.ids[:cut]:
                        del log.seq_by_id[message_id]
                    del log.ids[:cut], log.records[:cut], log.usages[:cut]
                    log.start = first
                self._touch(session, stamp_time(write_stamp()))
            return removed

    async def _pop(self, key: SessionKey) -> Message | None:
        data = self._data
        with data.lock:
            session = data.get(key, self._clock())
            if session is None or not session.count:
                return None
            log = session.log
            seq = log.end - 1
            holder, index = log.at(seq)
            record, popped_id, used = holder.records[index], holder.ids[index], holder.usages[index]
            if holder is log and not log.shared:
                log.records.pop()
                log.ids.pop()
                log.usages.pop()
                del log.seq_by_id[popped_id]
            else:  # the newest message belongs to a log a fork refers to: leave it there, and show one less
                session.log = _Log(seq, log if log.records or log.shared else log.base)
            if used:
                session.usage -= used
            session.entries.pop(popped_id, None)
            self._touch(session, stamp_time(write_stamp()))
        return self._decode([record])[0]

    async def _fork(self, source: SessionKey, target: SessionKey, through: str | None) -> int:
        data = self._data
        with data.lock:
            now_clock = self._clock()
            if data.get(target, now_clock) is not None:
                raise fork_target_exists_error(target)
            origin = data.get(source, now_clock)
            if origin is None or not origin.count:
                raise fork_source_error(source, through)
            log = origin.log
            seq = log.end - 1 if through is None else origin.seq(through)
            if seq is None:
                raise fork_source_error(source, through)
            holder, index = log.at(seq)
            log.shared = True  # its records up to the cut are the fork's now too: they never change again
            now = stamp_time(write_stamp())
            fork = _Session(
                now,
                now,
                log=_Log(seq + 1, log),
                first_seq=origin.first_seq,
                usage=origin.usage - log.usage_in(seq + 1, log.end),
                forked_from=ForkInfo(source.session_id, holder.ids[index]),
                title=origin.title,
                tags=origin.tags,
                metadata=dict(origin.metadata),
            )
            data.tenants.setdefault(target.tenant, {})[target.session_id] = fork
            if fork.tags:
                data.retag(target.tenant, target.session_id, frozenset(), fork.tags)
            self._touch(fork, now)
            return fork.count

    async def _usage(self, key: SessionKey) -> Usage:
        with self._data.lock:
            session = self._data.get(key, self._clock())
            return Usage() if session is None else session.usage

    async def _update_info(
        self, key: SessionKey, title: str | None, tags: frozenset[str] | None, metadata: dict[str, Any] | None
    ) -> bool:
        data = self._data
        with data.lock:
            session = data.get(key, self._clock())
            if session is None:
                return False
            if title is not None:
                session.title = title or None
            if tags is not None:
                data.retag(key.tenant, key.session_id, session.tags, tags)
                session.tags = tags
            if metadata is not None:
                session.metadata = metadata
            self._touch(session, stamp_time(write_stamp()))
            return True

    async def _list_sessions(self, tenant: str, limit: int, cursor: str | None) -> SessionPage:
        with self._data.lock:
            listed = list(self._data.live(tenant, self._clock()))
        return _page(tenant, listed, limit, cursor)

    async def _session_info(self, key: SessionKey) -> SessionInfo | None:
        with self._data.lock:
            session = self._data.get(key, self._clock())
            return None if session is None else session.info(key.session_id, key.tenant)

    async def _list_tagged_sessions(self, tenant: str, tag: str, limit: int, cursor: str | None) -> SessionPage:
        data = self._data
        with data.lock:
            now = self._clock()
            listed = []
            for session_id in list(data.tagged.get(tenant, {}).get(tag, ())):  # the tag index: no scan of the tenant
                session = data.get(SessionKey(tenant, session_id), now)
                if session is not None:
                    listed.append((session_id, session))
        return _page(tenant, listed, limit, cursor)

    async def _save_session(
        self, key: SessionKey, session: AgentSession, expected_version: str | Absent | None, owner: str | None
    ) -> str:
        document = session_document(session)
        data = self._data
        with data.lock:
            stored = data.get(key, self._clock())
            if owner is not None and stored is not None and stored.owner not in (None, owner):
                raise owner_error()
            current = None if stored is None else stored.version
            if expected_version is ABSENT and current is not None:
                raise conflict_error(key.session_id, ABSENT, exists=True)
            if isinstance(expected_version, str) and current != expected_version:
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
            self._data.drop_tenant(tenant)
        return removed


def _page(tenant: str, listed: list[tuple[str, _Session]], limit: int, cursor: str | None) -> SessionPage:
    """One page of ``listed``, newest first, after ``cursor``."""
    after = None if cursor is None else decode_cursor(cursor, int, str)
    # Keyset pagination on (updated_at, session_id): stable while sessions are added between pages.
    rows = sorted(((s.updated_at, session_id, s) for session_id, s in listed), key=lambda r: r[:2], reverse=True)
    if after is not None:
        rows = [row for row in rows if (time_stamp(row[0]), row[1]) < after]
    page = [session.info(session_id, tenant) for _, session_id, session in rows[: limit + 1]]
    if len(page) > limit:
        last = page[limit - 1]
        return SessionPage(page[:limit], encode_cursor(time_stamp(last.updated_at), last.session_id))
    return SessionPage(page)


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
