"""The backends chatkeep ships, known even when not installed, so asking for one gives the command that installs it.

Only backends that exist belong here. tests/test_known_backends.py checks these tables both ways against
what the workspace's distributions register through real entry-point discovery, and each extra against
chatkeep-core's metadata; a backend that gains a scheme, or loses one, fails that test until this module
follows.
"""

from __future__ import annotations

__all__ = ["KNOWN_BACKENDS", "KNOWN_SCHEMES"]

# URL scheme -> (backend, the chatkeep-core extra that installs what this scheme needs, what it is).
KNOWN_SCHEMES: dict[str, tuple[str, str, str]] = {
    "memory": ("memory", "memory", "process memory"),
    "sqlite": ("sql", "sqlite", "SQLite"),
    "postgresql": ("sql", "postgresql", "PostgreSQL"),
    "postgres": ("sql", "postgresql", "PostgreSQL"),
    "mysql": ("sql", "mysql", "MySQL"),
    "mariadb": ("sql", "mariadb", "MariaDB"),
    "redis": ("redis", "redis", "Redis"),
    "rediss": ("redis", "redis", "Redis over TLS"),
    "unix": ("redis", "redis", "Redis on a unix socket"),
    "redis+cluster": ("redis", "redis", "Redis Cluster"),
    "azblob": ("blob", "blob", "Azure Blob Storage"),
}

# Backend name -> (the chatkeep-core extra that installs all of it, what it is), for a backend asked for by name.
KNOWN_BACKENDS: dict[str, tuple[str, str]] = {
    "memory": ("memory", "process memory"),
    "sql": ("sql", "SQL databases"),
    "redis": ("redis", "Redis"),
    "blob": ("blob", "Azure Blob Storage"),
}
