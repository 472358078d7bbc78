"""Deprecated: the conformance kit moved to :mod:`chatkeep.testing`, in the ``chatkeep-testing`` distribution.

``chatkeep.core.testing`` and its modules ``openai_server`` and ``scripted`` still give the moved names for
one release, each use with a ``DeprecationWarning`` naming the import to write instead. The ``testing``
extra of ``chatkeep-core`` installs ``chatkeep-testing``.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chatkeep.testing import *  # noqa: F403


def _moved(old: str, new: str, name: str) -> Any:
    """``name`` from module ``new``, with a ``DeprecationWarning`` that ``old`` is the path it moved from.

    The moved names are the new module's ``__all__`` (``old.__all__`` gives them too), so no list is kept here.
    """
    if name.startswith("__") and name != "__all__":
        raise AttributeError(f"module {old!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(new)
    except ModuleNotFoundError as exc:
        if exc.name is None or not f"{new}.".startswith(f"{exc.name}."):
            raise
        raise ModuleNotFoundError(
            f"{old} moved to {new}, in the chatkeep-testing distribution: "
            'pip install chatkeep-testing (or pip install "chatkeep-core[testing]")',
            name=exc.name,
        ) from exc
    names: list[str] = list(module.__all__)
    if name == "__all__":
        return names
    if name not in names:
        raise AttributeError(f"module {old!r} has no attribute {name!r}")
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release: use 'from {new} import {name}' "
        "(the chatkeep-testing distribution, which the chatkeep-core[testing] extra installs)",
        DeprecationWarning,
        stacklevel=3,
    )
    return getattr(module, name)


def __getattr__(name: str) -> Any:
    return _moved(__name__, "chatkeep.testing", name)
