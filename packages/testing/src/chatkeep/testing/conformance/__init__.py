"""The conformance kit: the tests every :class:`~chatkeep.core.HistoryStore` backend must pass.

A backend's test module subclasses :class:`HistoryStoreConformance` and tells the kit how to open
stores; the kit brings the tests (order, idempotent retries, concurrent writers, cancellation,
atomic pops, windowed reads, hostile ids, tenant isolation, versioned documents, listing, prune, TTL, lifecycle,
search for stores with that capability, forks, usage, titles and tags, and property tests drawing random
messages, ids and session state with Hypothesis)::

    import uuid

    import pytest

    from chatkeep.testing import HistoryStoreConformance, StoreFactory
    from chatkeep.acme import AcmeHistoryStore


    class TestAcmeConformance(HistoryStoreConformance):
        native_ttl = True  # the engine expires keys itself; the TTL tests run
        multi_process = True  # child processes reach the data through store_url

        @pytest.fixture
        def store_url(self) -> str:
            return f"acme://127.0.0.1:9999/?prefix=test-{uuid.uuid4().hex}"  # this test's own keys

        @pytest.fixture
        def make_store(self, store_url: str) -> StoreFactory:
            # A new instance on the same data at every call; options are ttl= and max_message_bytes=.
            return lambda **options: AcmeHistoryStore.from_url(store_url, **options)

        async def messages_read(self, store) -> int:  # only for a store without a messages_read property
            return store.stats.records_read  # rows fetched or records decoded, never a timing

        @pytest.mark.xfail(strict=True, reason="Acme keys hold 255 bytes at most")
        async def test_hostile_session_ids_are_kept_apart(self, kit, store):
            await super().test_hostile_session_ids_are_kept_apart(kit, store)

The subclass contract:

* ``make_store`` (a fixture, sync or async): returns a :class:`StoreFactory`, a callable
  ``make_store(**options)`` that opens a **new** store instance on the **same** backing data each time
  (it may return the store or an awaitable of it). The options are ``ttl=`` (seconds or a
  ``timedelta``) and ``max_message_bytes=``. Give each test (or each run) its own backing, such as a
  namespace, schema, key prefix or container: the kit writes under random tenants and deletes them
  afterwards, but ``prune(tenant=None)`` is tested too and reaches everything in the backing. The kit
  closes every store it opens.
* the read probe, the number of message records a store instance has read from its backing so far:
  the store's ``messages_read`` property (``chatkeep.core.backend.SupportsReadProbe``), or else an
  override of ``messages_read(store)``. Windowed reads (``load(last=20)`` on 100,000 messages, one page of
  ``iter_messages``) and cheap appends are proven with it, never with timings.
* ``damage_session_document``: a fixture (in the subclass, or in a ``conftest.py`` shared with
  :class:`CLIConformance`) returning an async ``damage(store, key)`` that writes text that is not JSON where
  the backend keeps ``key``'s session document, behind the store (:data:`DocumentDamager`).
* ``native_ttl`` and ``multi_process``: the only capability flags. With ``multi_process`` set,
  ``store_url`` (a class attribute or a fixture) is a URL that ``chatkeep.core.open_store`` opens
  in a child process on the same data.
* Anything else the backend cannot do is declared, not hidden: override that one test with
  ``@pytest.mark.xfail(strict=True, reason=...)`` and call ``super()`` in its body, so the test
  still runs and reports when the backend starts passing. Any other override, a skip mark or a
  removed standard test raises ``TypeError`` when the subclass is defined.
* A backend that does not implement a whole feature yet (forks, usage, titles and tags: the optional hooks
  ``_fork``, ``_usage``, ``_update_info``, ``_list_tagged_sessions``) declares it with the class decorator
  :func:`not_implemented_yet` (``@not_implemented_yet(ForkConformance, reason="...")``): each of those tests is
  then a strict expected failure that must fail with ``UnsupportedOperationError``.

:class:`CLIConformance` runs the ``chatkeep`` command end to end on a backend (every command, bad input,
an unreachable server, a copy killed midway and rerun); a backend's tests subclass it with a ``store_url``
fixture, an ``unreachable_url`` fixture when it has a server, and ``multi_process``.

The kit's tests are async and run on a function-scoped event loop (``pytest-asyncio``, which
``chatkeep-testing`` installs, in auto or strict mode). The smaller classes (:class:`AppendConformance`,
:class:`SessionDocumentConformance`, ...) can be subclassed alone while a backend is being built.
"""

from chatkeep.testing.conformance._base import (
    WINDOW_SLACK,
    Clock,
    ConformanceBase,
    DocumentDamager,
    FakeClock,
    StoreFactory,
    StoreKit,
    not_implemented_yet,
)
from chatkeep.testing.conformance._cli import CLIConformance, CLIResult
from chatkeep.testing.conformance._concurrency import ConcurrencyConformance
from chatkeep.testing.conformance._conformance import HistoryStoreConformance
from chatkeep.testing.conformance._forks import ForkConformance
from chatkeep.testing.conformance._history import AppendConformance, ContentConformance, ReadConformance
from chatkeep.testing.conformance._info import InfoConformance, UsageConformance
from chatkeep.testing.conformance._keys import KeyConformance, TenantIsolationConformance
from chatkeep.testing.conformance._lifecycle import LifecycleConformance, RetentionConformance, TTLConformance
from chatkeep.testing.conformance._pop import PopConformance
from chatkeep.testing.conformance._properties import PROPERTY_SETTINGS, PropertyConformance, for_all
from chatkeep.testing.conformance._ranges import RangeConformance
from chatkeep.testing.conformance._search import SearchConformance
from chatkeep.testing.conformance._sessions import ListingConformance, SessionDocumentConformance

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
