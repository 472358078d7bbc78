"""The process-local store: every store opened on one namespace shares its data, guarded by one lock.

The critical sections never await, so every call is atomic even when its task is cancelled, and the
lock (a ``threading.Lock``) also serializes stores used from other threads' event loops.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from chatkeep.core import AgentSession, BackendHistoryProvider, Message, SessionInfo, SessionKey, SessionPage
from chatkeep.core.backend import (
    HistoryStore,
    StoredSession,
    conflict_error,
    decode_cursor,
    decode_records,
    decode_session_document,
    encode_cursor,
    owner_error,
    session_document,
    stamp_time,
    time_stamp,
    write_stamp,
)
from chatkeep.memory._config import parse_url

__all__ = ["MemoryHistoryProvider", "MemoryHistoryStore", "open_store"]


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


class _Namespace:
    """The data every store opened on one name shares: tenant -> session id -> session."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tenants: dict[str, dict[str, _Session]] = {}

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


class MemoryHistoryStore(HistoryStore):
    """A :class:`~chatkeep.core.HistoryStore` in this process's memory, for tests, demos and single-process apps.

    Stores opened with the same namespace share their data (within the process), so several instances
    behave like several connections to one server. Messages are kept as the same versioned records other
    backends store, so the size limit and the record format are exercised here too.

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
        data = self._data
        with data.lock:
            session = data.get(key, self._clock())
            new = [
                (message.message_id, record)
                for message, record in zip(messages, records, strict=True)
                if session is None or message.message_id not in session.id_set
            ]
            if not new:
                return 0
            now = stamp_time(write_stamp())
            if session is None:
                session = data.tenants.setdefault(key.tenant, {})[key.session_id] = _Session(now, now)
            for message_id, record in new:
                session.ids.append(message_id)
                session.records.append(record)
                session.id_set.add(message_id)
            self._touch(session, now)
            return len(new)

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
            session.id_set.discard(session.ids.pop())
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
