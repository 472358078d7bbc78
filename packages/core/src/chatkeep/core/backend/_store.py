"""The contract every storage backend implements: :class:`HistoryStore`, a template method.

Each public method checks what every backend shares once (the store is open and on its own event loop,
the key and tenant, argument ranges, the message size limit, the session's tenant and owner), then calls
the protected hook a backend writes (``_append``, ``_load``, ...). A backend implements only storage.
Each public method is also an OpenTelemetry span and duration sample (``_telemetry.operation``). The hooks and
their defaults are :class:`~._hooks.StoreHooks`; the argument checks, :mod:`._checks`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Concatenate, TypeVar

from typing_extensions import ParamSpec, Self

from chatkeep.core._errors import (
    ChatkeepError,
    InvalidArgumentError,
    SessionOwnershipError,
    StoreClosedError,
    StoreLoopError,
)
from chatkeep.core._messages import Message, encode_records
from chatkeep.core._session import DEFAULT_TENANT, AgentSession, validate_id
from chatkeep.core._telemetry import note_records, operation, operation_stream
from chatkeep.core.backend._checks import check_count, check_key, check_messages, check_tenant, prune_cutoff
from chatkeep.core.backend._damage import naming_damage
from chatkeep.core.backend._hooks import StoreHooks
from chatkeep.core.backend._info import SessionUsage, check_metadata, check_tag, check_tags, check_title
from chatkeep.core.backend._refusals import absent_unsupported_error, owner_error
from chatkeep.core.backend._sealed import SealedSessions, is_sealed
from chatkeep.core.backend._sessions import ABSENT, Absent, SessionInfo, SessionKey, SessionPage, StoredSession

if TYPE_CHECKING:
    from chatkeep.core.backend._search import Embeddings
    from chatkeep.core.backend._sync import SyncHistoryStore

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "HistoryStore", "checked"]

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024

_T = TypeVar("_T")
_P = ParamSpec("_P")
_S = TypeVar("_S", bound="HistoryStore")


def checked(
    method: Callable[Concatenate[_S, _P], Coroutine[Any, Any, _T]],
) -> Callable[Concatenate[_S, _P], Coroutine[Any, Any, _T]]:
    """Give a backend's own public coroutine method (beyond the contract) the contract's lifecycle check.

    A store method decorated with it raises :class:`StoreClosedError` on a closed store and
    :class:`StoreLoopError` on another running event loop, as every contract method does.
    """

    async def call(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        self._check_usable()
        return await method(self, *args, **kwargs)

    functools.update_wrapper(call, method)
    return call


class HistoryStore(StoreHooks):
    """Base class of a storage backend: subclass it, implement the protected hooks, and pass the conformance kit.

    The public methods are the contract users call. Each checks its arguments and the store's state once,
    then calls the hook a backend implements: ``_append``, ``_load``, ``_iter_messages``, ``_count``,
    ``_delete``, ``_trim``, ``_list_sessions``, ``_save_session`` and ``_load_session`` (and optionally
    ``_load_before``, ``_session_info``, ``_pop``, ``_prune``, ``_prune_session``, ``_list_tenants``,
    ``_delete_tenant``, ``_aclose`` and ``_on_loop_change``; and ``_fork``, ``_usage``, ``_update_info``,
    ``_list_tagged_sessions`` for forks, usage, titles and tags). A hook is only called with valid arguments, on
    an open store, on the store's own event loop (on any running loop when :attr:`serves_any_loop` is set).
    ``_pop``'s default refuses (a backend written before ``pop`` existed raises :class:`UnsupportedOperationError`),
    and so do the defaults of the fork, usage and info hooks; ``_load_before`` defaults to streaming
    ``_iter_messages`` up to the range's end; ``_prune`` and ``_delete_tenant`` default to paging through
    ``_list_sessions`` and deleting session by session (``_prune_session``, ``_delete``), and ``_session_info``
    to walking ``_list_sessions``' pages.

    The base class keeps the rules every backend shares: ``close()`` is idempotent, and a closed store raises
    :class:`StoreClosedError`. Drivers' connections belong to one event loop: a backend that keeps a driver
    client per loop (:class:`~chatkeep.core.backend.PerLoop`) sets :attr:`serves_any_loop` and is then used from
    any number of running loops at once, its hooks called on each. Otherwise a store used from another running
    loop than its own raises :class:`StoreLoopError`; once its loop is closed (an ``asyncio.run`` ended), the next
    loop adopts the store.

    Contract, per call:

    * ``append`` is atomic (all or none, also when cancelled), acknowledged when it returns, and
      idempotent by ``message_id`` for messages still stored; it returns how many messages were new.
      Its cost does not depend on the history's length.
    * ``load`` returns messages in append order; ``last=k`` reads only the k newest, and ``before=p`` only the
      range ending before position ``p``.
    * ``iter_messages`` pages through the whole history in constant memory.
    * ``count``, ``delete``, ``trim`` are exact; ``delete`` removes everything the key owned. A trim that
      deletes at least one message is a write, as a pop is (it restarts the TTL and counts as an update for
      ``list_sessions`` and ``prune``); a trim that deletes nothing changes nothing.
    * ``pop`` removes the newest message and returns it, atomically: concurrent pops return distinct
      messages, none lost, and ``count`` drops by one per message returned. A pop is a write (it restarts
      the TTL and counts as an update for ``list_sessions`` and ``prune``); it leaves the session document
      alone. The popped ``message_id`` is no longer stored, so appending that message again stores it again.
    * ``list_sessions`` lists one tenant's sessions, newest first, by pages; ``session_info`` reads one session's
      entry of that listing by its key, in time independent of how many sessions the tenant holds.
    * ``save_session``/``load_session`` keep whole-session documents with opaque versions. A version is
      never reused for a key, even after a delete, so a stale writer cannot overwrite a newer document.
      ``expected_version=ABSENT`` creates a document only where there is none: of concurrent creators, one wins.
    * ``prune`` and ``delete_tenant`` remove old sessions and whole tenants; ``list_tenants`` names the tenants
      that hold a session.
    * With a TTL, a session (messages and document) expires as a whole; every write restarts its TTL,
      and an expired session is invisible to every call, ``list_sessions`` included.
    * ``owner=None`` asserts nothing: a document bound to an owner still loads without one.
    * Driver errors are raised as :class:`StoreUnavailableError` with the driver's exception as the cause.
    """

    #: Each stored message record may be at most this many bytes (UTF-8).
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: Whether the store serves calls from several running event loops at once (a backend that keeps its driver
    #: clients per loop, with :class:`~chatkeep.core.backend.PerLoop`, sets it). When ``False`` (the default, for a
    #: backend written for one loop), a call from another running loop raises :class:`StoreLoopError`.
    serves_any_loop: bool = False

    #: Hand out records and session documents sealed by ``EncryptedStore`` as they are stored. When false (the
    #: default), a store without keys raises :class:`EncryptedSessionError` instead of returning them (their text
    #: would look empty). ``EncryptedStore`` sets it on the store it wraps; tools that copy records verbatim
    #: (``chatkeep export`` and ``copy``) set it to move encrypted sessions as they are.
    sealed_passthrough: bool = False

    #: Whether the backend's ``_save_session`` handles ``expected_version=ABSENT`` (writes only when the key has no
    #: document, atomically). A plugin written before ``ABSENT`` existed leaves it false, and such a save raises
    #: :class:`UnsupportedOperationError` instead of reaching a hook that would take it for a version.
    creates_if_absent: bool = False

    def __init__(self, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.max_message_bytes = max_message_bytes
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._sealed = SealedSessions()  # the sessions this store, without keys, found encrypted

    # -- lifecycle shared by every backend -------------------------------------------------------

    def _check_usable(self) -> None:
        """Raise unless this store is open and used from its own event loop (the base calls it; backends don't)."""
        if self._closed:
            raise StoreClosedError(f"{type(self).__name__} is closed; open a new store to keep using it")
        if self.serves_any_loop:
            return
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is None:
            self._loop = loop
        elif self._loop.is_closed():
            # The loop it ran on is gone (a previous asyncio.run); its connections died with it.
            self._loop = loop
            self._on_loop_change()
        else:
            raise StoreLoopError(
                f"{type(self).__name__} was opened on another event loop than the one running now, and "
                f"{self._one_loop_reason()}; open one store per event loop (for example one per thread running "
                "asyncio.run), or use store.sync() from plain threads"
            )

    async def close(self) -> None:
        """Release connections; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        if not self.serves_any_loop and self._loop is not None and self._loop is not loop and self._loop.is_closed():
            # Connections of a loop that is gone cannot be closed gracefully: drop them, then release the rest.
            self._loop = loop
            self._on_loop_change()
        await self._aclose()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    async def __aenter__(self) -> Self:
        if self._closed:
            raise StoreClosedError(f"{type(self).__name__} is closed; open a new store to use it in async with")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def sync(self) -> SyncHistoryStore:
        """A blocking view of this store for code without asyncio (Flask, Django, notebooks).

        It runs this store on a private event loop (in the calling thread when it can, else on a helper thread);
        close the view (or use ``with``) to close both.
        """
        from chatkeep.core.backend._sync import SyncHistoryStore

        return SyncHistoryStore(self)

    # -- the contract (checked here, stored by the backend's hooks) ------------------------------

    @operation("append", lambda new: {"chatkeep.messages.new": new})
    async def append(
        self, key: SessionKey, messages: Sequence[Message], *, embeddings: Embeddings | None = None
    ) -> int:
        """Append messages atomically; messages whose ``message_id`` is already stored are skipped.

        Args:
            key: the session.
            messages: the messages, in order.
            embeddings: their vectors (``embed_messages(embedder, messages)``), to index them too: only on a
                store with the search capability (:class:`~chatkeep.core.SupportsSearch`), where messages already
                stored but not yet indexed are indexed.

        Returns:
            How many messages were new.

        Raises:
            MessageTooLargeError: a message is over ``max_message_bytes`` (nothing is stored).
            StoreUnavailableError: the server failed (nothing is stored).
            SearchUnsupportedError: ``embeddings`` given to a store without the search capability.
        """
        if embeddings is not None:
            return await self._append_embedded(key, messages, embeddings)
        messages, records = self._appendable(key, messages)
        if not records:
            return 0
        with naming_damage(key):  # a backend may read stored records to check ids
            return await self._append(key, messages, records)

    def _appendable(self, key: SessionKey, messages: Sequence[Message]) -> tuple[list[Message], list[str]]:
        """What ``append`` checks before storing: the messages to store (first of each id) and their records."""
        self._check_usable()
        check_key(key)
        messages = check_messages(messages)
        records = encode_records(messages, max_bytes=self.max_message_bytes)
        if not records:
            return [], []
        if not self.sealed_passthrough:
            self._sealed.refuse_append(key)
        ids = [message.message_id for message in messages]
        if len(set(ids)) != len(ids):  # the first of each id counts, as if appended one after another
            first = {message_id: n for n, message_id in reversed(list(enumerate(ids)))}
            keep = sorted(first.values())
            messages, records = [messages[n] for n in keep], [records[n] for n in keep]
        note_records(records)
        return messages, records

    @operation("load", lambda messages: {"db.response.returned_rows": len(messages)})
    async def load(self, key: SessionKey, *, last: int | None = None, before: int | None = None) -> list[Message]:
        """Return the history in append order; with ``last=k``, only the k newest (reading only those).

        With ``before=p``, only the messages older than position ``p`` (the number of messages before the range's
        end: 0 is before the oldest; a ``p`` beyond the count means the count), and with ``last=k`` too, the k
        newest of those: positions ``p - k`` to ``p``. Positions count from the oldest message the session holds
        (after a trim, from the oldest kept). The bundled backends read only the range's messages.

        Raises:
            InvalidArgumentError: ``last`` or ``before`` is not a whole number of 0 or more.
        """
        self._check_usable()
        check_key(key)
        if last is not None:
            check_count(last, "last", minimum=0)
        if before is not None:
            check_count(before, "before", minimum=0)
        if last == 0 or before == 0:
            return []
        with naming_damage(key):
            messages = await (self._load(key, last) if before is None else self._load_before(key, before, last))
        if not self.sealed_passthrough:
            self._sealed.check(key, messages)
        return messages

    @operation_stream("iter_messages")
    async def iter_messages(self, key: SessionKey, *, batch: int = 1000) -> AsyncIterator[Message]:
        """Iterate over the whole history in append order, ``batch`` messages per read."""
        self._check_usable()
        check_key(key)
        check_count(batch, "batch", minimum=1)
        with naming_damage(key):
            async for message in self._iter_messages(key, batch):
                if message.additional_properties and not self.sealed_passthrough:
                    self._sealed.check(key, (message,))
                yield message
                self._check_usable()

    @operation("count")
    async def count(self, key: SessionKey) -> int:
        """How many messages the session holds."""
        self._check_usable()
        with naming_damage(check_key(key)):
            return await self._count(key)

    @operation("delete")
    async def delete(self, key: SessionKey) -> bool:
        """Delete the session's messages and document; ``True`` if anything was there."""
        self._check_usable()
        self._sealed.forget(check_key(key))
        return await self._delete(key)

    @operation("trim", lambda deleted: {"chatkeep.messages.deleted": deleted})
    async def trim(self, key: SessionKey, keep_last: int) -> int:
        """Delete all but the ``keep_last`` newest messages; returns how many were deleted."""
        self._check_usable()
        check_key(key)
        keep_last = check_count(keep_last, "keep_last", minimum=0)
        self._sealed.forget(key)
        with naming_damage(key):
            return await self._trim(key, keep_last)

    @operation("pop", lambda message: {"db.response.returned_rows": int(message is not None)})
    async def pop(self, key: SessionKey) -> Message | None:
        """Remove the newest message of the session and return it; None when the session has no messages.

        Atomic: concurrent pops of one session return distinct messages. The session document stays.

        Raises:
            UnsupportedOperationError: the backend's plugin predates ``pop`` (upgrade the plugin).
        """
        self._check_usable()
        with naming_damage(check_key(key)):
            popped = await self._pop(key)
        self._sealed.forget(key)
        if popped is not None and not self.sealed_passthrough and is_sealed(popped):
            # A pop is atomic, so the sealed message is already gone: it was the newest, so appending it again
            # puts it back in its place. Raising without doing so would lose it.
            await self._append(key, [popped], encode_records([popped]))
            self._sealed.check(key, (popped,), outcome="nothing was removed (the message was put back)")
        return popped

    @operation("list_sessions", lambda page: {"db.response.returned_rows": len(page.items)})
    async def list_sessions(
        self, tenant: str = DEFAULT_TENANT, *, tag: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> SessionPage:
        """List one tenant's sessions, most recently updated first; with ``tag``, only the sessions carrying it.

        Raises:
            InvalidArgumentError: ``limit`` is below 1, ``tag`` is not a tag, or ``cursor`` is not a ``next_cursor``
                of this store (for the same ``tag``).
            UnsupportedOperationError: ``tag`` is given and the backend's plugin predates tags.
        """
        self._check_usable()
        check_tenant(tenant)
        check_count(limit, "limit", minimum=1)
        if tag is not None:
            check_tag(tag)
        if cursor is not None and (not isinstance(cursor, str) or not cursor):
            raise InvalidArgumentError(f"cursor must be the next_cursor of a previous page (a string), got {cursor!r}")
        try:
            if tag is not None:
                return await self._list_tagged_sessions(tenant, tag, limit, cursor)
            return await self._list_sessions(tenant, limit, cursor)
        except ChatkeepError:  # its own account (a damaged entry, a bad argument), not a cursor it failed to read
            raise
        except (ValueError, TypeError, UnicodeDecodeError) as exc:
            if cursor is None:
                raise
            raise InvalidArgumentError(
                f"{cursor!r} is not a list_sessions cursor of this store; pass the next_cursor of the previous page"
            ) from exc

    @operation("session_info", lambda info: {"db.response.returned_rows": int(info is not None)})
    async def session_info(self, key: SessionKey) -> SessionInfo | None:
        """The session's ``list_sessions`` entry (title, tags, metadata, usage, message count, times, fork parent).

        Read by key: it costs the same in a tenant of ten sessions as in one of a million. ``None`` when there is no
        such session (never stored, deleted, pruned or expired; or in another tenant). Like ``list_sessions``, it
        reads no message, so it also describes a session that ``EncryptedStore`` sealed.
        """
        self._check_usable()
        return await self._session_info(check_key(key))

    @operation("fork", lambda held: {"chatkeep.messages.new": held})
    async def fork(self, source: SessionKey, target: SessionKey, *, through: str | None = None) -> int:
        """Start session ``target`` with ``source``'s history up to and including message ``through``.

        The history is not copied: ``target`` refers to ``source``'s messages up to that point, so a fork costs the
        same at 10 messages as at 100,000. From then on the two are independent: appends, pops and trims on either
        never show in the other, and deleting, trimming, pruning or expiring ``source`` never changes ``target``.
        ``target`` also starts with ``source``'s title, tags and metadata (not its session document: see
        ``Agent.fork_session``), and ``SessionInfo.forked_from`` names ``source`` and ``through``.

        Args:
            source: the session to fork; it must hold messages.
            target: the new session, in the same tenant; it must not exist yet (no messages, no document).
            through: the id of the last message ``target`` takes (``None``: all of ``source``'s).

        Returns:
            How many messages ``target`` holds.

        Raises:
            ConcurrencyConflictError: ``target`` already exists.
            InvalidArgumentError: ``through`` is not a message of ``source``, ``source`` holds no messages, or
                ``target`` is ``source``.
            SessionOwnershipError: ``target`` is in another tenant than ``source``.
            UnsupportedOperationError: the backend's plugin predates forks.
        """
        self._check_usable()
        check_key(source)
        check_key(target)
        if source.tenant != target.tenant:
            raise SessionOwnershipError(
                f"a fork stays in its tenant: source is in tenant {source.tenant!r}, target in {target.tenant!r}; "
                f"pass a target key of tenant {source.tenant!r}, or copy the session across tenants with chatkeep copy"
            )
        if source == target:
            raise InvalidArgumentError(
                f"cannot fork session {source.session_id!r} onto itself; pass another target key"
            )
        if through is not None and (not isinstance(through, str) or not through):
            raise InvalidArgumentError(f"through must be a message id (a non-empty string) or None, got {through!r}")
        with naming_damage(source):
            if not self.sealed_passthrough:
                self._sealed.refuse_append(target)
                # A session EncryptedStore wrote is sealed to its own id: a fork of it could never be opened. Its
                # newest message tells (one record read, whatever the history's length).
                newest = await self._load(source, 1)
                self._sealed.check(source, newest, outcome="nothing was forked (its seals name the source session)")
            return await self._fork(source, target, through)

    @operation("usage")
    async def usage(self, key: SessionKey) -> SessionUsage:
        """The tokens the session's messages say they used, read without reading the messages (kept by ``append``).

        A session without messages (or without usage contents) has an empty usage.

        Raises:
            UnsupportedOperationError: the backend's plugin predates usage.
        """
        self._check_usable()
        return await self._usage(check_key(key))

    @operation("update_info")
    async def update_info(
        self,
        key: SessionKey,
        *,
        title: str | None = None,
        tags: Iterable[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> bool:
        """Set the session's title, tags or metadata (an argument left ``None`` is left as it is).

        A write: it counts as an update for ``list_sessions`` and ``prune`` and restarts the TTL.

        Args:
            key: the session; it must exist (hold messages or a document).
            title: the new title (``""`` clears it).
            tags: the new tag set, replacing the old one (``set()`` clears it).
            metadata: the new metadata, replacing the old (``{}`` clears it); JSON values only, at most 64 KiB.

        Returns:
            ``True`` when the session exists and was updated; ``False`` when there is no such session.

        Raises:
            InvalidArgumentError: a title, tag or metadata out of its limits (nothing is stored).
            UnsupportedOperationError: the backend's plugin predates titles and tags.
        """
        self._check_usable()
        check_key(key)
        checked_title = None if title is None else check_title(title)
        checked_tags = None if tags is None else check_tags(tags)
        checked_metadata = None if metadata is None else check_metadata(metadata)
        if checked_title is None and checked_tags is None and checked_metadata is None:
            raise InvalidArgumentError("update_info needs title=, tags= or metadata=; pass at least one")
        return await self._update_info(key, checked_title, checked_tags, checked_metadata)

    @operation("save_session")
    async def save_session(
        self,
        key: SessionKey,
        session: AgentSession,
        *,
        expected_version: str | Absent | None = None,
        owner: str | None = None,
    ) -> str:
        """Store a whole-session document and return its new version.

        Args:
            key: where to store it (its tenant must be the session's tenant).
            session: the session to store (as ``session.to_dict()``).
            expected_version: ``None`` writes unconditionally; a version from ``load_session`` or an earlier
                ``save_session`` writes only if the stored document still has that version; :data:`ABSENT` writes
                only if the key has no document yet (messages without a document count as none), so of
                concurrent creators exactly one wins.
            owner: binds the document to a user within the tenant; a document bound to another owner is refused.

        Raises:
            ConcurrencyConflictError: the stored version is not ``expected_version`` (or there is none), or, with
                ``ABSENT``, a document already exists.
            SessionOwnershipError: the document belongs to another owner, or ``session`` to another tenant.
            UnsupportedOperationError: ``ABSENT`` given to a store whose plugin does not set ``creates_if_absent``.
        """
        self._check_usable()
        check_key(key)
        if not isinstance(session, AgentSession):
            raise InvalidArgumentError(f"save_session takes an AgentSession, got {type(session).__name__}")
        if session.tenant != key.tenant:
            raise SessionOwnershipError(
                f"the session belongs to tenant {session.tenant!r}, not to the key's tenant {key.tenant!r}; "
                "save it under SessionKey.of(session)"
            )
        if expected_version is ABSENT:
            if not self.creates_if_absent:
                raise absent_unsupported_error(self)
        elif expected_version is not None and not isinstance(expected_version, str):
            raise InvalidArgumentError(
                f"expected_version must be a version string, ABSENT or None, got {expected_version!r}"
            )
        if owner is not None:
            validate_id(owner, "owner")
        return await self._save_session(key, session, expected_version, owner)

    @operation("load_session", lambda found: {"db.response.returned_rows": int(found is not None)})
    async def load_session(self, key: SessionKey, *, owner: str | None = None) -> StoredSession | None:
        """Read a session document and its version; ``None`` when there is none.

        Another tenant's key is simply not found.

        Raises:
            SessionOwnershipError: ``owner`` is given and the document is bound to another owner.
        """
        self._check_usable()
        check_key(key)
        if owner is not None:
            validate_id(owner, "owner")
        found = await self._load_session(key)
        if found is None:
            return None
        if owner is not None and found.owner is not None and found.owner != owner:
            raise owner_error()
        if not self.sealed_passthrough:
            self._sealed.check_document(key, found.session.state)
        return found

    @operation("prune", lambda deleted: {"chatkeep.sessions.deleted": deleted})
    async def prune(self, *, older_than: timedelta | datetime, tenant: str | None = None) -> int:
        """Delete sessions not updated since ``older_than`` (an age or a cut-off time); returns how many."""
        self._check_usable()
        cutoff = prune_cutoff(older_than)
        if tenant is not None:
            check_tenant(tenant)
        self._sealed.forget()
        return await self._prune(cutoff, tenant)

    @operation("list_tenants", lambda tenants: {"db.response.returned_rows": len(tenants)})
    async def list_tenants(self) -> list[str]:
        """Every tenant holding at least one session (messages or a document), sorted by code point.

        Not paged: tenants are accounts, far fewer than sessions, and every backend finds them with one walk of
        an index it already keeps (a million tenant names is tens of megabytes). A tenant whose last session was
        deleted, pruned or expired is not listed.

        Raises:
            UnsupportedOperationError: the backend's plugin does not implement ``_list_tenants``.
        """
        self._check_usable()
        return sorted(set(await self._list_tenants()))

    @operation("delete_tenant", lambda deleted: {"chatkeep.sessions.deleted": deleted})
    async def delete_tenant(self, tenant: str) -> int:
        """Delete every session of a tenant; returns how many sessions were deleted."""
        self._check_usable()
        self._sealed.forget()
        return await self._delete_tenant(check_tenant(tenant))

    def __repr__(self) -> str:
        return f"<{type(self).__name__}{' closed' if self._closed else ''}>"

    def describe(self) -> dict[str, Any]:
        """What this store is, for logs and the CLI (no secrets)."""
        return {"type": type(self).__name__}
