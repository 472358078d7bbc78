"""The one-stop conformance class every backend subclasses: :class:`HistoryStoreConformance`."""

from __future__ import annotations

from chatkeep.testing.conformance._concurrency import ConcurrencyConformance
from chatkeep.testing.conformance._forks import ForkConformance
from chatkeep.testing.conformance._history import AppendConformance, ContentConformance, ReadConformance
from chatkeep.testing.conformance._info import InfoConformance, UsageConformance
from chatkeep.testing.conformance._keys import KeyConformance, TenantIsolationConformance
from chatkeep.testing.conformance._lifecycle import LifecycleConformance, RetentionConformance, TTLConformance
from chatkeep.testing.conformance._pop import PopConformance
from chatkeep.testing.conformance._properties import PropertyConformance
from chatkeep.testing.conformance._ranges import RangeConformance
from chatkeep.testing.conformance._search import SearchConformance
from chatkeep.testing.conformance._sessions import ListingConformance, SessionDocumentConformance

__all__ = ["HistoryStoreConformance"]


class HistoryStoreConformance(
    AppendConformance,
    ReadConformance,
    RangeConformance,
    PopConformance,
    ContentConformance,
    ConcurrencyConformance,
    KeyConformance,
    TenantIsolationConformance,
    SessionDocumentConformance,
    ListingConformance,
    RetentionConformance,
    TTLConformance,
    LifecycleConformance,
    PropertyConformance,
    SearchConformance,
    ForkConformance,
    UsageConformance,
    InfoConformance,
):
    """Every rule of the :class:`~chatkeep.core.HistoryStore` contract, as tests a backend inherits.

    Subclass it once per backend (or per engine of a backend) in a ``Test*`` class, provide the
    ``make_store`` fixture and :meth:`messages_read`, set ``native_ttl`` and ``multi_process``, and
    ``store_url`` when ``multi_process`` is true. See :mod:`chatkeep.testing.conformance` for an example.
    """
