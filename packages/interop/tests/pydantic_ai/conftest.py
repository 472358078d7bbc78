"""Conversation stores on each target backend, beside Pydantic AI's own ``InMemoryConversationStore``.

Pydantic AI publishes no tests for its conversation stores (neither its sdists nor its wheels hold them), so
``test_store.py`` runs each scenario on the reference store and on the adapter and asserts the same outcome.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from chatkeep.core import open_store
from chatkeep.interop.pydantic_ai import ChatkeepConversationStore

StoreFactory = Callable[[], ChatkeepConversationStore]


@pytest.fixture
async def make_store(store_url: str, tenant: str) -> AsyncIterator[StoreFactory]:
    """``make_store()``: a new adapter on the test's backend and tenant (each opens the URL, as a process would)."""
    opened: list[ChatkeepConversationStore] = []

    def make() -> ChatkeepConversationStore:
        store = ChatkeepConversationStore(store_url, tenant=tenant)
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.close()
    cleanup = open_store(store_url)
    await cleanup.delete_tenant(tenant)
    await cleanup.close()
