"""LlamaIndex chat store on chatkeep: :class:`ChatkeepChatStore`, a ``BaseChatStore`` for its memory classes.

``ChatMemoryBuffer.from_defaults(chat_store=ChatkeepChatStore("redis://localhost:6379/0", tenant="acme"),
chat_store_key="user-1")`` keeps a chat engine's or an agent's history in any chatkeep backend. Each
LlamaIndex ``key`` is the session id of a :class:`SessionKey` under the chat store's one tenant, and each
``ChatMessage`` is kept as its own JSON form (``model_dump(mode="json")``: role, content blocks,
``additional_kwargs`` with tool calls), so what LlamaIndex writes is what it reads back, field for field.

LlamaIndex calls both sides of one chat store (``ChatMemoryBuffer.aget`` reads with the sync
``get_messages`` on a worker thread while ``aput`` writes with the async ``async_add_message``), and its sync
methods are often called where an event loop is running, which a blocking call must not wait on. The chat
store therefore runs every call on its store's sync view (:meth:`HistoryStore.sync`, a private event loop);
a sync call waits for it, from any thread, without needing or blocking an event loop of its own, and an
async call awaits the store on the view's loop (``view.arun``), so the caller's event loop keeps running.
The store itself serves any number of event loops (``store.serves_any_loop``), so the same store can also
be used directly, by other code on other loops, meanwhile.

:class:`ChatkeepChatMemoryBuffer` is LlamaIndex's ``ChatMemoryBuffer`` reading only the newest messages, and
:class:`ChatkeepDBChatStore` is the store of LlamaIndex's newer ``Memory`` (active and archived messages).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar, cast

from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.llms import LLM, ChatMessage, MessageRole
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.core.memory.types import DEFAULT_CHAT_STORE_KEY
from llama_index.core.storage.chat_store.base import BaseChatStore
from llama_index.core.storage.chat_store.base_db import AsyncDBChatStore, MessageStatus
from pydantic_core import PydanticSerializationError

from chatkeep.core import (
    DEFAULT_TENANT,
    HistoryStore,
    InvalidArgumentError,
    Message,
    MessageFormatError,
    Role,
    SessionKey,
    SyncHistoryStore,
)
from chatkeep.interop._binding import StoreBinding
from chatkeep.interop._envelope import unwrap, wrap

__all__ = ["DEFAULT_MAX_MESSAGES", "FORMAT", "ChatkeepChatMemoryBuffer", "ChatkeepChatStore", "ChatkeepDBChatStore"]

#: The envelope format of a LlamaIndex ``ChatMessage`` (its ``model_dump(mode="json")``).
FORMAT = "llama-index.chat-message"

_ROLES: dict[MessageRole, Role] = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
    MessageRole.TOOL: "tool",
    MessageRole.FUNCTION: "tool",
}

_PAGE = 500  # sessions per list_sessions page in get_keys

T = TypeVar("T")


def _encode(message: ChatMessage) -> Message:
    if not isinstance(message, ChatMessage):
        raise InvalidArgumentError(
            f"a LlamaIndex chat store keeps ChatMessage objects, got {type(message).__name__}; "
            "wrap the text as ChatMessage(role='user', content=...)"
        )
    try:
        item = message.model_dump(mode="json")
    except PydanticSerializationError as exc:
        raise MessageFormatError(
            f"a {message.role.value} ChatMessage holds a value that is not JSON ({exc}); keep only JSON values "
            "(text, numbers, lists, dicts, pydantic models, bytes) in its additional_kwargs and blocks"
        ) from exc
    # A role a later LlamaIndex adds is still kept exactly in the item; only the readable rendering guesses.
    role = _ROLES.get(MessageRole(message.role), "assistant")
    return wrap(item, format=FORMAT, role=role, text=message.content or "")


def _decode(message: Message) -> ChatMessage:
    item = unwrap(message, format=FORMAT)
    if item is None:  # written by chatkeep itself (its own agents): its role and text
        return ChatMessage(role=MessageRole(message.role), content=message.text)
    return ChatMessage.model_validate(item)


def _decode_all(messages: Sequence[Message]) -> list[ChatMessage]:
    return [_decode(message) for message in messages]


def _decode_one(message: Message | None) -> ChatMessage | None:
    return None if message is None else _decode(message)


def _index(idx: object) -> int:
    if isinstance(idx, bool) or not isinstance(idx, int):
        raise InvalidArgumentError(f"idx must be a whole number (a position in the history), got {idx!r}")
    return idx


def _insert_index(idx: object) -> int:
    if _index(idx) < 0:
        raise InvalidArgumentError(f"idx must be 0 or more to insert a message, got {idx}")
    return cast(int, idx)


# -- the chat store's multi-step rules, written once ------------------------------------------------------------
#
# A rule that makes several store calls (set_messages, a splice, get_keys' paging) is one coroutine over the
# store. Blocking methods run it with ``view.run`` and async methods with ``view.arun``: either way it runs whole on
# the view's loop, as one call.


async def _to_the_end(rule: Coroutine[Any, Any, T]) -> T:
    """Run a multi-step write on the view's loop to its end even if its caller is cancelled.

    Stopping a splice halfway would lose the messages it took off the end; so a cancelled caller stops waiting
    and the write still finishes (or fails) whole, on the view's loop.
    """
    return await asyncio.shield(rule)  # (shield marks the error of a write nobody awaits any more as retrieved)


async def _keys(store: HistoryStore, tenant: str) -> list[str]:
    """The tenant's session ids that hold messages, page by page, the most recently changed first."""
    keys: list[str] = []
    cursor: str | None = None
    while True:
        page = await store.list_sessions(tenant, limit=_PAGE, cursor=cursor)
        keys.extend(info.session_id for info in page.items if info.message_count)
        if page.next_cursor is None:
            return keys
        cursor = page.next_cursor


