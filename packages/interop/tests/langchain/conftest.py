"""Histories on each target store: one sync view per test (as a ``get_session_history`` factory shares one)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

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
