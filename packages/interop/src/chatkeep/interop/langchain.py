"""LangChain's chat message history on any chatkeep store: ``ChatkeepChatMessageHistory``.

Install with ``pip install "chatkeep-core[langchain]"`` plus the backend's extra. It is a
``langchain_core.chat_history.BaseChatMessageHistory``, so it goes wherever LangChain takes one, such as the
``get_session_history`` factory of ``RunnableWithMessageHistory``:

```python
from chatkeep.core import open_store
from chatkeep.interop.langchain import ChatkeepChatMessageHistory

store = open_store("redis://localhost:6379/0").sync()  # one store for every conversation


def get_session_history(session_id: str) -> ChatkeepChatMessageHistory:
    return ChatkeepChatMessageHistory(session_id, store, max_messages=50)
```

Each LangChain message is kept in LangChain's own JSON form (``message_to_dict``) and read back with
``messages_from_dict``, field for field: content strings and content-block lists, tool calls, invalid tool calls,
a ``ToolMessage``'s ``tool_call_id``, ``artifact`` and ``status``, ``additional_kwargs``, ``response_metadata``,
``usage_metadata``, ``id``, ``name`` and fields LangChain adds later.

Sync and async methods share one store through its sync view: every call runs on the view's private event-loop
thread. Blocking methods wait for it (so they work inside a running event loop, which meanwhile waits); async
methods await it, and the caller's loop runs other tasks meanwhile.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
    messages_from_dict,
)

from chatkeep.core import DEFAULT_TENANT, InvalidArgumentError, Message, MessageFormatError, Role, SyncHistoryStore
from chatkeep.interop._binding import BoundAdapter, SyncStoreBinding
from chatkeep.interop._envelope import unwrap, wrap

__all__ = ["FORMAT", "ChatkeepChatMessageHistory"]

#: The envelope format name of the messages this adapter writes.
FORMAT = "langchain"

# LangChain's message type (chunks named "AIMessageChunk" and so on) -> chatkeep's readable role.
_ROLES: dict[str, Role] = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "function": "tool"}
# A ChatMessage's free-form role -> chatkeep's role, when it names one.
_CHAT_ROLES: dict[str, Role] = {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


class ChatkeepChatMessageHistory(BoundAdapter, BaseChatMessageHistory):
    """A LangChain chat message history kept in a chatkeep store, for sync and async LangChain code alike.

    Args:
        session_id: the conversation's id (any non-empty unicode id up to 1,024 characters).
        store: a store's sync view, ``open_store(url).sync()``, which the caller keeps owning (share one between
            every history made by a ``get_session_history`` factory, and close it when done), or a store URL or
            backend name (``"sqlite:///chat.db"``, ``"memory"``): then this history opens the store and
            :meth:`close` closes it.
        tenant: the tenant the conversation belongs to (from your authentication, never from the client).
        store_options: options for a store opened from a URL, as keywords (``{"ttl": 3600}``).
        max_messages: read only the newest ``max_messages`` (``messages`` then reads just those from the store,
            however long the history is); ``None`` reads the whole history. Nothing is ever dropped silently: the
            store keeps every message, and a window never starts with a ``ToolMessage`` whose tool call fell
            outside it (the model API refuses such a history).

    Raises:
        InvalidSessionKeyError: an empty or over-long ``session_id`` or ``tenant``.
        InvalidArgumentError: ``max_messages`` below 1.
        StoreConfigurationError: an async ``HistoryStore`` (pass ``store.sync()``) or ``store`` of another type.
        UnknownBackendError: no installed backend handles the URL; the message names the extra to install.
    """

    def __init__(
        self,
        session_id: str,
        store: SyncHistoryStore | str,
        *,
        tenant: str = DEFAULT_TENANT,
        store_options: Mapping[str, Any] | None = None,
        max_messages: int | None = None,
    ) -> None:
        key = SyncStoreBinding.key(session_id, tenant)
        if max_messages is not None and (type(max_messages) is not int or max_messages < 1):
            raise InvalidArgumentError(
                f"max_messages must be a whole number of at least 1 (the newest messages to read), or None for the "
                f"whole history, not {max_messages!r}"
            )
        super().__init__()
        self._binding = SyncStoreBinding(store, store_options=store_options)
        self._key = key
        self.session_id = session_id
        self.tenant = tenant
        self.max_messages = max_messages

    def __repr__(self) -> str:
        return (
            f"<ChatkeepChatMessageHistory {self.tenant}/{self.session_id} max_messages={self.max_messages} "
            f"on {self._binding.view!r}>"
        )

    # -- reading ------------------------------------------------------------------------------------------

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]  # the base declares a plain attribute
        """The conversation in order: the newest ``max_messages``, or all of it (reads the store each time)."""
        return self._read(self._binding.view.load(self._key, last=self.max_messages))

    async def aget_messages(self) -> list[BaseMessage]:
        """:attr:`messages` for async code (the event loop runs other tasks while the store reads)."""
        view = self._binding.view
        return self._read(await view.arun(view.store.load(self._key, last=self.max_messages)))

    def _read(self, stored: list[Message]) -> list[BaseMessage]:
        messages = _to_langchain(stored)
        if self.max_messages is not None and len(stored) == self.max_messages:
            # The window may have cut a tool call from its results: drop results it begins with.
            start = 0
            while start < len(messages) and isinstance(messages[start], ToolMessage):
                start += 1
            return messages[start:]
        return messages

    # -- writing ------------------------------------------------------------------------------------------

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append messages in one atomic store call (all or none), after the ones already kept.

        Raises:
            MessageFormatError: an item is not a LangChain message, or holds a value that is not JSON.
            MessageTooLargeError: a message is over the store's ``max_message_bytes`` (nothing is stored).
        """
        self._binding.view.append(self._key, _to_chatkeep(messages))

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """:meth:`add_messages` for async code; concurrent calls each stay whole and in one order."""
        view = self._binding.view
        await view.arun(view.store.append(self._key, _to_chatkeep(messages)))

    def clear(self) -> None:
        """Delete the whole conversation from the store."""
        self._binding.view.delete(self._key)

    async def aclear(self) -> None:
        """:meth:`clear` for async code."""
        view = self._binding.view
        await view.arun(view.store.delete(self._key))


