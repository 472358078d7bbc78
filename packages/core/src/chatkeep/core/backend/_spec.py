"""What a plugin registers: :class:`BackendSpec`, and the marker for its hook implementations."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pluggy

from chatkeep.core.backend._store import HistoryStore

__all__ = ["PROJECT", "BackendSpec", "hookimpl"]

PROJECT = "chatkeep"
#: Marks a plugin's implementation of a hook in :mod:`chatkeep.core.backend.hookspecs`.
hookimpl = pluggy.HookimplMarker(PROJECT)


@dataclass(frozen=True)
class BackendSpec:
    """What a plugin registers for one backend.

    Attributes:
        name: the backend's name (``"redis"``), also usable instead of a URL.
        schemes: URL schemes it handles (``("redis", "rediss", "unix", "redis+cluster")``).
        open: ``open(url, **options) -> HistoryStore``; synchronous, connects lazily on first use.
        extra: the ``chatkeep-core`` extra that installs it (``pip install "chatkeep-core[EXTRA]"``).
        description: one line for ``chatkeep backends``.
    """

    name: str
    schemes: tuple[str, ...]
    open: Callable[..., HistoryStore]
    extra: str | None = None
    description: str = ""
