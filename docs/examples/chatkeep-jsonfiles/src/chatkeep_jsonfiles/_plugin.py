"""Registers the ``jsonfiles`` backend (``jsonfiles://``) with chatkeep: the module the entry point names."""

from __future__ import annotations

from collections.abc import Callable

from chatkeep.core.backend import BackendSpec, hookimpl


@hookimpl
def chatkeep_register_backends(register: Callable[[BackendSpec], None]) -> None:
    """Register the ``jsonfiles`` backend (its module is imported only when a store is opened)."""
    register(
        BackendSpec(
            name="jsonfiles",
            schemes=("jsonfiles",),
            open="chatkeep_jsonfiles._store:open_store",
            default_url="jsonfiles://chatkeep-history",
            description="JSON Lines files in a folder, shared by processes through file locks (an example plugin)",
        )
    )