async def _replace(store: HistoryStore, key: SessionKey, stored: Sequence[Message]) -> None:
    """Append the new history (atomically), then drop the old one: never an empty or partial history between."""
    if stored:
        await store.append(key, stored)
    await store.trim(key, len(stored))


async def _splice(
    store: HistoryStore, key: SessionKey, idx: int, *, remove: bool, insert: Sequence[Message]
) -> Message | None:
    """Remove the message at ``idx`` (``remove``) and/or put ``insert`` there, keeping the rest in order.

    The contract appends only at the end, and removes only the newest (``pop``) or the oldest (``trim``):
    so the messages after ``idx`` come off the end and go back (with their own ids, so a repeated append
    never doubles them). The oldest and the newest are removed in one atomic step. Returns the removed message.
    """
    total = await store.count(key)
    if idx >= total:
        if not remove and insert:
            await store.append(key, insert)
        return None
    if remove and not insert and idx == total - 1:
        return await store.pop(key)
    if remove and not insert and idx == 0:
        oldest = await _oldest(store, key, 1)
        deleted = await store.trim(key, total - 1)
        return oldest[0] if deleted and oldest else None
    tail = await store.load(key, last=total - idx)
    first_id = tail[0].message_id
    taken: list[Message] = []
    while True:  # pop back to (and including) the message now at idx, also past messages added meanwhile
        popped = await store.pop(key)
        if popped is None:
            break
        taken.append(popped)
        if popped.message_id == first_id:
            break
    taken.reverse()
    removed = taken.pop(0) if remove and taken and taken[0].message_id == first_id else None
    restore = [*insert, *taken]
    if restore:
        await store.append(key, restore)
    return removed


