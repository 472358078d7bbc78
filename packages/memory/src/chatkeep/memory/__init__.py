"""chatkeep's process-local history store (``memory://``), the reference backend."""

from chatkeep.memory._config import MemoryURLError
from chatkeep.memory._store import MemoryHistoryProvider, MemoryHistoryStore, open_store

__all__ = ["MemoryHistoryProvider", "MemoryHistoryStore", "MemoryURLError", "open_store"]
