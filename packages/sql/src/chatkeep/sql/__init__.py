"""chatkeep's SQL history store: SQLite (embedded default), PostgreSQL and MySQL/MariaDB on SQLAlchemy 2.

The names are imported on first use, so discovering the plugin (``chatkeep.sql._plugin``) does not import SQLAlchemy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chatkeep.core.backend import lazy_exports

if TYPE_CHECKING:
    from chatkeep.sql._config import SQLURLError, default_sqlite_path
    from chatkeep.sql._schema import HEAD as SCHEMA_REVISION
    from chatkeep.sql._schema import SchemaVersionError
    from chatkeep.sql._sqlite_search import SearchIndexLayoutError
    from chatkeep.sql._store import SQLHistoryProvider, SQLHistoryStore, migrate, open_store

__all__ = [
    "SCHEMA_REVISION",
    "SQLHistoryProvider",
    "SQLHistoryStore",
    "SQLURLError",
    "SchemaVersionError",
    "SearchIndexLayoutError",
    "default_sqlite_path",
    "migrate",
    "open_store",
]

# name -> (module, attribute); every other name is the same attribute of _store.
__getattr__ = lazy_exports(
    __name__,
    {
        "SCHEMA_REVISION": "_schema:HEAD",
        "SchemaVersionError": "_schema",
        "SearchIndexLayoutError": "_sqlite_search",
        "SQLURLError": "_config",
        "default_sqlite_path": "_config",
        "SQLHistoryProvider": "_store",
        "SQLHistoryStore": "_store",
        "migrate": "_store",
        "open_store": "_store",
    },
)
