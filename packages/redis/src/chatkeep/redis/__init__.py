"""chatkeep's Redis history store: standalone Redis, Redis Cluster and Valkey (``redis://``, ``redis+cluster://``)."""

from chatkeep.redis._config import RedisURLError
from chatkeep.redis._store import RedisHistoryProvider, RedisHistoryStore, open_store

__all__ = ["RedisHistoryProvider", "RedisHistoryStore", "RedisURLError", "open_store"]
