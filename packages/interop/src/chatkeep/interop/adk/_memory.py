"""``ChatkeepMemoryService``: ADK's ``BaseMemoryService`` on chatkeep's semantic recall."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from google.adk.events import Event
from google.adk.memory import BaseMemoryService
from google.adk.memory.base_memory_service import SearchMemoryResponse
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.sessions import Session
from typing_extensions import override

from chatkeep.core import (
    DEFAULT_TENANT,
    AgentSession,
    ConcurrencyConflictError,
    Embedder,
    HistoryStore,
    InvalidArgumentError,
    Message,
    default_embedder,
)
from chatkeep.core.backend import embed_messages, searchable
from chatkeep.interop._binding import ClosesItsStore, StoreBinding
from chatkeep.interop._envelope import unwrap, wrap
from chatkeep.interop.adk._layout import memory_key

__all__ = ["ChatkeepMemoryService"]

#: The envelope format of a memory entry.
FORMAT = "adk.memory"
_MARKS = "adk.remembered"  # the memories' document: session id -> the id of the newest event remembered from it


class ChatkeepMemoryService(ClosesItsStore, BaseMemoryService):
    """An ADK memory service on chatkeep's semantic recall: memories found by meaning and by words.

    Each memory (an event's text content, or an entry given to :meth:`add_memory`) is one chatkeep message in
    the memories of its app and user (a chatkeep session of their own), indexed with its vector and its words;
    :meth:`search_memory` fuses both rankings (see chatkeep's recall docs). Adding a session again stores each
    event once: a memory's id is its session's and event's.

    Args:
        store: a store with the search capability (``memory://``, PostgreSQL with pgvector, SQLite on the apsw
            transport with sqlite-vec), as a :class:`~chatkeep.core.HistoryStore` (yours to close) or a URL.
        tenant: the chatkeep tenant the memories live in.
        embedder: the embedder (``None``: chatkeep's offline default, ``pip install "chatkeep-core[recall]"``).
        k: how many memories :meth:`search_memory` returns at most.
        store_options: options for a store opened from a URL.

    Raises:
        SearchUnsupportedError: the store cannot search (the message says which stores can).
        InvalidArgumentError: ``k`` below 1.
    """

    def __init__(
        self,
        store: HistoryStore | str,
        *,
        tenant: str = DEFAULT_TENANT,
        embedder: Embedder | None = None,
        k: int = 10,
        store_options: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidArgumentError(f"k must be a whole number of 1 or more, got {k!r}; pass k=10 for example")
        StoreBinding.key("probe", tenant)
        self._binding = StoreBinding(store, store_options=store_options)
        self._search = searchable(self._binding.store)  # a store opens lazily: one refused here holds nothing
        self.tenant = tenant
        self.embedder = embedder if embedder is not None else default_embedder()
        self.k = k

    @property
    def store(self) -> HistoryStore:
        """The store the memories live in."""
        return self._binding.store

    @override
    async def add_session_to_memory(self, session: Session) -> None:
        """Remember the session's events that hold text (each once, however often the session is added).

        Adding a session again embeds only the events after the newest one remembered from it (the memories'
        document keeps that event's id per session), so adding it after every turn costs one turn's embeddings.
        """
        key = memory_key(self.tenant, session.app_name, session.user_id)
        stored = await self.store.load_session(key)
        marks: dict[str, Any] = dict(stored.session.state.get(_MARKS, {})) if stored is not None else {}
        ids = [event.id for event in session.events]
        newest = marks.get(session.id)
        start = ids.index(newest) + 1 if newest in ids else 0
        await self._remember(session.app_name, session.user_id, session.events[start:], session.id, None)
        if start == len(ids):  # nothing new
            return
        marks[session.id] = ids[-1]
        document = AgentSession(session_id=key.session_id, tenant=key.tenant, state={_MARKS: marks})
        # Only a saving of work: a concurrent add of another session may win, and its events are embedded again.
        with contextlib.suppress(ConcurrencyConflictError):
            await self.store.save_session(key, document, expected_version=stored.version if stored else None)

    @override
    async def add_events_to_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        events: Sequence[Event],
        session_id: str | None = None,
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        """Remember these events (those that hold text), as an addition to what is remembered already."""
        await self._remember(app_name, user_id, events, session_id, custom_metadata)

    @override
    async def add_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        memories: Sequence[MemoryEntry],
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        """Remember these entries as they are (an entry with an id is stored once)."""
        extra = dict(custom_metadata or {})
        messages = [
            _message(
                entry if not extra else entry.model_copy(update={"custom_metadata": {**extra, **entry.custom_metadata}})
            )
            for entry in memories
        ]
        await self._append(app_name, user_id, messages)

    @override
    async def search_memory(self, *, app_name: str, user_id: str, query: str) -> SearchMemoryResponse:
        """The ``k`` memories of this app and user that best match ``query``, best first."""
        if not query.strip():
            return SearchMemoryResponse()
        [vector] = await self.embedder.embed([query])
        hits = await self._search.search(
            memory_key(self.tenant, app_name, user_id), vector, query, self.k, embedder=self.embedder.name
        )
        return SearchMemoryResponse(memories=[_entry(hit.message) for hit in hits])

    async def delete_memories(self, *, app_name: str, user_id: str) -> None:
        """Forget every memory of this app and user (one memory alone cannot be deleted: ``delete_memory`` is
        ADK's ``NotImplementedError``, as chatkeep deletes a session's messages together)."""
        await self.store.delete(memory_key(self.tenant, app_name, user_id))

    async def _remember(
        self,
        app_name: str,
        user_id: str,
        events: Sequence[Event],
        session_id: str | None,
        custom_metadata: Mapping[str, object] | None,
    ) -> None:
        messages = []
        for event in events:
            content = event.content
            if content is None or not any(part.text for part in content.parts or []):
                continue
            metadata: dict[str, Any] = dict(custom_metadata or {})
            if session_id is not None:
                metadata["session_id"] = session_id
            entry = MemoryEntry(
                id=json.dumps([session_id, event.id], ensure_ascii=False),
                content=content,
                author=event.author,
                timestamp=datetime.fromtimestamp(event.timestamp, timezone.utc).isoformat(),
                custom_metadata=metadata,
            )
            messages.append(_message(entry))
        await self._append(app_name, user_id, messages)

    async def _append(self, app_name: str, user_id: str, messages: list[Message]) -> None:
        if messages:
            key = memory_key(self.tenant, app_name, user_id)
            await self.store.append(key, messages, embeddings=await embed_messages(self.embedder, messages))


def _message(entry: MemoryEntry) -> Message:
    """A memory entry as a chatkeep message: its JSON kept exactly, its text for the index."""
    parts = entry.content.parts or []
    text = "\n".join(part.text for part in parts if part.text and not part.thought)
    entry_id = entry.id or str(uuid.uuid4())
    item = entry.model_dump(mode="json", exclude_none=True)
    item["id"] = entry_id
    return wrap(
        item,
        format=FORMAT,
        role="user" if entry.content.role == "user" else "assistant",
        text=text,
        message_id="adk.memory:" + entry_id,
        author_name=entry.author,
    )


def _entry(message: Message) -> MemoryEntry:
    item = unwrap(message, format=FORMAT)
    if item is None:
        return MemoryEntry(content={"role": "user", "parts": [{"text": message.text}]}, timestamp=None)
    return MemoryEntry.model_validate(item)
