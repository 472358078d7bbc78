"""chatkeep's Azure Blob Storage history store (``azblob://CONTAINER[/PREFIX]``)."""

from chatkeep.blob._config import BlobURLError
from chatkeep.blob._store import BlobHistoryProvider, BlobHistoryStore, open_store

__all__ = ["BlobHistoryProvider", "BlobHistoryStore", "BlobURLError", "open_store"]
