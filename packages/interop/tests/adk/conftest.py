"""Session services on each target store, each test in a tenant of its own (deleted afterwards)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from chatkeep.core import open_store
from chatkeep.interop.adk import ChatkeepSessionService

ServiceFactory = Callable[[], ChatkeepSessionService]


@pytest.fixture
async def make_service(store_url: str, tenant: str) -> AsyncIterator[ServiceFactory]:
    """``make_service()``: a service that opens the test's store from its URL, as another process would (each
    has a store of its own); all are closed, and the tenant deleted, after the test."""
    made: list[ChatkeepSessionService] = []

    def make() -> ChatkeepSessionService:
        made.append(ChatkeepSessionService(store_url, tenant=tenant))
        return made[-1]

    yield make
    for service in made:
        await service.close()
    async with open_store(store_url) as store:
        await store.delete_tenant(tenant)


@pytest.fixture
async def service(store_url: str, tenant: str) -> AsyncIterator[ChatkeepSessionService]:
    """A service on the test's store (one store object for the whole test)."""
    async with open_store(store_url) as store, ChatkeepSessionService(store, tenant=tenant) as made:
        yield made
        await store.delete_tenant(tenant)
