"""An example chatkeep backend plugin: conversation history in JSON Lines files (``jsonfiles:///path/to/dir``)."""

from chatkeep_jsonfiles._config import JsonFilesURLError
from chatkeep_jsonfiles._store import JsonFilesHistoryProvider, JsonFilesHistoryStore, open_store

__all__ = ["JsonFilesHistoryProvider", "JsonFilesHistoryStore", "JsonFilesURLError", "open_store"]
