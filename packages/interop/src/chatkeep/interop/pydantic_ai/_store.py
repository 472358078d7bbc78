"""``ChatkeepConversationStore``: Pydantic AI's ``ConversationStore`` on any chatkeep store.

How a conversation is laid out in chatkeep:

* its record is the session document of session ``conversation_id`` (``save_session``, whose version check is
  the record's revision check), with where its history lives: its *line* and the lines of the branches it left;
* a line is a chatkeep session holding a history as a run of entries, oldest first; the first line of a
  conversation is session ``conversation_id`` itself, so ``chatkeep sessions show`` shows the conversation;
* a save appends the new entries to the line, then writes the record (checked against the revision it read);
* a history that moves off its line's end (a branch, a rewrite, a fork) gets a new line made by
  ``store.fork(line, new, through=entry)``: by reference, in time independent of the history's length. The line it
  left stays as it is, so the branch can be read and returned to.

A history is read by following each entry's parent from the record's head, so the entries of a save whose
record write lost a race (they are appended before the record is checked) are passed over, never read.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

from pydantic_ai.conversation_store import (
    ConversationConflict,
    ConversationEntry,
    ConversationRecord,
    ConversationStore,
)

from chatkeep.core import (
    DEFAULT_TENANT,
    AgentSession,
    ConcurrencyConflictError,
    HistoryStore,
    InvalidArgumentError,
    MessageFormatError,
    SessionKey,
)
from chatkeep.interop._binding import ClosesItsStore, StoreBinding
from chatkeep.interop.pydantic_ai._entries import entries_of, history_items, messages_of, record_json, record_of

__all__ = ["ChatkeepConversationStore"]

#: The key of the session document's state that holds a conversation's record and lines.
STATE_KEY = "pydantic_ai"
#: The tag every conversation's session carries, so ``list_conversations`` reads only conversations.
TAG = "pydantic-ai"
_SCOPE_TAG = "pydantic-ai-scope:"  # + a hash of the scope: any scope fits a tag's length

_V = TypeVar("_V")


class _Recent(OrderedDict[str, _V], Generic[_V]):
    """A mapping that keeps only its ``size`` most recently set keys."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, key: str, value: _V) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where a conversation's history lives: the session of its line, and of each branch it left, by tip."""

    line: str
    branches: Mapping[str, str]

    def lines(self) -> list[str]:
        """Every line the conversation reads, its own first, then its branches', newest first."""
        return [self.line, *reversed(list(self.branches.values()))]


@dataclasses.dataclass(frozen=True)
class _Stored:
    record: ConversationRecord
    layout: _Layout
    version: str  # the session document's chatkeep version


