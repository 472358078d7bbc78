"""The contract every storage backend implements: :class:`HistoryStore`.

Every call but ``open_store`` is async and takes a :class:`SessionKey`. The conformance kit in
``chatkeep.core.testing`` proves a backend honours each rule written in these docstrings.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from types import TracebackType
from typing import Any, NamedTuple

from typing_extensions import Self

from chatkeep.core._errors import SessionOwnershipError, StoreClosedError, StoreLoopError
from chatkeep.core._messages import Message
from chatkeep.core._session import DEFAULT_TENANT, AgentSession, validate_id

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "HistoryStore",
    "SessionInfo",
    "SessionKey",
    "SessionPage",
    "StoredSession",
    "cutoff_time",
    "ttl_seconds",
]

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SessionKey:
    """Addresses one conversation in a store: a tenant and a session id, both compared exactly.

    Raises:
        InvalidSessionKeyError: an id is empty, longer than 1,024 characters or not valid unicode.
    """

    tenant: str = DEFAULT_TENANT
    session_id: str = field(default="")

    def __post_init__(self) -> None:
        validate_id(self.tenant, "tenant")
        validate_id(self.session_id, "session_id")

    @classmethod
    def of(cls, session: AgentSession) -> SessionKey:
        """The key of ``session`` (its tenant and session id)."""
        return cls(session.tenant, session.session_id)


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """What ``list_sessions`` tells about one stored session."""

    session_id: str
    tenant: str
    message_count: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class SessionPage:
    """One page of ``list_sessions``, newest first; pass ``next_cursor`` back for the next (``None`` at the end)."""

    items: list[SessionInfo]
    next_cursor: str | None = None


class StoredSession(NamedTuple):
    """A session document read by ``load_session`` and its opaque version (pass it to ``save_session``)."""

    session: AgentSession
    version: str


def ttl_seconds(ttl: timedelta | float | int | None) -> float | None:
    """Normalize a TTL option (a ``timedelta`` or seconds) to positive seconds, or ``None``."""
    if ttl is None:
        return None
    seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else float(ttl)
    if seconds <= 0:
        raise ValueError(f"ttl must be positive, got {ttl!r}; pass None for no expiry")
    return seconds


def cutoff_time(older_than: timedelta | datetime) -> datetime:
    """Turn ``prune``'s ``older_than`` (an age, or an aware datetime) into a UTC cut-off."""
    if isinstance(older_than, timedelta):
        return datetime.now(timezone.utc) - older_than
    if older_than.tzinfo is None:
        raise ValueError(
            "older_than must be timezone-aware (for example datetime.now(timezone.utc) - timedelta(days=30))"
        )
    return older_than.astimezone(timezone.utc)


