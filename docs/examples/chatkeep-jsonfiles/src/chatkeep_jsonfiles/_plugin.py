"""Registers the ``jsonfiles`` backend (``jsonfiles://``) with chatkeep: the module the entry point names."""

from __future__ import annotations

from collections.abc import Callable

from chatkeep.core.backend import BackendSpec, hookimpl
from chatkeep_jsonfiles._store import open_store


@hookimpl
def chatkeep_register_backends(register: Callable[[BackendSpec], None]) -> None:
    """Register the JSON-files backend."""
    register(
        BackendSpec(
            name="jsonfiles",
            schemes=("jsonfiles",),
            open=open_store,
            description="JSON Lines files in a folder, shared by processes through file locks (an example plugin)",
        )
    )