def _scope_tag(scope: str) -> str:
    return _SCOPE_TAG + hashlib.sha256(scope.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def _tags(scope: str | None) -> set[str]:
    return {TAG} if scope is None else {TAG, _scope_tag(scope)}


class ChatkeepConversationStore(ClosesItsStore, ConversationStore):
    """A Pydantic AI conversation store whose conversations live in a chatkeep store.

    A drop-in for ``InMemoryConversationStore``: ``load`` a conversation before a run and ``save`` the run's
    result after it. Messages are kept as Pydantic AI writes them to JSON (``ModelMessagesTypeAdapter``), one
    chatkeep message per entry, and the record (usage, deferred tool requests, scope, branches, revision) as
    Pydantic AI writes it, so what a run saves is what the next run loads, field for field. Branches and forks
    share their history by reference through chatkeep's ``fork``; chatkeep's tools (``chatkeep sessions show``,
    export, copy between backends, prune, TTL, encryption) see the conversations too.

    Example:
        ```python
        store = ChatkeepConversationStore("redis://localhost:6379/0", tenant="acme")
        conversation = await store.load("c1") or Conversation(conversation_id="c1")
        result = await agent.run("Hello", conversation=conversation)
        await store.save(result)
        ```

    Args:
        store: a :class:`~chatkeep.core.HistoryStore` (you keep owning it), or a store URL or backend name that
            this store opens and closes in :meth:`close`. It needs forks, tags and ``update_info`` (memory, SQL,
            Redis and Redis Cluster have them).
        tenant: the tenant the conversations belong to; another tenant's conversation of the same id is another
            conversation, never read or listed here.
        store_options: options for a store opened from a URL (as keywords, what its query string takes).

    Raises:
        InvalidSessionKeyError: an empty or too long ``tenant``.
        UnknownBackendError: no installed backend handles the URL; the message names the extra to install.
        StoreConfigurationError: ``store_options`` with a store object, or a ``store`` of the wrong type.

    Two processes creating the same new conversation id at the same instant can both succeed (the later record
    wins; its history is intact); every other save is checked against the revision it continues.
    """

    def __init__(
        self,
        store: HistoryStore | str,
        *,
        tenant: str = DEFAULT_TENANT,
        store_options: Mapping[str, Any] | None = None,
    ) -> None:
        StoreBinding.key("-", tenant)  # checks the tenant before a store is opened
        self._binding = StoreBinding(store, store_options=store_options)
        self.tenant = tenant
        # What this instance read or wrote last, so a save right after a load finds the document's version and a
        # history its line without another read. Bounded: a miss only costs a read.
        self._stored: _Recent[_Stored] = _Recent(10_000)
        self._lines_of: _Recent[tuple[str, ...]] = _Recent(50_000)  # tip entry id -> the lines that end with it

    @property
    def store(self) -> HistoryStore:
        """The chatkeep store the conversations live in."""
        return self._binding.store

    def _key(self, session_id: str) -> SessionKey:
        return StoreBinding.key(session_id, self.tenant)

    # -- records ---------------------------------------------------------------------------------

    async def _load(self, conversation_id: str) -> _Stored | None:
        found = await self.store.load_session(self._key(conversation_id))
        state = found.session.state.get(STATE_KEY) if found is not None else None
        if found is None or (isinstance(state, dict) and state.get("deleted") is True):
            return None
        if not isinstance(state, dict) or not isinstance(state.get("record"), dict):
            raise MessageFormatError(
                f"session {conversation_id!r} holds a session document that ChatkeepConversationStore did not write; "
                "give the conversation another id, or keep Pydantic AI's conversations in a tenant of their own"
            )
        layout = _Layout(line=str(state["line"]), branches=dict(state.get("branches", {})))
        stored = _Stored(record_of(state["record"], conversation_id), layout, found.version)
        self._remember(stored)
        return stored

    def _remember(self, stored: _Stored) -> None:
        self._stored.put(stored.record.conversation_id, stored)
        tips = {**stored.layout.branches}
        if stored.record.head_id is not None:
            tips[stored.record.head_id] = stored.layout.line
        for tip, line in tips.items():
            known = self._lines_of.get(tip, ())
            self._lines_of.put(tip, (line, *(other for other in known if other != line))[:4])

    async def read_record(self, conversation_id: str) -> ConversationRecord | None:
        """The conversation's record (one document read), or ``None`` if the store doesn't have it.

        Raises:
            MessageFormatError: the session of that id holds a document this adapter did not write.
        """
        stored = await self._load(conversation_id)
        return None if stored is None else copy.deepcopy(stored.record)  # the caller's to change; the cache's stays

    async def read_records(self, *, scope: str | None = None, limit: int | None = None) -> Sequence[ConversationRecord]:
        """The conversations of the tenant (or of ``scope`` in it), newest ``updated_at`` first, at most ``limit``.

        Reads only the sessions tagged as conversations (of that scope), a page of documents at a time.
        """
        tag = TAG if scope is None else _scope_tag(scope)
        records: list[ConversationRecord] = []
        cursor: str | None = None
        while limit is None or len(records) < limit:
            page = await self.store.list_sessions(self.tenant, tag=tag, limit=100, cursor=cursor)
            found = await asyncio.gather(*(self._load(info.session_id) for info in page.items))
            records += [
                copy.deepcopy(s.record) for s in found if s is not None and (scope is None or s.record.scope == scope)
            ]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        records.sort(key=lambda record: record.updated_at, reverse=True)
        return records[:limit]

    async def _stored_at(self, conversation_id: str, revision: str | None) -> _Stored | None:
        """The stored conversation at ``revision`` (``None``: one not stored yet), or ConversationConflict."""
        known = self._stored.get(conversation_id)
        if known is not None and revision is not None and known.record.revision == revision:
            return known  # if it changed since, the document's version check refuses the write
        stored = await self._load(conversation_id)
        if (stored.record.revision if stored is not None else None) != revision:
            raise ConversationConflict(conversation_id)
        return stored

    async def write_record(
        self,
        record: ConversationRecord,
        *,
        new_entries: Sequence[ConversationEntry] = (),
        expected_revision: str | None,
    ) -> None:
        """Append the new entries to the conversation's line, then write its record if its revision is unchanged.

        A save that extends the history appends to its line and writes the document: three round trips with the
        ``read_record`` before it, whatever the history's length. A history that leaves its line's end (a
        branch, a rewrite, a fork) first gets a new line through chatkeep's ``fork``, by reference.

        Raises:
            ConversationConflict: the stored revision is not ``expected_revision`` (a record exists when it is
                ``None``), or the entry the history continues from is not in the conversation's lines.
        """
        conversation_id = record.conversation_id
        stored = await self._stored_at(conversation_id, expected_revision)
        anchor = new_entries[0].parent_id if new_entries else record.head_id
        if stored is None:
            layout, made = await self._start(record, anchor, forking=not new_entries), None
        else:
            layout, made = await self._continue(stored, record, anchor)
        if new_entries:
            await self.store.append(self._key(layout.line), messages_of(new_entries))
        state = {"record": record_json(record), "line": layout.line, "branches": dict(layout.branches)}
        document = AgentSession(session_id=conversation_id, tenant=self.tenant, state={STATE_KEY: state})
        key = self._key(conversation_id)
        try:
            version = await self.store.save_session(
                key, document, expected_version=stored.version if stored is not None else None
            )
        except ConcurrencyConflictError as exc:
            if made is not None:  # the line this save started is no one's
                await self.store.delete(self._key(made))
            raise ConversationConflict(conversation_id) from exc
        if stored is None:
            # A new conversation's document is written unconditionally (chatkeep has no create-if-absent): a
            # creator that finds another's document after it lost the race.
            now = await self.store.load_session(key)
            if now is None or now.version != version:
                raise ConversationConflict(conversation_id)
            await self.store.update_info(key, tags=_tags(record.scope))
        self._remember(_Stored(record, layout, version))

    async def _start(self, record: ConversationRecord, anchor: str | None, *, forking: bool) -> _Layout:
        """The layout of a new conversation: its own session as its line, holding a fork's history by reference."""
        conversation_id = record.conversation_id
        if anchor is None:
            return _Layout(line=conversation_id, branches={})
        source = self._stored.get(record.forked_from) if record.forked_from is not None else None
        if source is None and record.forked_from is not None:
            source = await self._load(record.forked_from)
        if not forking or source is None:
            raise ConversationConflict(conversation_id)  # it continues a history that isn't stored
        await self._fork_line(source.layout, anchor, conversation_id, conversation_id)
        return _Layout(line=conversation_id, branches={})

    async def _continue(
        self, stored: _Stored, record: ConversationRecord, anchor: str | None
    ) -> tuple[_Layout, str | None]:
        """The layout after a save or branch from ``anchor``, and the line it made (``None``: none)."""
        line, branches, made = stored.layout.line, dict(stored.layout.branches), None
        old_head = stored.record.head_id
        if anchor != old_head:
            if old_head is not None:
                branches[old_head] = line  # the history it leaves stays readable, as a branch
            if anchor in branches:
                line = branches[anchor]  # back to the end of a branch: continue its own line
            else:
                made = line = f"pydantic-ai-line-{uuid.uuid4().hex}"
                if anchor is not None:
                    await self._fork_line(stored.layout, anchor, made, record.conversation_id)
                    await self.store.update_info(self._key(made), tags=set())  # a line is not a conversation
        kept = {tip: branch for tip, branch in branches.items() if tip in record.branches and tip != record.head_id}
        return _Layout(line=line, branches=kept), made

    async def _fork_line(self, layout: _Layout, entry_id: str, target: str, conversation_id: str) -> None:
        """Make session ``target`` hold the history up to ``entry_id``, from whichever line of ``layout`` has it.

        Raises:
            ConversationConflict: (naming ``conversation_id``) ``target`` exists, or no line holds ``entry_id``.
        """
        for line in layout.lines():
            try:
                await self.store.fork(self._key(line), self._key(target), through=entry_id)
            except InvalidArgumentError:
                continue  # not in this line
            except ConcurrencyConflictError as exc:
                raise ConversationConflict(conversation_id) from exc
            return
        raise ConversationConflict(conversation_id)

    async def delete_record(self, conversation_id: str, *, expected_revision: str) -> None:
        """Delete the conversation's record and lines, if its revision is ``expected_revision``.

        The record is first replaced by a tombstone under the document's version check, so a concurrent save
        makes this raise instead of being lost. The conversation's messages are deleted with its lines; a fork
        made from it keeps its own history (chatkeep's forks never depend on their source).

        Raises:
            ConversationConflict: the conversation is not stored at ``expected_revision``.
        """
        stored = await self._load(conversation_id)
        if stored is None or stored.record.revision != expected_revision:
            raise ConversationConflict(conversation_id)
        key = self._key(conversation_id)
        tombstone = AgentSession(session_id=conversation_id, tenant=self.tenant, state={STATE_KEY: {"deleted": True}})
        try:
            await self.store.save_session(key, tombstone, expected_version=stored.version)
        except ConcurrencyConflictError as exc:
            raise ConversationConflict(conversation_id) from exc
        self._stored.pop(conversation_id, None)
        for line in set(stored.layout.lines()) - {conversation_id}:
            await self.store.delete(self._key(line))
        await self.store.delete(key)

    # -- entries ---------------------------------------------------------------------------------

    async def read_history(self, head_id: str | None, *, limit: int | None = None) -> list[ConversationEntry]:
        """The history ending at ``head_id``, oldest first (only the ``limit`` newest): one read of its line.

        ``head_id`` is the head of a conversation or the tip of a branch it left, as the record read before
        (``load``, ``save``, ``branch`` and ``fork`` read it first) names them.

        Raises:
            LookupError: no line this store read ends with ``head_id``, or its entries are gone.
        """
        if head_id is None or limit == 0:
            return []
        for line in self._lines_of.get(head_id, ()):
            key = self._key(line)
            window = await self.store.load(key, last=limit)
            items = history_items(window, head_id, limit)
            if items is None and limit is not None and len(window) == limit:
                items = history_items(await self.store.load(key), head_id, limit)  # a failed save's entries
            if items is not None:
                return entries_of(items)
        raise LookupError(
            f"entry {head_id!r} ends no conversation or branch this store has read (or its messages are gone); "
            "load the conversation first (store.load or store.read_record)"
        )

    async def read_entry(self, entry_id: str) -> ConversationEntry:
        """The entry with this id, searched in the lines of the conversations this store has read.

        Reads whole lines: to tie a rating or a bill to an entry, keep the ids ``save`` and ``load_entries``
        return instead.

        Raises:
            LookupError: no line this store has read holds the entry.
        """
        lines = dict.fromkeys(
            [
                *self._lines_of.get(entry_id, ()),
                *(ln for s in reversed(self._stored.values()) for ln in s.layout.lines()),
            ]
        )
        for line in lines:
            async for message in self.store.iter_messages(self._key(line)):
                if message.message_id == entry_id:
                    items = history_items([message], entry_id, 1)
                    assert items is not None  # the message itself was passed
                    return entries_of(items)[0]
        raise LookupError(
            f"entry {entry_id!r} is in no conversation this store has read; load its conversation first "
            "(store.load_entries returns its entries with their ids)"
        )

    def __repr__(self) -> str:
        return f"ChatkeepConversationStore(tenant={self.tenant!r}, store={type(self.store).__name__})"
