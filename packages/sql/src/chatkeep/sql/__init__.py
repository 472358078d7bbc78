"""chatkeep's SQL history store: SQLite (embedded default), PostgreSQL and MySQL/MariaDB on SQLAlchemy 2."""

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
