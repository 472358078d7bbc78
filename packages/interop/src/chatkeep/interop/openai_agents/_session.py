"""``ChatkeepSession``: the OpenAI Agents SDK's ``Session`` protocol on any chatkeep store."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from agents.memory import SessionSettings
from agents.memory.session_settings import coerce_session_settings, resolve_session_limit

from chatkeep.core import DEFAULT_TENANT, HistoryStore, InvalidArgumentError, SessionKey
from chatkeep.interop._binding import StoreBinding
from chatkeep.interop.openai_agents._items import item_of, message_of, sendable_window

if TYPE_CHECKING:
    from agents import TResponseInputItem

__all__ = ["ChatkeepSession"]


class ChatkeepSession:
    """An Agents SDK session whose history lives in a chatkeep store.

    A drop-in for ``SQLiteSession``, ``SQLAlchemySession`` or ``RedisSession``: pass it to
    ``Runner.run(agent, input, session=...)``. Each item the SDK adds is kept exactly (reasoning items with
    their encrypted content, fields the SDK does not know yet), one chatkeep message per item, so chatkeep's
    tools (``chatkeep sessions show``, export, copy between backends, prune) see the conversation too.

    Example:
        ```python
        session = ChatkeepSession("user-1", store="redis://localhost:6379/0")
        result = await Runner.run(agent, "Hello", session=session)
        ```

    Args:
        session_id: the conversation's id (any non-empty string up to 1,024 characters, compared exactly).
        store: a :class:`~chatkeep.core.HistoryStore` (you keep owning it), or a store URL or backend name that
            the session opens and closes in :meth:`close`.
        tenant: the tenant the conversation belongs to; another tenant's session of the same id is another
            conversation.
        session_settings: the SDK's settings; their ``limit`` is the default of :meth:`get_items`.
        store_options: options for a store opened from a URL (as keywords, what its query string takes).

    Raises:
        InvalidSessionKeyError: an empty or too long ``session_id`` or ``tenant``.
        UnknownBackendError: no installed backend handles the URL; the message names the extra to install.
        StoreConfigurationError: ``store_options`` with a store object, or a ``store`` of the wrong type.
    """

    def __init__(
        self,
        session_id: str,
        *,
        store: HistoryStore | str,
        tenant: str = DEFAULT_TENANT,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        store_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._key: SessionKey = StoreBinding.key(session_id, tenant)
        self._binding = StoreBinding(store, store_options=store_options)
        self.session_id = session_id
        self.tenant = tenant
        self.session_settings: SessionSettings | None = (
            coerce_session_settings(session_settings) if session_settings is not None else SessionSettings()
        )

    @property
    def store(self) -> HistoryStore:
        """The store the history lives in."""
        return self._binding.store

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The history, oldest first: all of it, or the newest ``limit`` items (default: the settings' limit).

        A window that cuts the history never starts with an item whose partner fell outside it: it starts
        past tool outputs whose call is older than the window, and past the item an older reasoning item was
        emitted with (the Responses API refuses either). So it may hold fewer than ``limit`` items.

        Raises:
            InvalidArgumentError: a negative ``limit``.
        """
        limit = resolve_session_limit(limit, self.session_settings)
        if limit is None:
            return [_typed(item_of(m)) for m in await self.store.load(self._key)]
        if limit < 0:
            raise InvalidArgumentError(
                f"limit must be 0 or more (0: no history), or None for the whole history; got {limit}"
            )
        if limit == 0:
            return []
        # One item more than asked: the item before the window tells whether the window starts mid-response.
        loaded = [item_of(m) for m in await self.store.load(self._key, last=limit + 1)]
        if len(loaded) <= limit:
            return [_typed(item) for item in loaded]
        return [_typed(item) for item in sendable_window(loaded[1:], before=loaded[0])]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append items to the history, in order, in one atomic write (all of them or none)."""
        # An empty list makes no round trip, but a closed store still says so, as the SDK's sessions do.
        await self.store.append(self._key, [message_of(item) for item in items])

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the newest item and return it (``None`` when the session is empty).

        Atomic on every backend: two concurrent pops never return the same item.

        Raises:
            MessageFormatError: the newest message was not written through this adapter (it is removed all
                the same; the message names it).
        """
        message = await self.store.pop(self._key)
        return None if message is None else _typed(item_of(message))

    async def clear_session(self) -> None:
        """Delete the whole history of this session."""
        await self.store.delete(self._key)

    async def close(self) -> None:
        """Close the store if the session opened it from a URL (a store object you passed stays open)."""
        await self._binding.aclose()

    def __repr__(self) -> str:
        return f"ChatkeepSession({self.session_id!r}, tenant={self.tenant!r}, store={type(self.store).__name__})"


def _typed(item: dict[str, Any]) -> TResponseInputItem:
    # The item is what the SDK added; its type is the SDK's union, which a plain dict cannot be narrowed to.
    return cast("TResponseInputItem", item)
