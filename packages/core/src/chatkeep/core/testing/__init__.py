"""Deprecated: the conformance kit moved to :mod:`chatkeep.testing`, in the ``chatkeep-testing`` distribution.

``chatkeep.core.testing`` and its modules ``openai_server`` and ``scripted`` still give the moved names for
one release, each use with a ``DeprecationWarning`` naming the import to write instead. The ``testing``
extra of ``chatkeep-core`` installs ``chatkeep-testing``.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chatkeep.testing.conformance import (
        WINDOW_SLACK,
        AppendConformance,
        ConcurrencyConformance,
        ConformanceBase,
        ContentConformance,
        HistoryStoreConformance,
        KeyConformance,
        LifecycleConformance,
        ListingConformance,
        ReadConformance,
        RetentionConformance,
        SessionDocumentConformance,
        StoreFactory,
        StoreKit,
        TenantIsolationConformance,
        TTLConformance,
    )

__all__ = [
    "WINDOW_SLACK",
    "AppendConformance",
    "ConcurrencyConformance",
    "ConformanceBase",
    "ContentConformance",
    "HistoryStoreConformance",
    "KeyConformance",
    "LifecycleConformance",
    "ListingConformance",
    "ReadConformance",
    "RetentionConformance",
    "SessionDocumentConformance",
    "StoreFactory",
    "StoreKit",
    "TTLConformance",
    "TenantIsolationConformance",
]


def _moved(old: str, new: str, names: Collection[str], name: str) -> Any:
    """``name`` from module ``new``, with a ``DeprecationWarning`` that ``old`` is the path it moved from."""
    if name not in names:
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
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release: use 'from {new} import {name}' "
        "(the chatkeep-testing distribution, which the chatkeep-core[testing] extra installs)",
        DeprecationWarning,
        stacklevel=3,
    )
    return getattr(module, name)


def __getattr__(name: str) -> Any:
    return _moved(__name__, "chatkeep.testing", __all__, name)
