"""Registers the ``redis`` backend (``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``) with chatkeep."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chatkeep.core import HistoryStore
from chatkeep.core.backend import BackendSpec, hookimpl


def _open(url: str, **options: Any) -> HistoryStore:
    # Imported on use, so discovering plugins does not import redis-py.
    from chatkeep.redis._store import open_store

    return open_store(url, **options)


@hookimpl
def chatkeep_register_backends(register: Callable[[BackendSpec], None]) -> None:
    """Register the ``redis`` backend."""
    register(
        BackendSpec(
            name="redis",
            schemes=("redis", "rediss", "unix", "redis+cluster"),
            extra="redis",
            open=_open,
            description="Redis, Redis Cluster or Valkey (plain commands and Lua)",
        )
    )
