"""Histories on each target store: one sync view per test (as a ``get_session_history`` factory shares one).

Every test runs under LangChain's blocking-call guard, as LangChain's own tests do (blockbuster, scanning
``langchain_core`` with the exemptions of langchain-core's conftest) and scanning chatkeep too: a blocking call
(file or socket I/O, a sleep, a wait on a lock) made inside a running event loop fails the test.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from blockbuster import BlockBuster, blockbuster_ctx

from chatkeep.core import SyncHistoryStore, open_store
from chatkeep.interop.langchain import ChatkeepChatMessageHistory

HistoryFactory = Callable[..., ChatkeepChatMessageHistory]


@pytest.fixture
def view(store_url: str, tenant: str) -> Iterator[SyncHistoryStore]:
    """A sync view of the target store; the test's tenant is deleted afterwards (the servers are shared)."""
    view = open_store(store_url).sync()
    yield view
    view.delete_tenant(tenant)
    view.close()


@pytest.fixture
def history(view: SyncHistoryStore, tenant: str) -> HistoryFactory:
    """``history(session_id="chat", **options)``: a history of the test's tenant on the shared view."""

    def make(session_id: str = "chat", **options: Any) -> ChatkeepChatMessageHistory:
        return ChatkeepChatMessageHistory(session_id, view, tenant=tenant, **options)

    return make


@pytest.fixture(autouse=True)
def blocking_guard() -> Iterator[BlockBuster]:
    """LangChain's guard against blocking calls inside a running event loop, over LangChain and chatkeep."""
    with blockbuster_ctx(["langchain_core", "chatkeep"]) as guard:
        # langchain-core's own exemptions (its tests' conftest): its checks of its own callers' files.
        for name in ("os.stat", "os.path.abspath"):
            guard.functions[name].can_block_in("langchain_core/_api/internal.py", "is_caller_internal")
            guard.functions[name].can_block_in("langchain_core/runnables/base.py", "__repr__")
        # asyncpg looks for ~/.pgpass and the TLS files (os.stat, reads) as it opens a connection, on the event
        # loop: the driver's, once per pooled connection (docs/operations.md, "Blocking calls").
        for function in guard.functions.values():
            function.can_block_in("asyncpg/connect_utils.py", "_parse_connect_dsn_and_args")
        yield guard


@pytest.fixture
def blocking_on_purpose(blocking_guard: BlockBuster) -> Callable[[], contextlib.AbstractContextManager[None]]:
    """``with blocking_on_purpose():`` around a blocking call a test makes from async code on purpose (as a sync
    callback would): the guard is off for its duration, and on again after it."""

    @contextlib.contextmanager
    def unguarded() -> Iterator[None]:
        blocking_guard.deactivate()
        try:
            yield
        finally:
            blocking_guard.activate()

    return unguarded
