"""The protected hooks a backend implements under :class:`~chatkeep.core.backend.HistoryStore`, and their defaults.

:class:`StoreHooks` declares them: the abstract ones every backend writes (``_append``, ``_load``, ...), and the
optional ones with a default. ``_load_before`` (a range of the history) defaults to streaming ``_iter_messages``.
The defaults of calls a backend may lack (``_pop``, ``_fork``, ``_usage``,
``_update_info``, ``_list_tagged_sessions``, ``_list_tenants``) refuse with the upgrade to ask for, rather than
emulate an atomic step with several racing ones; ``_prune``, ``_delete_tenant`` and ``_session_info`` are derived
from hooks every backend has (:mod:`._retention`, :func:`~._paging.listed_sessions`). A hook is only called by the
public methods, with checked arguments.
"""

from __future__ import annotations

import abc
import collections
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from chatkeep.core._errors import SearchUnsupportedError, UnsupportedOperationError
from chatkeep.core._messages import Message
from chatkeep.core._session import AgentSession
from chatkeep.core._telemetry import TelemetryTarget
from chatkeep.core.backend._info import SessionUsage
from chatkeep.core.backend._paging import listed_sessions
from chatkeep.core.backend._refusals import feature_unsupported_error, search_unsupported_error
from chatkeep.core.backend._retention import delete_listed_sessions, prune_listed_sessions
from chatkeep.core.backend._sessions import Absent, SessionInfo, SessionKey, SessionPage, StoredSession

if TYPE_CHECKING:
    from chatkeep.core.backend._search import Embeddings

__all__ = ["StoreHooks"]


