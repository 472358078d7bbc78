"""The schema's names and versions, how keys are hashed, and checking or migrating a database's schema.

The tables (see ``migrations/versions`` for their exact DDL)::

    chatkeep_sessions   id (never reused), key_hash (unique), tenant_hash, tenant, session_id,
                        created_at, updated_at (microseconds since the epoch, UTC), next_seq, message_count,
                        document, doc_version, owner, token_usage, title, tags, metadata (JSON; 0003)
    chatkeep_messages   session_ref -> chatkeep_sessions.id (ON DELETE CASCADE), seq, message_hash, record,
                        token_usage (0003); primary key (session_ref, seq); unique (session_ref, message_hash)
    chatkeep_tags       session_ref -> chatkeep_sessions.id (ON DELETE CASCADE), tag_hash (0003)
                        primary key (session_ref, tag_hash); index (tag_hash, session_ref)

Schema versions are Alembic revisions kept in ``chatkeep_alembic_version`` (so an application's own
Alembic history in the same database is left alone).
"""

from __future__ import annotations

import functools
import hashlib
from contextlib import contextmanager
from typing import TYPE_CHECKING

from chatkeep.core import StoreConfigurationError
from chatkeep.core.backend import length_prefixed

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sqlalchemy.engine import Connection

__all__ = [
    "HEAD",
    "MESSAGES",
    "REVISIONS",
    "SESSIONS",
    "TAGS",
    "VERSION_TABLE",
    "SchemaVersionError",
    "current_revision",
    "ensure_schema",
    "key_hash",
    "message_hash",
    "tag_hash",
    "tenant_hash",
]

SESSIONS = "chatkeep_sessions"
MESSAGES = "chatkeep_messages"
TAGS = "chatkeep_tags"
VERSION_TABLE = "chatkeep_alembic_version"
#: The schema revisions this release knows, oldest first (a test checks them against the migrations).
REVISIONS = ("0001", "0002", "0003")
HEAD = REVISIONS[-1]
# The lock id that serializes schema changes (PostgreSQL advisory lock; MySQL GET_LOCK name prefix).
_LOCK_ID = 0x63686B70  # "chkp"


class SchemaVersionError(StoreConfigurationError):
    """The database's chatkeep schema is not the one this release uses (newer, or older and not migrated)."""


@functools.lru_cache(maxsize=4096)  # every call of a turn hashes its key: a busy process asks for few keys often
def key_hash(tenant: str, session_id: str) -> bytes:
    """The 32-byte key of a session: SHA-256 of the length-prefixed tenant, then the session id (UTF-8).

    The length prefix keeps ``("a", "bc")`` and ``("ab", "c")`` apart; hashing keeps keys short for MySQL's
    index limits and free of any collation, so ids are compared exactly.
    """
    return hashlib.sha256(length_prefixed(tenant) + session_id.encode()).digest()


@functools.lru_cache(maxsize=1024)
def tenant_hash(tenant: str) -> bytes:
    """The 32-byte key of a tenant (SHA-256 of its UTF-8 bytes)."""
    return hashlib.sha256(tenant.encode()).digest()


def tag_hash(tenant: str, tag: str) -> bytes:
    """The 32-byte key of a tag within its tenant (SHA-256 of the length-prefixed tenant, then the tag)."""
    return hashlib.sha256(b"tag:" + length_prefixed(tenant) + tag.encode()).digest()


def message_hash(message_id: str) -> bytes:
    """The 16-byte key of a message id within its session (the first half of its SHA-256)."""
    return hashlib.sha256(message_id.encode("utf-8", "surrogatepass")).digest()[:16]


def current_revision(conn: Connection) -> str | None:
    """The schema revision stored in the database, or ``None`` when chatkeep's tables are not there."""
    from sqlalchemy import inspect, text

    inspector = inspect(conn)
    if not inspector.has_table(VERSION_TABLE):
        if not inspector.has_table(SESSIONS):
            return None
        # Another process may have made the schema between the two looks: it commits the version table with the
        # tables (PostgreSQL, SQLite) or before them (MySQL), so a version table still missing now is missing.
        inspector.clear_cache()  # the inspector remembers its first answer
        if not inspector.has_table(VERSION_TABLE):
            raise SchemaVersionError(
                f"the database has a {SESSIONS} table but no {VERSION_TABLE} table, so its schema version is "
                "unknown; it was not made by chatkeep's migrations. Use another database or schema for chatkeep"
            )
    rows = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
    return rows[0][0] if rows else None


