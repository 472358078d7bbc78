"""What a plugin registers: :class:`BackendSpec`, and the marker for its hook implementations."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pluggy

from chatkeep.core._errors import InvalidArgumentError
from chatkeep.core.backend._store import HistoryStore

__all__ = ["PROJECT", "BackendSpec", "hookimpl"]

PROJECT = "chatkeep"
#: Marks a plugin's implementation of a hook in :mod:`chatkeep.core.backend.hookspecs`.
hookimpl = pluggy.HookimplMarker(PROJECT)

Opener = Callable[..., HistoryStore]


@dataclass(frozen=True)
class BackendSpec:
    """What a plugin registers for one backend.

    Attributes:
        name: the backend's name (``"redis"``), also usable instead of a URL: it opens ``default_url``.
        schemes: URL schemes it handles (``("redis", "rediss", "unix", "redis+cluster")``); each is also usable
            bare (``"sqlite"`` opens ``sqlite://``).
        open: ``open(url, **options) -> HistoryStore`` (synchronous, connecting lazily on first use), or where to
            find it as ``"module:attr"``, imported only when a store is opened, so that discovering plugins
            imports no driver.
        default_url: what the bare ``name`` opens (default: the first scheme with nothing after ``://``).
        extra: the ``chatkeep-core`` extra that installs it (``pip install "chatkeep-core[EXTRA]"``).
        description: one line for ``chatkeep backends``.
    """

    name: str
    schemes: tuple[str, ...]
    open: Opener | str
    default_url: str = ""
    extra: str | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if not self.default_url:
            object.__setattr__(self, "default_url", f"{self.schemes[0]}://" if self.schemes else "")
        if isinstance(self.open, str) and (self.open.count(":") != 1 or not all(self.open.split(":"))):
            raise InvalidArgumentError(f"BackendSpec.open takes a callable or 'module:attr', not {self.open!r}")

    def url_for(self, url_or_name: str) -> str:
        """The URL a bare word that names this backend or one of its schemes stands for (a URL stays as it is)."""
        if "://" in url_or_name:
            return url_or_name
        return self.default_url if url_or_name == self.name else f"{url_or_name}://"

    @cached_property
    def opener(self) -> Opener:
        """The callable :attr:`open` names (imported on first use when it is a ``"module:attr"`` string)."""
        if isinstance(self.open, str):
            module, attr = self.open.split(":")
            opener: Opener = getattr(importlib.import_module(module), attr)
            return opener
        return self.open

    def open_store(self, url_or_name: str, **options: Any) -> HistoryStore:
        """Open the store ``url_or_name`` names (a URL, this backend's name, or one of its schemes) with ``options``."""
        return self.opener(self.url_for(url_or_name), **options)
