"""chatkeep's Redis history store: standalone Redis, Redis Cluster and Valkey (``redis://``, ``redis+cluster://``).

The names are imported on first use, so discovering the plugin (``chatkeep.redis._plugin``) does not import redis-py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chatkeep.core.backend import lazy_exports

if TYPE_CHECKING:
    from chatkeep.redis._config import RedisURLError
    from chatkeep.redis._store import RedisHistoryProvider, RedisHistoryStore, open_store

__all__ = ["RedisHistoryProvider", "RedisHistoryStore", "RedisURLError", "open_store"]

__getattr__ = lazy_exports(
    __name__,
    {
        "RedisURLError": "_config",
        "RedisHistoryProvider": "_store",
        "RedisHistoryStore": "_store",
        "open_store": "_store",
    },
)
