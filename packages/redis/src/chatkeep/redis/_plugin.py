"""Registers the ``redis`` backend (``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``) with chatkeep."""

from __future__ import annotations

from collections.abc import Callable

from chatkeep.core.backend import BackendSpec, hookimpl


@hookimpl
def chatkeep_register_backends(register: Callable[[BackendSpec], None]) -> None:
    """Register the ``redis`` backend (its module is imported only when a store is opened)."""
    register(
        BackendSpec(
            name="redis",
            schemes=("redis", "rediss", "unix", "redis+cluster"),
            open="chatkeep.redis._store:open_store",
            default_url="redis://localhost:6379/0",
            extra="redis",
            description="Redis, Redis Cluster or Valkey (plain commands and Lua)",
        )
    )
