"""Registers the ``blob`` backend (``azblob://``) with chatkeep."""

from __future__ import annotations

from collections.abc import Callable

from chatkeep.core.backend import BackendSpec, hookimpl


@hookimpl
def chatkeep_register_backends(register: Callable[[BackendSpec], None]) -> None:
    """Register the ``blob`` backend (its module is imported only when a store is opened)."""
    register(
        BackendSpec(
            name="blob",
            schemes=("azblob",),
            open="chatkeep.blob._store:open_store",
            default_url="azblob://chatkeep",
            extra="blob",
            description="Azure Blob Storage (append blobs, ranged reads, ETag-guarded metadata)",
        )
    )
