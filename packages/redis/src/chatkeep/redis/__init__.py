"""chatkeep's Redis history store: standalone Redis, Redis Cluster and Valkey (``redis://``, ``redis+cluster://``).

The names are imported on first use, so discovering the plugin (``chatkeep.redis._plugin``) does not import redis-py.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chatkeep.redis._config import RedisURLError
    from chatkeep.redis._store import RedisHistoryProvider, RedisHistoryStore, open_store

__all__ = ["RedisHistoryProvider", "RedisHistoryStore", "RedisURLError", "open_store"]

_MODULES = {"RedisURLError": "_config", "RedisHistoryProvider": "_store", "RedisHistoryStore": "_store"}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULES.get(name, '_store')}"), name)