def _to_chatkeep(messages: Sequence[BaseMessage]) -> list[Message]:
    """Each LangChain message in its ``message_to_dict`` form, with a readable role and text beside it."""
    if isinstance(messages, BaseMessage):
        messages = [messages]  # a lone message is a common slip; LangChain's own stores take it too
    stored: list[Message] = []
    for n, message in enumerate(messages):
        if not isinstance(message, BaseMessage):
            raise MessageFormatError(
                f"item {n} is a {type(message).__name__}, not a LangChain message: pass BaseMessage objects "
                "(HumanMessage, AIMessage, ToolMessage...), e.g. HumanMessage(content='hi')"
            )
        stored.append(wrap(message_to_dict(message), format=FORMAT, role=_role(message), text=_text(message)))
    return stored


def _to_langchain(stored: Sequence[Message]) -> list[BaseMessage]:
    items: list[BaseMessage] = []
    for message in stored:
        item = unwrap(message, format=FORMAT)
        items.extend(_from_plain(message) if item is None else messages_from_dict([item]))
    return items


def _role(message: BaseMessage) -> Role:
    kind = message.type.removesuffix("MessageChunk").lower()
    if kind == "chat":
        return _CHAT_ROLES.get(str(getattr(message, "role", "")), "user")
    return _ROLES.get(kind, "user")


def _text(message: BaseMessage) -> str:
    """The message's plain text (its string content, or its text blocks joined), for chatkeep's own readers."""
    content = message.content
    if isinstance(content, str):
        return content
    parts = [
        block if isinstance(block, str) else str(block.get("text", ""))
        for block in content
        if isinstance(block, str) or block.get("type") == "text"
    ]
    return "".join(parts)


def _from_plain(message: Message) -> list[BaseMessage]:
    """A message chatkeep itself wrote (an agent's history), as the LangChain messages closest to it."""
    if message.role == "system":
        return [SystemMessage(content=message.text, id=message.message_id)]
    if message.role == "user":
        return [HumanMessage(content=message.text, id=message.message_id)]
    if message.role == "assistant":
        calls = [{"name": c.name, "args": c.parse_arguments(), "id": c.call_id} for c in message.function_calls]
        return [AIMessage(content=message.text, tool_calls=calls, id=message.message_id)]
    return [
        ToolMessage(
            content=r.result if isinstance(r.result, str) else json.dumps(r.result),
            tool_call_id=r.call_id,
            status="error" if r.is_error else "success",
        )
        for r in message.function_results
    ]
