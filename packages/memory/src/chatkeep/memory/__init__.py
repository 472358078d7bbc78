"""chatkeep's process-local history store (``memory://``), the reference backend.

The names are imported on first use, as every plugin package does, so discovering the plugin imports no store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chatkeep.core.backend import lazy_exports

if TYPE_CHECKING:
    from chatkeep.memory._config import MemoryURLError
    from chatkeep.memory._store import MemoryHistoryProvider, MemoryHistoryStore, open_store

__all__ = ["MemoryHistoryProvider", "MemoryHistoryStore", "MemoryURLError", "open_store"]

__getattr__ = lazy_exports(
    __name__,
    {
        "MemoryURLError": "_config",
        "MemoryHistoryProvider": "_store",
        "MemoryHistoryStore": "_store",
        "open_store": "_store",
    },
)
