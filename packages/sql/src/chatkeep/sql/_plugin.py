"""Registers the ``sql`` backend (``sqlite://``, ``postgresql://``, ``mysql://``, ``mariadb://``) with chatkeep."""

from __future__ import annotations

from collections.abc import Callable

from chatkeep.core.backend import BackendSpec, hookimpl


@hookimpl
def chatkeep_register_backends(register: Callable[[BackendSpec], None]) -> None:
    """Register the ``sql`` backend (its module is imported only when a store is opened)."""
    register(
        BackendSpec(
            name="sql",
            schemes=("sqlite", "postgresql", "postgres", "mysql", "mariadb"),
            open="chatkeep.sql._store:open_store",
            default_url="sqlite://",
            extra="sql",
            description="SQLite file (default sqlite://), PostgreSQL or MySQL/MariaDB through SQLAlchemy 2",
        )
    )
