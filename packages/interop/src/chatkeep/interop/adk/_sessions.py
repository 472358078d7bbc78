"""``ChatkeepSessionService``: Google ADK's ``BaseSessionService`` on any chatkeep store."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from typing import Any

from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events import Event
from google.adk.sessions import BaseSessionService, Session
from google.adk.sessions.base_session_service import GetSessionConfig, ListSessionsResponse
from typing_extensions import override

from chatkeep.core import (
    ABSENT,
    DEFAULT_TENANT,
    ConcurrencyConflictError,
    HistoryStore,
    SessionKey,
    StoredSession,
    UnsupportedOperationError,
)
from chatkeep.core.backend import encode_records
from chatkeep.interop._binding import ClosesItsStore, StoreBinding
from chatkeep.interop.adk._layout import (
    Document,
    app_key,
    event_json,
    event_of,
    ids_of,
    item_of,
    listing_tag,
    merged_state,
    message_of,
    session_key,
    split_delta,
    tags_of,
    user_key,
)

__all__ = ["ChatkeepSessionService"]

#: ADK's own message for a stale session (its database service raises StaleSessionError, a ValueError, with it).
STALE_SESSION_MESSAGE = (
    "The session has been modified in storage since it was loaded. Please reload the session before appending "
    "more events."
)
_CAS_ATTEMPTS = 50  # compare-and-set rounds of a shared state document before giving up
_LIST_CONCURRENCY = 16  # session documents read at once by list_sessions
_FIRST_WINDOW = 64  # events read first when looking for those after a timestamp
_REMEMBERED = 256  # session documents kept from the last read or write, to skip a read before an append


class ChatkeepSessionService(ClosesItsStore, BaseSessionService):
    """An ADK session service whose sessions, events and state live in a chatkeep store.

    A drop-in for ``InMemorySessionService`` or ``DatabaseSessionService``: pass it to ``Runner(...,
    session_service=...)``. Each event is one chatkeep message keeping the event's JSON exactly (as ADK's
    database service stores it); state deltas go where ADK's services put them: ``app:`` keys to the app's
    shared state, ``user:`` keys to the user's, ``temp:`` keys nowhere (the in-memory session keeps them for the
    invocation), the rest to the session. ``append_event`` refuses a stale session (one that missed an event
    another writer appended) with ADK's ``ValueError``, so concurrent writers never lose or duplicate an event.

    Args:
        store: a :class:`~chatkeep.core.HistoryStore` (you keep owning it), or a store URL or backend name that
            the service opens and closes in :meth:`close`.
        tenant: the chatkeep tenant every app and session of this service lives in.
        store_options: options for a store opened from a URL (as keywords, what its query string takes).

    Raises:
        InvalidSessionKeyError: an empty or too long ``tenant``.
        UnknownBackendError: no installed backend handles the URL; the message names the extra to install.
        StoreConfigurationError: ``store_options`` with a store object, or a ``store`` of the wrong type.
        UnsupportedOperationError: the store cannot create a document only where there is none (its plugin
            predates ``ABSENT``): sessions and shared states could not be created safely.
    """

    def __init__(
        self,
        store: HistoryStore | str,
        *,
        tenant: str = DEFAULT_TENANT,
        store_options: Mapping[str, Any] | None = None,
    ) -> None:
        StoreBinding.key("probe", tenant)  # a bad tenant fails here, not at the first call
        self._binding = StoreBinding(store, store_options=store_options)
        if not self._binding.store.creates_if_absent:  # a store opens lazily: one refused here holds nothing
            raise UnsupportedOperationError(
                f"ChatkeepSessionService needs a store that saves a session document only where there is none "
                f"(save_session(..., expected_version=ABSENT)); {type(self._binding.store).__name__} does not "
                "declare creates_if_absent: upgrade the plugin that provides it, or use a bundled backend"
            )
        self.tenant = tenant
        # One lock per session appended to in this process (dropped when unused), as ADK's database service
        # keeps: appends through one session object follow each other, each seeing the one before.
        self._locks: weakref.WeakValueDictionary[SessionKey, asyncio.Lock] = weakref.WeakValueDictionary()
        self._documents: OrderedDict[SessionKey, StoredSession] = OrderedDict()  # the newest _REMEMBERED

    @property
    def store(self) -> HistoryStore:
        """The store the sessions live in."""
        return self._binding.store

    # -- sessions -------------------------------------------------------------------------------------------

    @override
    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """Create a session (a new id unless ``session_id`` is given) with ``state`` split by its scopes.

        Raises:
            AlreadyExistsError: a session of that id already exists for this app and user.
        """
        # Surrounding spaces are not part of an id, as ADK's in-memory and SQLite services read them.
        session_id = session_id.strip() if session_id and session_id.strip() else str(uuid.uuid4())
        key = session_key(self.tenant, app_name, user_id, session_id)
        app_delta, user_delta, own = split_delta(state)
        now = time.time()
        document = Document(dict(own), now, now)
        # The document made only where there is none claims the id: one creator wins, also in other processes.
        # (Releases before ABSENT claimed it with a marker message first; such a session has a document too.)
        try:
            await self.store.save_session(key, document.to_session(key), expected_version=ABSENT)
        except ConcurrencyConflictError:
            raise AlreadyExistsError(f"Session with id {session_id} already exists.") from None
        # A backend without tags (Blob, EncryptedStore) leaves them: list_sessions walks the tenant instead.
        with contextlib.suppress(UnsupportedOperationError):
            await self.store.update_info(key, tags=tags_of(app_name, user_id))
        app_state, user_state = await asyncio.gather(
            self._update_shared(app_key(self.tenant, app_name), app_delta, now),
            self._update_shared(user_key(self.tenant, app_name, user_id), user_delta, now),
        )
        return Session(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=merged_state(app_state, user_state, document.state),
            last_update_time=now,
        )

    @override
    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        """The session with its state and its events (``config``: only the newest, or those after a time).

        One round trip's time: the events, the shared state and the session's document are read at once. When
        the document's newest event is the newest event read, the two agree. Otherwise an append ran between the
        reads, and the document is read again, now after the events, so never older than them: an event its
        writer had not yet stored (or never did, stopped in between) is taken from the document, and stored.
        """
        session_id = session_id.strip() if session_id else session_id  # as create_session stored it
        key = session_key(self.tenant, app_name, user_id, session_id)
        recent = config.num_recent_events if config is not None else None
        after = config.after_timestamp if config is not None else None
        (window, newest), app_state, user_state, stored = await asyncio.gather(
            self._window(key, recent, after),
            self._shared(app_key(self.tenant, app_name)),
            self._shared(user_key(self.tenant, app_name, user_id)),
            self.store.load_session(key),
        )
        if stored is not None and Document.of(stored.session).newest_id != newest:
            stored = await self.store.load_session(key)
        if stored is None:
            return None
        self._remember(key, stored)
        document = Document.of(stored.session)
        items = window
        if document.newest is not None and newest != document.newest_id:
            # The document's newest event is not among the messages read before it: its writer is between the two
            # writes now, or stopped there. Store it (an append skips a stored id) with its shared state.
            await self._complete(key, document.newest, app_name, user_id)
            if recent != 0:
                items = [*items, document.newest]
        events = [event_of(item) for item in items]
        if after is not None:
            events = [event for event in events if event.timestamp >= after]
        if recent:
            events = events[-recent:]
        return Session(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=merged_state(app_state, user_state, document.state),
            events=events,
            last_update_time=document.updated,
        )

    @override
    async def list_sessions(self, *, app_name: str, user_id: str | None = None) -> ListSessionsResponse:
        """The app's sessions (only ``user_id``'s when given), without events, oldest update first."""
        found: list[tuple[str, str, SessionKey]] = []
        async for key_id in self._listed(listing_tag(app_name, user_id)):
            ids = ids_of(key_id)
            if ids is not None and ids[0] == app_name and (user_id is None or ids[1] == user_id):
                found.append((ids[1], ids[2], SessionKey(self.tenant, key_id)))
        limit = asyncio.Semaphore(_LIST_CONCURRENCY)

        async def document(key: SessionKey) -> StoredSession | None:
            async with limit:
                return await self.store.load_session(key)

        users = sorted({user for user, _, _ in found})
        shared = [app_key(self.tenant, app_name), *(user_key(self.tenant, app_name, user) for user in users)]
        listed = [key for _, _, key in found]
        app_document, *user_documents = await asyncio.gather(*(document(key) for key in shared))
        stored = await asyncio.gather(*(document(key) for key in listed))
        app_state = _state_of(app_document)
        by_user = {user: _state_of(one) for user, one in zip(users, user_documents, strict=True)}
        sessions = []
        for (user, session_id, _), one in zip(found, stored, strict=True):
            if one is None:  # deleted since it was listed
                continue
            doc = Document.of(one.session)
            sessions.append(
                Session(
                    id=session_id,
                    app_name=app_name,
                    user_id=user,
                    state=merged_state(app_state, by_user[user], doc.state),
                    last_update_time=doc.updated,
                )
            )
        sessions.sort(key=lambda session: (session.last_update_time, session.user_id, session.id))
        return ListSessionsResponse(sessions=sessions)

    async def _listed(self, tag: str) -> AsyncIterator[str]:
        """The chatkeep ids of the sessions carrying ``tag`` (on a backend without tags: of the whole tenant)."""
        cursor: str | None = None
        chosen: str | None = tag
        while True:
            try:
                page = await self.store.list_sessions(self.tenant, tag=chosen, limit=100, cursor=cursor)
            except UnsupportedOperationError:
                if chosen is None:
                    raise
                chosen, cursor = None, None
                continue
            for info in page.items:
                yield info.session_id
            cursor = page.next_cursor
            if cursor is None:
                return

    @override
    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete the session, its events and its state (the app's and the user's shared state stay)."""
        session_id = session_id.strip() if session_id else session_id  # as create_session stored it
        key = session_key(self.tenant, app_name, user_id, session_id)
        self._documents.pop(key, None)
        await self.store.delete(key)

    @override
    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's shared state within the app (its ``user:`` keys, without the prefix)."""
        return await self._shared(user_key(self.tenant, app_name, user_id))

    # -- events ---------------------------------------------------------------------------------------------

    @override
    async def append_event(self, session: Session, event: Event) -> Event:
        """Store the event and its state delta, then add them to ``session`` (a partial event is not stored).

        Delivering the same event again (an equal event of the same id, as a retry after an error does) stores
        it once, as ADK's in-memory service does.

        Raises:
            StaleSessionError: the session is stale (another writer appended an event it has not seen: get the
                session again), the ``ValueError`` ADK's database service raises; nothing was stored.
            SessionNotFoundError: the session does not exist (any more).
            MessageTooLargeError: the event is over the store's ``max_message_bytes``; nothing was stored.
        """
        if event.partial:
            return event
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        key = session_key(self.tenant, session.app_name, session.user_id, session.id)
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock:
            await self._store_event(key, session, event)
            if session.events and session.events[-1] == event:
                return event  # delivered again, to the session it was appended to: already there
            self._commit_event_to_session(session, event)
            session.last_update_time = event.timestamp
        return event

    async def _store_event(self, key: SessionKey, session: Session, event: Event) -> None:
        item = event_json(event)
        message = message_of(event, item)
        encode_records([message], max_bytes=self.store.max_message_bytes)  # too large: refused before any write
        app_delta, user_delta, own = split_delta(event.actions.state_delta if event.actions else None)
        # The document this service last read or wrote, if any: its compare-and-set fails if another writer
        # changed it since, and then the document is read again and checked afresh. One round trip saved.
        stored = self._documents.pop(key, None)
        while True:
            fresh = stored is None
            if stored is None:
                stored = await self.store.load_session(key)
                if stored is None:
                    raise SessionNotFoundError(f"Session {session.id} not found.")
            document = Document.of(stored.session)
            if document.newest_id == event.id:
                # This very event was appended before and its call failed after the document: complete it.
                await self._complete(key, item, session.app_name, session.user_id)
                self._remember(key, stored)
                return
            if _is_stale(session, document):
                raise StaleSessionError(STALE_SESSION_MESSAGE)
            updated = Document({**document.state, **own}, document.created, event.timestamp, item).to_session(key)
            try:
                version = await self.store.save_session(key, updated, expected_version=stored.version)
            except ConcurrencyConflictError as exc:
                if fresh:  # another writer appended since this read: the session is stale
                    raise StaleSessionError(STALE_SESSION_MESSAGE) from exc
                stored = None
                continue
            self._remember(key, StoredSession(updated, version))
            break
        # The shared state before the event: a stored event always has its shared state stored.
        await self._share(session.app_name, session.user_id, app_delta, user_delta, event.timestamp)
        await self.store.append(key, [message])

    def _remember(self, key: SessionKey, stored: StoredSession) -> None:
        self._documents[key] = stored
        self._documents.move_to_end(key)
        while len(self._documents) > _REMEMBERED:
            self._documents.popitem(last=False)

    async def _complete(self, key: SessionKey, item: dict[str, Any], app_name: str, user_id: str) -> None:
        """Store an event the document names but the messages lack, with its shared state.

        Its writer may be between its two writes still, or have stopped there, with its shared state applied or
        not; later events may have changed the same keys since. The delta is applied late: only to keys no event
        of its time or later has set.
        """
        event = event_of(item)
        app_delta, user_delta, _ = split_delta(event.actions.state_delta if event.actions else None)
        await self._share(app_name, user_id, app_delta, user_delta, event.timestamp, late=True)
        await self.store.append(key, [message_of(event, item)])

    async def _window(
        self, key: SessionKey, recent: int | None, after: float | None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """The stored events a read needs (oldest first) and the id of the newest one stored."""
        if recent == 0:
            messages = await self.store.load(key, last=1)
            items = [item for item in map(item_of, messages) if item is not None]
            return [], items[-1]["id"] if items else None
        if after is None:
            messages = await self.store.load(key, last=recent)
        else:  # newest first, wider each round, until the window reaches past ``after``
            size = max(recent or 0, _FIRST_WINDOW)
            while True:
                messages = await self.store.load(key, last=size)
                oldest = next((item for item in map(item_of, messages) if item is not None), None)
                if len(messages) < size or oldest is None or float(oldest.get("timestamp", 0.0)) < after:
                    break
                size *= 4
        items = [item for item in map(item_of, messages) if item is not None]
        return items, (items[-1]["id"] if items else None)

    # -- the state every session of an app, or of a user, shares --------------------------------------------

    async def _share(
        self,
        app_name: str,
        user_id: str,
        app_delta: Mapping[str, Any],
        user_delta: Mapping[str, Any],
        at: float,
        *,
        late: bool = False,
    ) -> None:
        """Apply the deltas of an event of time ``at`` to the app's and the user's shared state (see
        :meth:`Document.with_delta` for ``late``)."""
        updates = []
        if app_delta:
            updates.append(self._update_shared(app_key(self.tenant, app_name), app_delta, at, late=late))
        if user_delta:
            updates.append(self._update_shared(user_key(self.tenant, app_name, user_id), user_delta, at, late=late))
        await asyncio.gather(*updates)

    async def _shared(self, key: SessionKey) -> dict[str, Any]:
        return _state_of(await self.store.load_session(key))

    async def _update_shared(
        self, key: SessionKey, delta: Mapping[str, Any], at: float, *, late: bool = False
    ) -> dict[str, Any]:
        """Apply ``delta`` of time ``at`` to a shared state document (compare and set, retried); return the state."""
        if not delta:
            return await self._shared(key)
        stored = await self._first_document(key)
        for _ in range(_CAS_ATTEMPTS):
            current = Document.of(stored.session)
            updated = current.with_delta(delta, at, late=late)
            if updated == current:
                return updated.state  # a late delta every key of which a later event has set
            try:
                await self.store.save_session(key, updated.to_session(key), expected_version=stored.version)
            except ConcurrencyConflictError:
                stored = await self._first_document(key)
                continue
            return updated.state
        raise ConcurrencyConflictError(
            f"the shared state {key.session_id} changed {_CAS_ATTEMPTS} times while this write tried to apply its "
            "delta; retry the call"
        )

    async def _first_document(self, key: SessionKey) -> StoredSession:
        """A shared state's document, made empty where there is none yet (by one writer: the others read it)."""
        empty = Document().to_session(key)
        for _ in range(_CAS_ATTEMPTS):  # more than one turn only when it is deleted (pruned) meanwhile
            stored = await self.store.load_session(key)
            if stored is not None:
                return stored
            with contextlib.suppress(ConcurrencyConflictError):  # another writer made it since the load
                return StoredSession(empty, await self.store.save_session(key, empty, expected_version=ABSENT))
        raise ConcurrencyConflictError(
            f"the shared state {key.session_id} was made and deleted {_CAS_ATTEMPTS} times while this write read "
            "it; retry the call"
        )

    # -- life cycle -----------------------------------------------------------------------------------------

    def __repr__(self) -> str:
        return f"ChatkeepSessionService(tenant={self.tenant!r}, store={type(self.store).__name__})"


def _is_stale(session: Session, document: Document) -> bool:
    """ADK's stale-session check: the store holds an event that ``session`` has not seen.

    A session with events is current when its newest event is the store's newest. One read without events
    (``num_recent_events=0``) is current unless the store was updated after it.
    """
    if session.events:
        return session.events[-1].id != document.newest_id
    return document.newest_id is not None and document.updated > session.last_update_time


def _state_of(stored: StoredSession | None) -> dict[str, Any]:
    """The state a shared state document holds (none yet: empty)."""
    return {} if stored is None else Document.of(stored.session).state
