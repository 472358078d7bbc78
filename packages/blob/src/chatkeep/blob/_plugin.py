"""Registers the ``blob`` backend (``azblob://``) with chatkeep."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chatkeep.core import HistoryStore
from chatkeep.core.backend import BackendSpec, hookimpl


def _open(url: str, **options: Any) -> HistoryStore:
    # Imported on use, so discovering plugins does not import the Azure SDK.
    from chatkeep.blob._store import open_store

    if url.lower() == "blob":  # the backend's name, as open_store("blob") passes it
        url = "azblob://chatkeep"
    return open_store(url, **options)


@hookimpl
def chatkeep_register_backends(register: Callable[[BackendSpec], None]) -> None:
    """Register the ``blob`` backend."""
    register(
        BackendSpec(
            name="blob",
            schemes=("azblob",),
            extra="blob",
            open=_open,
            description="Azure Blob Storage (append blobs, ranged reads, ETag-guarded metadata)",
        )
    )