class StoreHooks(abc.ABC):
    """The hooks of a storage backend, called by :class:`~chatkeep.core.backend.HistoryStore`'s public methods.

    Subclass :class:`~chatkeep.core.backend.HistoryStore`, not this: it checks arguments and state before any hook.
    """

    # -- lifecycle ---------------------------------------------------------------------------------

    def _one_loop_reason(self) -> str:
        """Why this store serves one event loop at a time (for :class:`StoreLoopError`'s message)."""
        return "its backend serves one event loop at a time"

    def _on_loop_change(self) -> None:  # noqa: B027 - optional hook
        """Drop connections bound to a closed event loop (override when the backend keeps any)."""

    async def _aclose(self) -> None:  # noqa: B027 - optional hook
        """Release the backend's resources (called once by ``close``)."""

    def _telemetry_target(self) -> TelemetryTarget:
        """The database this store's spans and metrics name (asked once per store); override to add the server.

        By default the system is the backend's package name (``chatkeep.memory`` gives ``memory``), without a
        server. A backend that knows better returns, for example, ``TelemetryTarget("postgresql", host, port)``.
        """
        package = type(self).__module__.split(".")
        return TelemetryTarget(package[1] if package[0] == "chatkeep" and len(package) > 1 else package[0])

    # -- storage -----------------------------------------------------------------------------------

    @abc.abstractmethod
    async def _append(self, key: SessionKey, messages: Sequence[Message], records: Sequence[str]) -> int:
        """Store ``records`` (the encoded ``messages``, distinct ids, within the size limit) atomically.

        Skip messages whose id the session still holds; return how many were new. Never called empty. In the same
        write, add :func:`~chatkeep.core.backend.usage_of` the new messages to the session's usage (``_usage``).
        """

    @abc.abstractmethod
    async def _load(self, key: SessionKey, last: int | None) -> list[Message]:
        """The history in append order; ``last`` (1 or more) reads only the newest ``last``."""

    async def _load_before(self, key: SessionKey, before: int, last: int | None) -> list[Message]:
        """The messages at positions ``before - last`` to ``before`` (``last`` ``None``: from 0), in append order.

        ``before`` (1 or more) counts the messages older than the range's end, from the oldest the session holds; one
        beyond the count means the count (so the range is then the ``last`` newest). ``last`` is 1 or more, or
        ``None``. Override it to read only the range (an offset into the session's log, by whichever end is nearer).
        This default, for a backend written before ranges existed, streams ``_iter_messages`` from the oldest message
        up to the range's end: correct, but its cost grows with ``before`` (O(before) records read and decoded).
        """
        kept: collections.deque[Message] = collections.deque(maxlen=last)
        stream = self._iter_messages(key, min(before, 1000))
        try:
            position = 0
            async for message in stream:
                kept.append(message)
                position += 1
                if position >= before:
                    break
        finally:
            close = getattr(stream, "aclose", None)
            if close is not None:  # an async generator stopped early: end its read now
                await close()
        return list(kept)

    @abc.abstractmethod
    def _iter_messages(self, key: SessionKey, batch: int) -> AsyncIterator[Message]:
        """Iterate over the history, reading ``batch`` (1 or more) records at a time; stop if it is deleted."""

    @abc.abstractmethod
    async def _count(self, key: SessionKey) -> int:
        """How many messages the session holds."""

    @abc.abstractmethod
    async def _delete(self, key: SessionKey) -> bool:
        """Delete the session's messages and document; ``True`` if anything was there."""

    @abc.abstractmethod
    async def _trim(self, key: SessionKey, keep_last: int) -> int:
        """Delete all but the newest ``keep_last`` (0 or more); return how many were deleted.

        When it deletes any, count the trim as a write (TTL, ``updated_at``), touching the session as ``_pop``
        does. When it deletes none, change nothing.
        """

    async def _pop(self, key: SessionKey) -> Message | None:
        """Remove the newest message and return it (``None``: no messages), in one atomic step.

        Concurrent pops must return distinct messages. Forget the popped id (an append may store it again),
        keep the session document, and count the pop as a write (TTL, ``updated_at``). Not abstract, so that
        backends written before ``pop`` existed still load: by default it refuses, rather than emulate a pop
        with a read and a delete that two callers could race.
        """
        raise feature_unsupported_error(self, "pop()", "_pop")

    @abc.abstractmethod
    async def _list_sessions(self, tenant: str, limit: int, cursor: str | None) -> SessionPage:
        """One page of ``tenant``'s sessions, newest first; raise ``ValueError`` for a cursor it cannot read."""

    async def _session_info(self, key: SessionKey) -> SessionInfo | None:
        """``key``'s entry as ``_list_sessions`` gives it (``None``: no such session), read by key in one step.

        Override it: read the session's listing row (or keys, or metadata) by its key, decoded by the same code as
        ``_list_sessions``'s rows, so the two always agree. This default, for a backend written before
        ``session_info`` existed, walks the tenant's ``_list_sessions`` pages until it finds the session: correct,
        but its cost grows with the tenant's sessions (O(sessions), a page per 500).
        """
        async for info in listed_sessions(self, key.tenant, past_damage=True):
            if info.session_id == key.session_id:
                return info
        return None

    async def _list_tagged_sessions(self, tenant: str, tag: str, limit: int, cursor: str | None) -> SessionPage:
        """One page of ``tenant``'s sessions carrying ``tag``, newest first, found through an index of tags.

        Read only the tagged sessions (never scan the tenant). Raise ``ValueError`` for a cursor it cannot read.
        Optional: without it, ``list_sessions(tag=...)`` raises :class:`UnsupportedOperationError`.
        """
        raise feature_unsupported_error(self, "list_sessions(tag=...)", "_list_tagged_sessions")

    async def _fork(self, source: SessionKey, target: SessionKey, through: str | None) -> int:
        """Make ``target`` refer to ``source``'s history up to ``through`` (its newest when ``None``), atomically.

        Never copy the history: keep a parent reference and a sequence cut (see 'Writing a plugin', Forks). Raise
        :func:`fork_target_exists_error` when ``target`` exists (messages, document or info), and
        :func:`fork_source_error` when ``source`` holds no messages or ``through`` is not one of them. Copy
        ``source``'s title, tags and metadata, set ``forked_from`` and ``target``'s usage (that of the messages it
        takes), and count the fork as a write of ``target``. Return how many messages ``target`` holds.
        Optional: without it, ``fork`` raises :class:`UnsupportedOperationError`.
        """
        raise feature_unsupported_error(self, "fork()", "_fork")

    async def _usage(self, key: SessionKey) -> SessionUsage:
        """The session's usage as kept by ``_append``, ``_pop``, ``_trim`` and ``_fork`` (never by reading messages).

        Optional: without it, ``usage`` raises :class:`UnsupportedOperationError`.
        """
        raise feature_unsupported_error(self, "usage()", "_usage")

    async def _update_info(
        self, key: SessionKey, title: str | None, tags: frozenset[str] | None, metadata: dict[str, Any] | None
    ) -> bool:
        """Set the given fields (checked; ``None``: leave it) if the session exists, as a write; ``True`` if it does.

        Keep ``tags`` in an index ``_list_tagged_sessions`` reads. Optional: without it, ``update_info`` raises
        :class:`UnsupportedOperationError`.
        """
        raise feature_unsupported_error(self, "update_info()", "_update_info")

    @abc.abstractmethod
    async def _save_session(
        self, key: SessionKey, session: AgentSession, expected_version: str | Absent | None, owner: str | None
    ) -> str:
        """Store :func:`session_document` of ``session`` atomically; return a version never used before for ``key``.

        Raise :func:`conflict_error` when ``expected_version`` is given and not the stored one, and
        :func:`owner_error` when ``owner`` is given and the stored document is bound to another owner;
        bind the document to ``owner`` when given. ``expected_version`` is :data:`~chatkeep.core.ABSENT` only when
        the store sets ``creates_if_absent``: then write only if the key has no document (messages alone are
        none), else raise ``conflict_error(session_id, ABSENT, exists=True)``, in the same atomic step.
        """

    @abc.abstractmethod
    async def _load_session(self, key: SessionKey) -> StoredSession | None:
        """The stored document with its version and owner (``None`` when there is none); the base checks the owner.

        Decode the stored text with :func:`decode_session_document`.
        """

    async def _prune(self, cutoff: datetime, tenant: str | None) -> int:
        """Delete sessions (of ``tenant``, or of every tenant) last updated before ``cutoff`` (UTC); return how many.

        By default, pages through ``_list_sessions`` (of each tenant ``_list_tenants`` names, when ``tenant`` is
        ``None``) and calls ``_prune_session`` for each session listed as idle since ``cutoff``, one call per
        session, page by page. Override it where the engine deletes by time in one statement.
        """
        return await prune_listed_sessions(self, cutoff, tenant)

    async def _prune_session(self, key: SessionKey, cutoff: datetime) -> bool:
        """Delete the session only if it was last updated before ``cutoff``, in one atomic step; ``True`` if deleted.

        The default ``_prune`` calls it for each session it listed as idle since ``cutoff``. This default deletes
        unconditionally, so a write landing between that listing and the delete is lost with the session (the
        conformance kit's ``test_prune_spares_a_session_written_after_it_was_listed`` shows it). Override it
        with a conditional delete (under the session's lock, in a transaction, a script, or on an ETag).
        """
        return await self._delete(key)

    async def _list_tenants(self) -> list[str]:
        """Every tenant with at least one live session, in any order (the base sorts them and drops repeats).

        ``list_tenants()`` calls it, and so does the default ``_prune`` for ``prune()`` without a tenant.
        Optional: without it, ``list_tenants()`` and that ``prune`` raise :class:`UnsupportedOperationError`.
        """
        raise UnsupportedOperationError(
            f"{type(self).__name__} cannot list its tenants: name them instead (prune(older_than=..., "
            "tenant=...) or chatkeep copy --tenant T for each of yours); the backend's author can add "
            "HistoryStore._list_tenants"
        )

    async def _delete_tenant(self, tenant: str) -> int:
        """Delete every session of ``tenant``; return how many there were.

        By default, pages through ``_list_sessions`` and calls ``_delete`` for each session listed; a session
        the tenant gains while it runs may stay. Override it where the engine removes a tenant at once.
        """
        return await delete_listed_sessions(self, tenant)

    async def _append_embedded(self, key: SessionKey, messages: Sequence[Message], embeddings: Embeddings) -> int:
        """``append`` with embeddings: a store with the search capability (``SearchableStore``) overrides it."""
        raise self._search_refusal()

    def _search_refusal(self) -> SearchUnsupportedError:
        """The error for indexing or searching this store, which lacks the search capability.

        Override it to say why this store has none and what to do (``EncryptedStore`` does).
        """
        return search_unsupported_error(self)
