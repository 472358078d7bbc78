"""A ChatkeepChatStore on each target backend, closed after its test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chatkeep.interop.llama_index import ChatkeepChatStore


@pytest.fixture
def chat_store(store_url: str, tenant: str) -> Iterator[ChatkeepChatStore]:
    """A chat store on the test's backend, under the test's own tenant."""
    store = ChatkeepChatStore(store_url, tenant=tenant)
    try:
        yield store
    finally:
        store.close()