class HistoryStore(abc.ABC):
    """Base class of a storage backend. Subclass it, implement the abstract methods, and pass the conformance kit.

    The base class keeps the lifecycle rules every backend shares: ``close()`` is idempotent, a closed
    store raises :class:`StoreClosedError`, and a store used from another event loop than the one it
    first ran on raises :class:`StoreLoopError` (drivers' connections belong to one loop).

    Contract, per call:

    * ``append`` is atomic (all or none, also when cancelled), acknowledged when it returns, and
      idempotent by ``message_id`` for messages still stored; it returns how many messages were new.
      Its cost does not depend on the history's length.
    * ``load`` returns messages in append order; ``last=k`` reads only the k newest.
    * ``iter_messages`` pages through the whole history in constant memory.
    * ``count``, ``delete``, ``trim`` are exact; ``delete`` removes everything the key owned.
    * ``list_sessions`` lists one tenant's sessions, newest first, by pages.
    * ``save_session``/``load_session`` keep whole-session documents with opaque versions. A version is
      never reused for a key, even after a delete, so a stale writer cannot overwrite a newer document.
      Saving a session under a key of another tenant raises :class:`SessionOwnershipError`.
    * ``prune`` and ``delete_tenant`` remove old sessions and whole tenants.
    * Tenant-wide calls (``list_sessions``, ``prune(tenant=...)``, ``delete_tenant``) validate the tenant
      like a :class:`SessionKey` does (an empty tenant raises :class:`InvalidSessionKeyError`).
    * With a TTL, a session (messages and document) expires as a whole; every write restarts its TTL,
      and an expired session is invisible to every call, ``list_sessions`` included.
    * ``owner=None`` asserts nothing: a document bound to an owner still loads without one.
    * Driver errors are raised as :class:`StoreUnavailableError` with the driver's exception as the cause.
    """

    #: Each stored message record may be at most this many bytes (UTF-8).
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES

    def __init__(self, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.max_message_bytes = max_message_bytes
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    # -- lifecycle shared by every backend -------------------------------------------------------

    def _check_usable(self) -> None:
        """Raise unless this store is open and used from its own event loop; call at the top of every method."""
        if self._closed:
            raise StoreClosedError(f"{type(self).__name__} is closed; open a new store to keep using it")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            if self._loop.is_closed():
                # The loop it ran on is gone (a previous asyncio.run); its connections died with it.
                self._loop = loop
                self._on_loop_change()
                return
            raise StoreLoopError(
                f"{type(self).__name__} was opened on another event loop than the one running now; "
                "open one store per event loop (for example one per thread running asyncio.run)"
            )

    @staticmethod
    def _check_session_tenant(key: SessionKey, session: AgentSession) -> None:
        """Refuse to save a session under another tenant's key (call at the top of ``save_session``)."""
        if session.tenant != key.tenant:
            raise SessionOwnershipError(
                f"the session belongs to tenant {session.tenant!r}, not to the key's tenant {key.tenant!r}; "
                "save it under SessionKey.of(session)"
            )

    def _on_loop_change(self) -> None:  # noqa: B027 - optional hook
        """Drop connections bound to a closed event loop (override when the backend keeps any)."""

    async def close(self) -> None:
        """Release connections; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not loop and self._loop.is_closed():
            # Connections of a loop that is gone cannot be closed gracefully: drop them, then release the rest.
            self._loop = loop
            self._on_loop_change()
        await self._aclose()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    async def _aclose(self) -> None:  # noqa: B027 - optional hook
        """Release the backend's resources (called once by :meth:`close`)."""

    async def __aenter__(self) -> Self:
        if self._closed:
            raise StoreClosedError(f"{type(self).__name__} is closed; open a new store to use it in async with")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- the contract ----------------------------------------------------------------------------

    @abc.abstractmethod
    async def append(self, key: SessionKey, messages: Sequence[Message]) -> int:
        """Append messages atomically; messages whose ``message_id`` is already stored are skipped.

        Returns:
            How many messages were new.

        Raises:
            MessageTooLargeError: a message is over ``max_message_bytes`` (nothing is stored).
            StoreUnavailableError: the server failed (nothing is stored).
        """

    @abc.abstractmethod
    async def load(self, key: SessionKey, *, last: int | None = None) -> list[Message]:
        """Return the history in append order; with ``last=k``, only the k newest (reading only those)."""

    @abc.abstractmethod
    def iter_messages(self, key: SessionKey, *, batch: int = 1000) -> AsyncIterator[Message]:
        """Iterate over the whole history in append order, ``batch`` messages per read."""

    @abc.abstractmethod
    async def count(self, key: SessionKey) -> int:
        """How many messages the session holds."""

    @abc.abstractmethod
    async def delete(self, key: SessionKey) -> bool:
        """Delete the session's messages and document; ``True`` if anything was there."""

    @abc.abstractmethod
    async def trim(self, key: SessionKey, keep_last: int) -> int:
        """Delete all but the ``keep_last`` newest messages; returns how many were deleted."""

    @abc.abstractmethod
    async def list_sessions(
        self, tenant: str = DEFAULT_TENANT, *, limit: int = 100, cursor: str | None = None
    ) -> SessionPage:
        """List one tenant's sessions, most recently updated first."""

    @abc.abstractmethod
    async def save_session(
        self,
        key: SessionKey,
        session: AgentSession,
        *,
        expected_version: str | None = None,
        owner: str | None = None,
    ) -> str:
        """Store a whole-session document and return its new version.

        Args:
            key: where to store it (its tenant must be the session's tenant).
            session: the session to store (as ``session.to_dict()``).
            expected_version: ``None`` writes unconditionally; a version from ``load_session`` or an earlier
                ``save_session`` writes only if the stored document still has that version.
            owner: binds the document to a user within the tenant; a document bound to another owner is refused.

        Raises:
            ConcurrencyConflictError: the stored version is not ``expected_version`` (or there is none).
            SessionOwnershipError: the document belongs to another owner.
        """

    @abc.abstractmethod
    async def load_session(self, key: SessionKey, *, owner: str | None = None) -> StoredSession | None:
        """Read a session document and its version; ``None`` when there is none.

        Another tenant's key is simply not found.

        Raises:
            SessionOwnershipError: ``owner`` is given and the document is bound to another owner.
        """

    @abc.abstractmethod
    async def prune(self, *, older_than: timedelta | datetime, tenant: str | None = None) -> int:
        """Delete sessions not updated since ``older_than`` (an age or a cut-off time); returns how many."""

    @abc.abstractmethod
    async def delete_tenant(self, tenant: str) -> int:
        """Delete every session of a tenant; returns how many sessions were deleted."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__}{' closed' if self._closed else ''}>"

    def describe(self) -> dict[str, Any]:
        """What this store is, for logs and the CLI (no secrets)."""
        return {"type": type(self).__name__}
