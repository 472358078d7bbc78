"""Repository-wide test configuration: which conformance-kit tests count as ``reliability`` tests here.

The kit in ``chatkeep.testing`` ships to other projects, so its tests carry no marks of their own: its
override guard refuses any mark on a standard test, and other projects do not register this repository's
markers. This hook marks them in this repository's runs instead, so ``pytest -m reliability`` selects them
in every backend's conformance class. It also gives every test the ``telemetry`` fixture: the spans and metrics
the test's store calls export, read back in memory.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chatkeep.testing import ConcurrencyConformance, SessionDocumentConformance
from chatkeep.testing.telemetry import Telemetry, recording

# Kit tests with concurrent writers (tasks, event loops, processes), killed writers or cancellations.
KIT_RELIABILITY_TESTS = frozenset(
    {
        ConcurrencyConformance.test_concurrent_writers_keep_appends_whole,
        ConcurrencyConformance.test_writers_on_several_event_loops,
        ConcurrencyConformance.test_writers_in_several_processes,
        ConcurrencyConformance.test_a_writer_killed_mid_append_loses_no_acknowledged_append,
        ConcurrencyConformance.test_cancelled_append_is_all_or_nothing,
        SessionDocumentConformance.test_concurrent_savers_exactly_one_wins,
    }
)


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -m
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if isinstance(item, pytest.Function) and item.function in KIT_RELIABILITY_TESTS:
            item.add_marker(pytest.mark.reliability)


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    """What OpenTelemetry exported during the test (tracing is on only within tests that ask for this)."""
    with recording() as recorded:
        yield recorded
