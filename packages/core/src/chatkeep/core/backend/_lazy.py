"""A plugin package's public names, imported on first use, so that discovering its plugin imports no driver."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports each name from its submodule when first asked for.

    ``where`` maps each public name to ``"_module"`` (the same name there) or ``"_module:attribute"``. Python
    imports a package before any of its modules, so a plugin entry point (``chatkeep.blob._plugin``) would
    otherwise import the whole backend, its driver included, whenever plugins are discovered::

        __getattr__ = lazy_exports(__name__, {"BlobHistoryStore": "_store", "BlobURLError": "_config"})
    """

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = where[name].partition(":")
        return getattr(importlib.import_module(f"{package}.{module}"), attribute or name)

    return __getattr__
