"""chatkeep's process-local history store (``memory://``), the reference backend."""

from chatkeep.memory._config import MemoryURLError
from chatkeep.memory._store import MemoryHistoryStore, open_store

__all__ = ["MemoryHistoryStore", "MemoryURLError", "open_store"]