class ChatkeepChatStore(BaseChatStore):
    """A LlamaIndex chat store that keeps every key's history in a chatkeep store, under one tenant.

    Use it wherever LlamaIndex takes a ``BaseChatStore``: ``ChatMemoryBuffer.from_defaults(chat_store=...,
    chat_store_key=...)``, ``ChatSummaryMemoryBuffer``, and the agents and chat engines that take such a memory.

    Beyond LlamaIndex's own stores:

    * ``delete_message(key, idx)`` removes exactly the message at ``idx`` and keeps the order of the rest.
    * ``delete_last_message`` is one atomic step (two callers never get the same message).
    * ``get_messages(key, last=20)`` reads only the newest 20.
    * ``get_keys`` lists this tenant's keys only, not every key on the server.

    Atomicity, per call: ``add_message`` (at the end), ``delete_messages`` and ``delete_last_message`` are
    atomic. ``set_messages`` appends the new history, then drops the old one: a reader in between sees the
    old messages followed by the new ones (never an empty or partial history), and a failure in between
    leaves both, never neither. ``delete_message`` of the oldest or newest message is atomic; of a message
    in between, and ``add_message`` with ``idx``, take the later messages off the end one by one and put
    them back: exact and in order, but a reader in between sees the shorter history, and if the process dies
    in between those later messages are lost. Calls that change one key at the same moment from two places
    are exact only for the atomic ones. (LlamaIndex's memory classes use ``get_messages``, ``add_message``,
    ``set_messages`` and ``delete_messages``.)

    Args:
        store: a store URL (``"sqlite:///chat.db"``) or a backend name (``"memory"``), which the chat store
            opens and :meth:`close` closes; a :class:`HistoryStore`, which it takes over (its calls from this
            chat store run on the chat store's private loop, and :meth:`close` closes it); or a
            :class:`SyncHistoryStore` (``store.sync()``) that stays yours, to share one store between several
            chat stores.
        tenant: the tenant every key of this chat store belongs to.
        store_options: options for a store opened from a URL (what its query takes, as keywords).

    Raises:
        UnknownBackendError: no installed backend handles the URL; the message names the extra to install.
        StoreConfigurationError: ``store_options`` given with a store object, or ``store`` of the wrong type.
        InvalidSessionKeyError: ``tenant`` is empty or too long.
    """

    tenant: str = Field(default=DEFAULT_TENANT, description="The chatkeep tenant every key belongs to.")

    _view: SyncHistoryStore = PrivateAttr()
    _owns_view: bool = PrivateAttr()

    def __init__(
        self,
        store: HistoryStore | SyncHistoryStore | str = "memory",
        *,
        tenant: str = DEFAULT_TENANT,
        store_options: Mapping[str, Any] | None = None,
    ) -> None:
        StoreBinding.key("-", tenant)  # checks the tenant before anything is opened
        super().__init__(tenant=tenant)
        # The binding resolves a URL and checks the arguments (store_options only with a URL), also for a view.
        binding = StoreBinding(
            store.store if isinstance(store, SyncHistoryStore) else store, store_options=store_options
        )
        if isinstance(store, SyncHistoryStore):
            self._view, self._owns_view = store, False
        else:
            self._view, self._owns_view = binding.store.sync(), True

    @classmethod
    def class_name(cls) -> str:
        """The name LlamaIndex serializes this chat store under."""
        return "ChatkeepChatStore"

    @property
    def store(self) -> SyncHistoryStore:
        """The sync view every call runs on (``.store`` on it is the async store, for ``describe()``)."""
        return self._view

    def _key(self, key: str) -> SessionKey:
        return StoreBinding.key(key, self.tenant)

    # -- reads -------------------------------------------------------------------------------------

    def get_messages(self, key: str, *, last: int | None = None) -> list[ChatMessage]:
        """The key's messages in the order they were added; with ``last=k``, only the k newest (reading only those).

        Raises:
            MessageFormatError: the key holds another framework's messages (written through another adapter).
        """
        return _decode_all(self._view.load(self._key(key), last=last))

    async def aget_messages(self, key: str, *, last: int | None = None) -> list[ChatMessage]:
        """:meth:`get_messages` for async code (the event loop runs other tasks while the store reads)."""
        session, view = self._key(key), self._view
        return _decode_all(await view.arun(view.store.load(session, last=last)))

    def get_keys(self) -> list[str]:
        """The keys of this tenant that hold messages, the most recently changed first."""
        return self._view.run(_keys(self._view.store, self.tenant))

    async def aget_keys(self) -> list[str]:
        """:meth:`get_keys` for async code (all its pages in one trip to the store's loop)."""
        view = self._view
        return await view.arun(_keys(view.store, self.tenant))

    # -- writes ------------------------------------------------------------------------------------

    def add_message(self, key: str, message: ChatMessage, idx: int | None = None) -> None:
        """Add a message at the end (atomically), or before position ``idx`` as ``list.insert`` does (``idx >= 0``).

        Raises:
            InvalidArgumentError: ``message`` is not a ``ChatMessage``, or ``idx`` is negative.
            MessageFormatError: the message holds a value that is not JSON (nothing is stored).
            MessageTooLargeError: the message is over the store's ``max_message_bytes``.
        """
        session, stored = self._key(key), _encode(message)
        if idx is None:
            self._view.append(session, [stored])
        else:
            self._view.run(_splice(self._view.store, session, _insert_index(idx), remove=False, insert=[stored]))

    async def async_add_message(self, key: str, message: ChatMessage, idx: int | None = None) -> None:
        """:meth:`add_message` for async code. Cancelled, an append at the end is stored whole or not at all;
        an insert at ``idx`` that started still finishes (the caller just stops waiting)."""
        session, stored, view = self._key(key), _encode(message), self._view
        if idx is None:
            await view.arun(view.store.append(session, [stored]))
        else:
            rule = _splice(view.store, session, _insert_index(idx), remove=False, insert=[stored])
            await view.arun(_to_the_end(rule))

    def add_messages(self, key: str, messages: Sequence[ChatMessage]) -> None:
        """Add several messages at the end in one atomic append (all or none), in their order.

        Not part of LlamaIndex's ``BaseChatStore``: :class:`ChatkeepChatMemoryBuffer` uses it for ``put_messages``
        (an agent's tool call and its result are stored together or not at all).

        Raises:
            InvalidArgumentError: an item is not a ``ChatMessage`` (nothing is stored).
            MessageFormatError: a message holds a value that is not JSON (nothing is stored).
            MessageTooLargeError: a message is over the store's ``max_message_bytes`` (nothing is stored).
        """
        session, stored = self._key(key), [_encode(message) for message in messages]
        if stored:
            self._view.append(session, stored)

    async def async_add_messages(self, key: str, messages: Sequence[ChatMessage]) -> None:
        """:meth:`add_messages` for async code; cancelled, the messages are stored all or none."""
        session, stored, view = self._key(key), [_encode(message) for message in messages], self._view
        if stored:
            await view.arun(view.store.append(session, stored))

    def set_messages(self, key: str, messages: list[ChatMessage]) -> None:
        """Replace the key's history with ``messages``: appends them (atomically), then drops the older ones.

        Raises:
            MessageTooLargeError: a message is over the store's limit (the old history is left as it was).
        """
        session, stored = self._key(key), [_encode(message) for message in messages]
        self._view.run(_replace(self._view.store, session, stored))

    async def aset_messages(self, key: str, messages: list[ChatMessage]) -> None:
        """:meth:`set_messages` for async code; cancelled once started, it still finishes (never half done)."""
        session, stored, view = self._key(key), [_encode(message) for message in messages], self._view
        await view.arun(_to_the_end(_replace(view.store, session, stored)))

    def delete_messages(self, key: str) -> None:
        """Delete the key's whole history (atomically); returns ``None`` rather than read it all first."""
        self._view.delete(self._key(key))

    async def adelete_messages(self, key: str) -> None:
        """:meth:`delete_messages` for async code."""
        session, view = self._key(key), self._view
        await view.arun(view.store.delete(session))

    def delete_last_message(self, key: str) -> ChatMessage | None:
        """Remove the newest message and return it, in one atomic step; ``None`` when the key has none."""
        return _decode_one(self._view.pop(self._key(key)))

    async def adelete_last_message(self, key: str) -> ChatMessage | None:
        """:meth:`delete_last_message` for async code."""
        session, view = self._key(key), self._view
        return _decode_one(await view.arun(view.store.pop(session)))

    def delete_message(self, key: str, idx: int) -> ChatMessage | None:
        """Remove the message at position ``idx`` and return it, keeping the others in order.

        ``None`` (and nothing removed) when ``idx`` is negative or past the end, as in LlamaIndex's own stores.
        """
        session = self._key(key)
        if _index(idx) < 0:
            return None
        return _decode_one(self._view.run(_splice(self._view.store, session, idx, remove=True, insert=[])))

    async def adelete_message(self, key: str, idx: int) -> ChatMessage | None:
        """:meth:`delete_message` for async code; cancelled once started, it still finishes (never half done)."""
        session, view = self._key(key), self._view
        if _index(idx) < 0:
            return None
        rule = _splice(view.store, session, idx, remove=True, insert=[])
        return _decode_one(await view.arun(_to_the_end(rule)))

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the store and its private loop, unless the store is a :class:`SyncHistoryStore` you passed."""
        if self._owns_view:
            self._view.close()

    async def aclose(self) -> None:
        """:meth:`close` for async code."""
        await asyncio.to_thread(self.close)

    def __repr__(self) -> str:
        return f"<ChatkeepChatStore tenant={self.tenant!r} on {self._view.store!r}>"


# -- a memory that reads a window ----------------------------------------------------------------------------------

#: How many of the newest messages :class:`ChatkeepChatMemoryBuffer` reads by default.
DEFAULT_MAX_MESSAGES = 100

# A history must not start with these once older messages were dropped: a tool result whose call is gone, or an
# assistant turn whose question is gone (the rule ChatMemoryBuffer applies as it drops messages for its token limit).
_NO_LEADING = (MessageRole.TOOL, MessageRole.ASSISTANT)


def _check_max_messages(max_messages: object) -> int:
    if type(max_messages) is not int or max_messages < 1:
        raise InvalidArgumentError(
            f"max_messages must be a whole number of at least 1 (how many of the newest messages to read), "
            f"not {max_messages!r}"
        )
    return max_messages


def _check_chat_store(chat_store: object) -> ChatkeepChatStore:
    if not isinstance(chat_store, ChatkeepChatStore):
        raise InvalidArgumentError(
            f"ChatkeepChatMemoryBuffer reads its window from a ChatkeepChatStore, not a {type(chat_store).__name__}; "
            "pass chat_store=ChatkeepChatStore(url, tenant=...), or use LlamaIndex's ChatMemoryBuffer for another store"
        )
    return chat_store


class ChatkeepChatMemoryBuffer(ChatMemoryBuffer):
    """LlamaIndex's ``ChatMemoryBuffer`` that reads only the newest ``max_messages`` from a :class:`ChatkeepChatStore`.

    ``ChatMemoryBuffer.get`` reads the key's whole history, then drops the oldest messages until the rest fits its
    ``token_limit``: at 10,000 messages that is slow. This memory asks the store for the newest ``max_messages``
    only (plus one, to know whether older messages exist), then applies the same token limit inside that window,
    with the same rule: once older messages are dropped, the history never starts with a tool or assistant
    message (its call or its question was dropped). ``aget`` reads on the async path. Use it wherever a
    ``ChatMemoryBuffer`` goes (``SimpleChatEngine.from_defaults(memory=...)``, ``FunctionAgent.run(memory=...)``).

    What it returns is what ``ChatMemoryBuffer`` returns whenever that fits in ``max_messages`` messages; when the
    token limit would let more through, it returns the newest ``max_messages`` (choose ``max_messages`` above the
    number of messages your token limit holds). The store keeps every message: ``get_all`` still reads them all.
    ``put_messages`` (an agent's tool call with its result) is one atomic append.

    Example:
        ``ChatkeepChatMemoryBuffer.from_defaults(chat_store=ChatkeepChatStore(url), chat_store_key="user-1",
        max_messages=100)``

    Raises:
        InvalidArgumentError: ``chat_store`` is not a :class:`ChatkeepChatStore`, or ``max_messages`` is below 1.
    """

    max_messages: int = Field(
        default=DEFAULT_MAX_MESSAGES, description="How many of the newest messages get() reads from the store."
    )

    def __init__(self, **data: Any) -> None:
        _check_chat_store(data.get("chat_store"))
        _check_max_messages(data.get("max_messages", DEFAULT_MAX_MESSAGES))
        super().__init__(**data)

    @classmethod
    def class_name(cls) -> str:
        """The name LlamaIndex serializes this memory under."""
        return "ChatkeepChatMemoryBuffer"

    @classmethod
    def from_defaults(
        cls,
        chat_history: list[ChatMessage] | None = None,
        llm: LLM | None = None,
        chat_store: BaseChatStore | None = None,
        chat_store_key: str = DEFAULT_CHAT_STORE_KEY,
        token_limit: int | None = None,
        tokenizer_fn: Callable[[str], list[Any]] | None = None,
        *,
        max_messages: int = DEFAULT_MAX_MESSAGES,
        **kwargs: Any,
    ) -> ChatkeepChatMemoryBuffer:
        """``ChatMemoryBuffer.from_defaults`` (token limit from ``llm`` or ``token_limit``), with ``max_messages``.

        ``chat_store`` is required: a :class:`ChatkeepChatStore`. ``chat_history`` replaces the key's history.
        """
        _check_chat_store(chat_store)
        _check_max_messages(max_messages)
        memory = super().from_defaults(
            chat_history=chat_history,
            llm=llm,
            chat_store=chat_store,
            chat_store_key=chat_store_key,
            token_limit=token_limit,
            tokenizer_fn=tokenizer_fn,
            **kwargs,
        )
        memory.max_messages = max_messages  # type: ignore[attr-defined]  # super() built it with cls
        return cast("ChatkeepChatMemoryBuffer", memory)

    @property
    def _chatkeep(self) -> ChatkeepChatStore:
        return _check_chat_store(self.chat_store)

    def get(self, input: str | None = None, initial_token_count: int = 0, **kwargs: Any) -> list[ChatMessage]:
        """The newest messages that fit the token limit, read from a window of ``max_messages``."""
        self._check_initial(initial_token_count)
        read = self._chatkeep.get_messages(self.chat_store_key, last=self.max_messages + 1)
        return self._fit(read, initial_token_count)

    async def aget(self, input: str | None = None, initial_token_count: int = 0, **kwargs: Any) -> list[ChatMessage]:
        """:meth:`get` for async code: the store is read on the async path (the event loop runs on meanwhile)."""
        self._check_initial(initial_token_count)
        read = await self._chatkeep.aget_messages(self.chat_store_key, last=self.max_messages + 1)
        return self._fit(read, initial_token_count)

    def put_messages(self, messages: list[ChatMessage]) -> None:
        """Add the messages at the end in one atomic append (all or none)."""
        self._chatkeep.add_messages(self.chat_store_key, messages)

    async def aput_messages(self, messages: list[ChatMessage]) -> None:
        """:meth:`put_messages` for async code."""
        await self._chatkeep.async_add_messages(self.chat_store_key, messages)

    def _check_initial(self, initial_token_count: int) -> None:
        if initial_token_count > self.token_limit:
            raise InvalidArgumentError(
                f"initial_token_count ({initial_token_count}) is over the memory's token_limit ({self.token_limit}): "
                "raise token_limit, or put fewer tokens before the history"
            )

    def _fit(self, read: list[ChatMessage], initial_token_count: int) -> list[ChatMessage]:
        """The window's newest messages within the token limit (``read`` holds one message more than a full window).

        The candidate starts are those ``ChatMemoryBuffer.get`` steps through: drop one message, then any tool or
        assistant messages the history would start with, keeping at least one. Token counts only shrink as
        messages are dropped, so the first start that fits is found from a guess made with each message's own
        count, settled by exact counts (a few, not one per dropped message).
        """
        cut = len(read) > self.max_messages  # older messages exist: the window starts after a dropped one
        window = read[len(read) - self.max_messages :] if cut else read
        last = len(window) - 1

        def skip_leading(start: int) -> int:
            while start < last and window[start].role in _NO_LEADING:
                start += 1
            return start

        candidates = [skip_leading(0) if cut else 0]
        while candidates[-1] < last:
            candidates.append(skip_leading(candidates[-1] + 1))

        def fits(start: int) -> bool:
            return self._token_count_for_messages(window[start:]) + initial_token_count <= self.token_limit

        if fits(candidates[0]):  # the usual case: the whole window fits (one token count, as ChatMemoryBuffer)
            return window[candidates[0] :]
        # Guess the first start that fits from each message's own count (one tokenizer pass over the window),
        # then settle it with exact counts of the joined suffix: a step or two from the guess.
        sizes = [self._token_count_for_messages([message]) for message in window]
        suffix = [0] * (len(window) + 1)
        for n in range(len(window) - 1, -1, -1):
            suffix[n] = suffix[n + 1] + sizes[n]
        budget = self.token_limit - initial_token_count
        low = next((n for n, start in enumerate(candidates) if suffix[start] <= budget), len(candidates) - 1)
        low = min(max(low, 1), len(candidates) - 1)  # candidates[0] does not fit
        while low > 1 and fits(candidates[low - 1]):
            low -= 1
        while low < len(candidates) - 1 and not fits(candidates[low]):
            low += 1
        # One message over the limit on its own is still returned, as ChatMemoryBuffer does (the LLM then says so).
        return window[candidates[low] :]


# -- a store for LlamaIndex's Memory ------------------------------------------------------------------------------


def _archive_tenant(tenant: str) -> str:
    return f"{tenant}.llama-index-archived"


async def _oldest(store: HistoryStore, key: SessionKey, n: int) -> list[Message]:
    """The ``n`` oldest messages of a session (read ``n`` at a time: only those)."""
    if n <= 0:
        return []
    messages = store.iter_messages(key, batch=n)
    found: list[Message] = []
    try:
        async for message in messages:
            found.append(message)
            if len(found) == n:
                break
    finally:
        aclose = getattr(messages, "aclose", None)
        if aclose is not None:
            await aclose()
    return found


async def _take_oldest(store: HistoryStore, key: SessionKey, archive: SessionKey | None, n: int) -> list[Message]:
    """Remove the ``n`` oldest active messages (archiving them first when ``archive`` is given) and return them."""
    taken = await _oldest(store, key, n)
    if not taken:
        return []
    if archive is not None:
        await store.append(archive, taken)  # first: a failure before the trim leaves them active, never lost
    await store.trim(key, max(0, await store.count(key) - len(taken)))
    return taken


class ChatkeepDBChatStore(AsyncDBChatStore):
    """A store for LlamaIndex's ``Memory`` (``Memory.from_defaults(chat_store=...)``) kept in a chatkeep store.

    ``Memory`` keeps a short queue of *active* messages under its token limit and moves the oldest ones out as
    *archived* messages (handing them to its memory blocks). Here a key's active messages are the session ``key``
    of the tenant, so a :class:`ChatkeepChatStore` of the same tenant reads the same conversation; its archived
    messages are the session ``key`` of the tenant ``"<tenant>.llama-index-archived"``. Every call is async and
    runs on the store's sync view (its own event loop), so ``Memory``'s sync methods, which run each call
    in a new event loop, work too.

    Archiving copies the oldest active messages to the archive, then drops them from the queue: a failure in
    between leaves them in both (with their own ids, so they are not doubled in the archive if archived again),
    never in neither. Two writers moving one key's queue at the same moment are not safe (``Memory`` writes one
    key from one place). ``delete_message(key, idx)`` takes a position in the active queue (LlamaIndex's SQL store
    takes a row id there); ``get_messages`` with ``offset`` or ``limit`` reads the messages before them too.

    Args:
        store: as for :class:`ChatkeepChatStore`: a store URL or backend name (opened, and closed by
            :meth:`close`), a :class:`HistoryStore` (taken over), or a :class:`SyncHistoryStore` that stays yours.
        tenant: the tenant of every key.
        store_options: options for a store opened from a URL.

    Raises:
        UnknownBackendError: no installed backend handles the URL; the message names the extra to install.
        StoreConfigurationError: ``store_options`` given with a store object, or ``store`` of the wrong type.
        InvalidSessionKeyError: ``tenant`` is empty or too long.
    """

    tenant: str = Field(default=DEFAULT_TENANT, description="The chatkeep tenant every key belongs to.")

    _chat: ChatkeepChatStore = PrivateAttr()

    def __init__(
        self,
        store: HistoryStore | SyncHistoryStore | str = "memory",
        *,
        tenant: str = DEFAULT_TENANT,
        store_options: Mapping[str, Any] | None = None,
    ) -> None:
        chat = ChatkeepChatStore(store, tenant=tenant, store_options=store_options)
        StoreBinding.key("-", _archive_tenant(tenant))  # the archive's tenant is a valid tenant too
        super().__init__(tenant=tenant)
        self._chat = chat

    @classmethod
    def class_name(cls) -> str:
        """The name LlamaIndex serializes this store under."""
        return "ChatkeepDBChatStore"

    @property
    def chat_store(self) -> ChatkeepChatStore:
        """The chat store of the active messages (the same sessions; for ``ChatMemoryBuffer`` or inspection)."""
        return self._chat

    def _keys(self, key: str) -> tuple[SessionKey, SessionKey]:
        return StoreBinding.key(key, self.tenant), StoreBinding.key(key, _archive_tenant(self.tenant))

    def _sessions(self, key: str, status: MessageStatus | None) -> list[SessionKey]:
        """The sessions holding ``status``'s messages, oldest first (archived messages are older than active ones)."""
        active, archived = self._keys(key)
        if status is None:
            return [archived, active]
        return [active] if MessageStatus(status) is MessageStatus.ACTIVE else [archived]

    async def _run(self, call: Coroutine[Any, Any, T]) -> T:
        view = self._chat.store
        return await view.arun(call)

    async def get_messages(
        self,
        key: str,
        status: MessageStatus | None = MessageStatus.ACTIVE,
        limit: int | None = None,
        offset: int | None = None,
    ) -> list[ChatMessage]:
        """The key's messages of ``status`` (``None``: archived, then active), oldest first.

        ``offset`` and ``limit`` work as in SQL (skip ``offset``, then at most ``limit``).
        """
        for name, value in (("limit", limit), ("offset", offset)):
            if value is not None and (type(value) is not int or value < 0):
                raise InvalidArgumentError(f"{name} must be a whole number of 0 or more, or None, not {value!r}")
        sessions, store = self._sessions(key, status), self._chat.store.store

        async def read() -> list[Message]:
            return [message for session in sessions for message in await store.load(session)]

        messages = await self._run(read())
        start = offset or 0
        return _decode_all(messages[start : None if limit is None else start + limit])

    async def count_messages(self, key: str, status: MessageStatus | None = MessageStatus.ACTIVE) -> int:
        """How many messages of ``status`` the key holds (``None``: all)."""
        sessions, store = self._sessions(key, status), self._chat.store.store

        async def count() -> int:
            return sum([await store.count(session) for session in sessions])

        return await self._run(count())

    async def add_message(self, key: str, message: ChatMessage, status: MessageStatus = MessageStatus.ACTIVE) -> None:
        """Add a message at the end of ``status``'s messages (atomically)."""
        await self.add_messages(key, [message], status)

    async def add_messages(
        self, key: str, messages: list[ChatMessage], status: MessageStatus = MessageStatus.ACTIVE
    ) -> None:
        """Add messages at the end of ``status``'s messages in one atomic append (all or none)."""
        (session,), stored = self._sessions(key, status), [_encode(message) for message in messages]
        if stored:
            await self._run(self._chat.store.store.append(session, stored))

    async def set_messages(
        self, key: str, messages: list[ChatMessage], status: MessageStatus = MessageStatus.ACTIVE
    ) -> None:
        """Replace all the key's messages (of both statuses) with ``messages``, kept as ``status``."""
        (session,), stored = self._sessions(key, status), [_encode(message) for message in messages]
        store = self._chat.store.store
        other = next(s for s in self._sessions(key, None) if s != session)

        async def replace() -> None:
            await _replace(store, session, stored)
            await store.delete(other)

        await self._run(_to_the_end(replace()))

    async def delete_message(self, key: str, idx: int) -> ChatMessage | None:
        """Remove the active message at position ``idx`` and return it (``None`` when there is none)."""
        return await self._chat.adelete_message(key, idx)

    async def delete_messages(self, key: str, status: MessageStatus | None = None) -> None:
        """Delete the key's messages of ``status`` (``None``: all of them)."""
        sessions, store = self._sessions(key, status), self._chat.store.store

        async def delete() -> None:
            for session in sessions:
                await store.delete(session)

        await self._run(delete())

    async def delete_oldest_messages(self, key: str, n: int) -> list[ChatMessage]:
        """Remove the ``n`` oldest active messages and return them."""
        active, _ = self._keys(key)
        return _decode_all(await self._run(_to_the_end(_take_oldest(self._chat.store.store, active, None, n))))

    async def archive_oldest_messages(self, key: str, n: int) -> list[ChatMessage]:
        """Move the ``n`` oldest active messages to the archived ones and return them."""
        active, archived = self._keys(key)
        return _decode_all(await self._run(_to_the_end(_take_oldest(self._chat.store.store, active, archived, n))))

    async def get_keys(self) -> list[str]:
        """The keys holding active or archived messages, the most recently changed active ones first."""
        store = self._chat.store.store

        async def keys() -> list[str]:
            found = await _keys(store, self.tenant)
            seen = set(found)
            return found + [k for k in await _keys(store, _archive_tenant(self.tenant)) if k not in seen]

        return await self._run(keys())

    def close(self) -> None:
        """Close the store as :meth:`ChatkeepChatStore.close` does."""
        self._chat.close()

    async def aclose(self) -> None:
        """:meth:`close` for async code."""
        await self._chat.aclose()

    def __repr__(self) -> str:
        return f"<ChatkeepDBChatStore tenant={self.tenant!r} on {self._chat.store.store!r}>"
