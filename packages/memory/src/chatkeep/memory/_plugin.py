"""Registers the ``memory`` backend (``memory://``) with chatkeep."""

from __future__ import annotations

from collections.abc import Callable

from chatkeep.core.backend import BackendSpec, hookimpl


@hookimpl
def chatkeep_register_backends(register: Callable[[BackendSpec], None]) -> None:
    """Register the ``memory`` backend (its module is imported only when a store is opened)."""
    register(
        BackendSpec(
            name="memory",
            schemes=("memory",),
            open="chatkeep.memory._store:open_store",
            default_url="memory://",
            extra="memory",
            description="process memory: stores opened on one memory://NAME share their data",
        )
    )
