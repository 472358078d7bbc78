"""chatkeep's Azure Blob Storage history store (``azblob://CONTAINER[/PREFIX]``).

The names are imported on first use, so discovering the plugin (``chatkeep.blob._plugin``) does not import the
Azure SDK (about a second).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chatkeep.core.backend import lazy_exports

if TYPE_CHECKING:
    from chatkeep.blob._config import BlobURLError
    from chatkeep.blob._store import BlobHistoryProvider, BlobHistoryStore, open_store

__all__ = ["BlobHistoryProvider", "BlobHistoryStore", "BlobURLError", "open_store"]

__getattr__ = lazy_exports(
    __name__,
    {"BlobURLError": "_config", "BlobHistoryProvider": "_store", "BlobHistoryStore": "_store", "open_store": "_store"},
)
