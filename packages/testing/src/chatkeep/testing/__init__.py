"""Test tools for chatkeep: the conformance kit, a local OpenAI-protocol server, a scripted chat client.

* :mod:`chatkeep.testing.conformance`: the conformance kit, the pytest classes every
  :class:`~chatkeep.core.HistoryStore` backend subclasses (``HistoryStoreConformance`` and its parts). It
  imports pytest. Its names are re-exported here, so ``from chatkeep.testing import HistoryStoreConformance``
  works; they are imported on first use, so ``import chatkeep.testing`` alone does not import pytest.
* :mod:`chatkeep.testing.openai_server`: ``FakeOpenAIServer``, a scripted OpenAI-protocol HTTP server on
  loopback that the real ``openai`` package talks to. It does not import pytest.
* :mod:`chatkeep.testing.scripted`: ``ScriptedChatClient``, an in-process chat client answering from a
  queue. It does not import pytest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chatkeep.testing.conformance import (
        PROPERTY_SETTINGS,
        WINDOW_SLACK,
        AppendConformance,
        CLIConformance,
        CLIResult,
        Clock,
        ConcurrencyConformance,
        ConformanceBase,
        ContentConformance,
        DocumentDamager,
        FakeClock,
        ForkConformance,
        HistoryStoreConformance,
        InfoConformance,
        KeyConformance,
        LifecycleConformance,
        ListingConformance,
        PopConformance,
        PropertyConformance,
        RangeConformance,
        ReadConformance,
        RetentionConformance,
        SearchConformance,
        SessionDocumentConformance,
        StoreFactory,
        StoreKit,
        TenantIsolationConformance,
        TTLConformance,
        UsageConformance,
        for_all,
        not_implemented_yet,
    )

__all__ = [
    "PROPERTY_SETTINGS",
    "WINDOW_SLACK",
    "AppendConformance",
    "CLIConformance",
    "CLIResult",
    "Clock",
    "ConcurrencyConformance",
    "ConformanceBase",
    "ContentConformance",
    "DocumentDamager",
    "FakeClock",
    "ForkConformance",
    "HistoryStoreConformance",
    "InfoConformance",
    "KeyConformance",
    "LifecycleConformance",
    "ListingConformance",
    "PopConformance",
    "PropertyConformance",
    "RangeConformance",
    "ReadConformance",
    "RetentionConformance",
    "SearchConformance",
    "SessionDocumentConformance",
    "StoreFactory",
    "StoreKit",
    "TTLConformance",
    "TenantIsolationConformance",
    "UsageConformance",
    "for_all",
    "not_implemented_yet",
]


def __getattr__(name: str) -> Any:
    # The kit imports pytest. Importing it only when one of its names is asked for keeps the server and the
    # scripted client cheap to import outside a pytest run: a child process, a benchmark, another test runner.
    if name in __all__:
        from chatkeep.testing import conformance

        return getattr(conformance, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
