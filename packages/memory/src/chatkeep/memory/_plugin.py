"""Registers the ``memory`` backend (``memory://``) with chatkeep."""

from __future__ import annotations

from collections.abc import Callable

from chatkeep.core.backend import BackendSpec, hookimpl
from chatkeep.memory._store import open_store


@hookimpl
def chatkeep_register_backends(register: Callable[[BackendSpec], None]) -> None:
    """Register the process-local ``memory`` backend."""
    register(
        BackendSpec(
            name="memory",
            schemes=("memory",),
            extra="memory",
            open=open_store,
            description="process memory: stores opened on one memory://NAME share their data",
        )
    )
