"""Registers the ``sql`` backend (``sqlite://``, ``postgresql://``, ``mysql://``, ``mariadb://``) with chatkeep."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chatkeep.core import HistoryStore
from chatkeep.core.backend import BackendSpec, hookimpl


def open_store(url: str, **options: Any) -> HistoryStore:
    """Open a SQL store (imports SQLAlchemy only when a SQL URL is opened)."""
    from chatkeep.sql._store import open_store as _open

    return _open(url, **options)


@hookimpl
def chatkeep_register_backends(register: Callable[[BackendSpec], None]) -> None:
    """Register the ``sql`` backend for SQLAlchemy's URL schemes."""
    register(
        BackendSpec(
            name="sql",
            schemes=("sqlite", "postgresql", "postgres", "mysql", "mariadb"),
            extra="sql",
            open=open_store,
            description="SQLite file (default sqlite://), PostgreSQL or MySQL/MariaDB through SQLAlchemy 2",
        )
    )
