"""``RedisHistoryProvider``: a history provider on a Redis store, in one line."""

from __future__ import annotations

from typing import Any

from chatkeep.core import StoreHistoryProvider
from chatkeep.redis._store import RedisHistoryStore, open_store

__all__ = ["RedisHistoryProvider"]


class RedisHistoryProvider(StoreHistoryProvider):
    """A :class:`~chatkeep.core.StoreHistoryProvider` on Redis.

    Example:
        ``RedisHistoryProvider("redis://localhost:6379/0?ttl=86400&max_messages=1000", max_messages=20)``
        keeps each session a day after its last write, at most 1,000 messages per session, and sends the
        model the 20 newest.

    Args:
        store: a Redis URL (the provider opens the store and closes it with itself) or a
            :class:`RedisHistoryStore` (the caller closes it).
        source_id: names this provider.
        max_messages: how many of the newest messages to load per run (the store's own ``max_messages``,
            in the URL, caps what is kept).
        **options: the other :class:`~chatkeep.core.HistoryProvider` options (``reducer``, ``store_inputs``...).
    """

    def __init__(
        self,
        store: str | RedisHistoryStore = "redis://localhost:6379/0",
        *,
        source_id: str = "history",
        max_messages: int | None = 100,
        **options: Any,
    ) -> None:
        owns = isinstance(store, str)
        backend = open_store(store) if isinstance(store, str) else store
        super().__init__(backend, source_id=source_id, max_messages=max_messages, owns_store=owns, **options)
