"""chatkeep's SQL history store: SQLite (embedded default), PostgreSQL and MySQL/MariaDB on SQLAlchemy 2.

The names are imported on first use, so discovering the plugin (``chatkeep.sql._plugin``) does not import SQLAlchemy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chatkeep.sql._config import SQLURLError, default_sqlite_path
    from chatkeep.sql._schema import HEAD as SCHEMA_REVISION
    from chatkeep.sql._schema import SchemaVersionError
    from chatkeep.sql._store import SQLHistoryProvider, SQLHistoryStore, migrate, open_store

__all__ = [
    "SCHEMA_REVISION",
    "SQLHistoryProvider",
    "SQLHistoryStore",
    "SQLURLError",
    "SchemaVersionError",
    "default_sqlite_path",
    "migrate",
    "open_store",
]

# name -> (module, attribute); every other name is the same attribute of _store.
_MODULES = {
    "SCHEMA_REVISION": ("_schema", "HEAD"),
    "SchemaVersionError": ("_schema", "SchemaVersionError"),
    "SQLURLError": ("_config", "SQLURLError"),
    "default_sqlite_path": ("_config", "default_sqlite_path"),
}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _MODULES.get(name, ("_store", name))
    return getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
