"""LangGraph's own checkpointer conformance suite (langgraph-checkpoint-conformance) against ChatkeepSaver.

Every capability the suite knows runs on memory, SQLite, PostgreSQL and Redis: the five base ones and the three
extended ones the saver implements (``copy_thread``, ``prune``, ``delete_for_runs``), each on a fresh saver of a
tenant of its own, as the suite's runner makes one per capability.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from chatkeep.core import SyncHistoryStore
from chatkeep.interop.langgraph import ChatkeepSaver


@pytest.mark.parametrize("capability", sorted(cap.value for cap in ALL_CAPABILITIES))
async def test_the_capability_passes_langgraphs_conformance_suite(
    capability: str, view: SyncHistoryStore, tenant: str
) -> None:
    tenants = (f"{tenant}-{n}" for n in itertools.count())

    @checkpointer_test(name=f"ChatkeepSaver[{capability}]")
    async def chatkeep_saver() -> AsyncIterator[ChatkeepSaver]:
        yield ChatkeepSaver(view, tenant=next(tenants))

    report = await validate(chatkeep_saver, capabilities={capability})

    result = report.results[capability]
    assert result.detected, f"the suite did not detect {capability} on ChatkeepSaver"
    assert result.failures == []
    assert result.passed is True
    assert result.tests_passed > 0