def _check(revision: str) -> None:
    if revision not in REVISIONS:
        raise SchemaVersionError(
            f"the database's chatkeep schema is at revision {revision!r}, newer than this chatkeep-sql knows "
            f"(up to {HEAD!r}); a newer release migrated it. Upgrade chatkeep-sql (pip install -U chatkeep-sql) "
            "on every machine that uses this database"
        )


@contextmanager
def _schema_lock(conn: Connection) -> Iterator[None]:
    """Serialize schema changes between processes: two first uses of an empty database must not both create it."""
    from sqlalchemy import text

    name = conn.dialect.name
    if name == "postgresql":
        # Held until the transaction ends; PostgreSQL's DDL is transactional, so the migration commits with it.
        conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _LOCK_ID})
        yield
    elif name in ("mysql", "mariadb"):
        # DDL commits implicitly on MySQL: a named lock (per database) held for the connection's session instead.
        lock = f"chatkeep-schema-{_LOCK_ID}-" + (conn.exec_driver_sql("SELECT DATABASE()").scalar() or "")
        got = conn.execute(text("SELECT GET_LOCK(:name, 60)"), {"name": lock[:64]}).scalar()
        if got != 1:
            raise SchemaVersionError("another process held chatkeep's schema lock for 60 s; try again")
        try:
            yield
        finally:
            conn.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": lock[:64]})
    else:
        # SQLite: the write lock of the file, taken up front; SQLite's DDL is transactional too.
        conn.exec_driver_sql("BEGIN IMMEDIATE")
        yield


def _alembic_upgrade(conn: Connection, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", "chatkeep.sql:migrations")
    config.attributes["connection"] = conn
    if conn.dialect.name in ("mysql", "mariadb"):
        # Alembic names the version table's primary key, which MySQL/MariaDB ignore with a warning that the
        # driver logs on a person's console: make the same table first, with an unnamed key (Alembic keeps it).
        conn.exec_driver_sql(
            f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version_num VARCHAR(32) NOT NULL, PRIMARY KEY (version_num))"
        )
    command.upgrade(config, revision)


def _refuse_sqlite_vec_index(conn: Connection) -> None:
    """A SQLite file with a sqlite-vec search index needs sqlite-vec to change its messages (a trigger reaches it)."""
    from sqlalchemy import text

    if conn.execute(text("SELECT 1 FROM sqlite_master WHERE name = 'chatkeep_search_vec'")).all():
        raise StoreConfigurationError(
            "this SQLite file holds a semantic-recall index made with sqlite-vec, which this connection cannot load, "
            'and deleting or trimming its messages needs it; install the recall extra (pip install "chatkeep-sql'
            '[recall]") and open the file with ?transport=apsw'
        )


def ensure_schema(conn: Connection, *, upgrade: bool = False, loads_sqlite_vec: bool = False) -> str:
    """Check the database's schema (creating it in an empty database) and return its revision.

    Args:
        conn: a connection outside any transaction; committed on return.
        upgrade: migrate an older schema to the newest revision (what ``chatkeep migrate`` does); without
            it an older schema raises.
        loads_sqlite_vec: the connections of the store load sqlite-vec (SQLite's ``apsw`` transport); without
            it, a SQLite file holding a sqlite-vec search index is refused.

    Raises:
        SchemaVersionError: the schema is newer than this release, or older and ``upgrade`` is false.
        StoreConfigurationError: a SQLite file with a sqlite-vec index, on a connection without sqlite-vec.
    """
    if conn.dialect.name == "sqlite" and not loads_sqlite_vec:
        _refuse_sqlite_vec_index(conn)
        conn.rollback()
    revision = current_revision(conn)
    conn.rollback()
    if revision is not None:
        _check(revision)
        if revision == HEAD or not upgrade:
            if revision != HEAD:
                raise SchemaVersionError(
                    f"the database's chatkeep schema is at revision {revision!r} and this chatkeep-sql uses "
                    f"{HEAD!r}; migrate it with: chatkeep migrate --store URL (back up the database first)"
                )
            return revision
    with _schema_lock(conn):
        revision = current_revision(conn)  # another process may have done it while we waited for the lock
        if revision is not None:
            _check(revision)
        if revision != HEAD:
            _alembic_upgrade(conn, "head")
        conn.commit()
    return HEAD
