"""Savers on each target store: one sync view per test, shared by every saver the test makes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from chatkeep.core import SyncHistoryStore, open_store
from chatkeep.interop.langgraph import ChatkeepSaver

SaverFactory = Callable[..., ChatkeepSaver]


@pytest.fixture
def view(store_url: str, tenant: str) -> Iterator[SyncHistoryStore]:
    """A sync view of the target store; the tenants the test used are deleted afterwards (the servers are shared)."""
    view = open_store(store_url).sync()
    yield view
    for used in view.list_tenants():
        if used.startswith(tenant):
            view.delete_tenant(used)
    view.close()


@pytest.fixture
def saver(view: SyncHistoryStore, tenant: str) -> SaverFactory:
    """``saver(**options)``: a saver of the test's tenant (or of ``tenant=...``, which must start with it)."""

    def make(**options: Any) -> ChatkeepSaver:
        options.setdefault("tenant", tenant)
        return ChatkeepSaver(view, **options)

    return make
