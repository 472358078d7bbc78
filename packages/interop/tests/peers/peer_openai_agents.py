"""A pytest plugin that runs the OpenAI Agents SDK's own session tests with ``ChatkeepSession`` in place of
``SQLiteSession`` and ``AdvancedSQLiteSession`` (``python -m peers openai-agents`` loads it; see
docs/frameworks/index.md).

The SDK's tests build ``SQLiteSession(session_id, db_path, session_settings=...)`` and
``AdvancedSQLiteSession(session_id=..., db_path=..., create_tables=..., session_settings=...)``. Each test
module's name for them is replaced, for the test's duration, by a subclass of ``ChatkeepSession`` with that
constructor, on the store of ``CHATKEEP_PEER_STORE_URL``: one tenant per database path, so two sessions given
the same file share their data (as two sessions on one file do) and two files never meet; an in-memory
database (the default) is a tenant of its own per session, as it is a database of its own. Every tenant is
deleted and every store closed after the test. The advanced session's tests read its current branch through
the private ``_current_branch_id``, which the subclass maps to ``ChatkeepSession.current_branch_id``; its
SQLite-only arguments (``create_tables``, ``logger``, table names) have nothing to configure and are ignored.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chatkeep.interop.openai_agents import ChatkeepSession
from peers._expected import mark_expected

STORE_URL = os.environ.get("CHATKEEP_PEER_STORE_URL", "memory://")


class _Tenants:
    """The tenants of one test: one per database path (an in-memory database: one per session)."""

    def __init__(self) -> None:
        self.by_path: dict[str, str] = {}
        self.opened: list[ChatkeepSession] = []

    def of(self, db_path: str | Path) -> str:
        new = f"peer-{uuid.uuid4().hex[:12]}"
        return new if str(db_path) == ":memory:" else self.by_path.setdefault(str(db_path), new)

    async def clean_up(self) -> None:
        for session in self.opened:
            if not session.store.closed:
                await session.store.delete_tenant(session.tenant)
                await session.close()


def session_class(store_url: str, tenants: _Tenants) -> type[ChatkeepSession]:
    """``ChatkeepSession`` with ``SQLiteSession``'s constructor, on the peer run's store (a subclass, so the
    tests' own subclasses of ``SQLiteSession`` subclass the adapter); nothing else of the adapter changes."""

    class SQLiteSession(ChatkeepSession):
        def __init__(self, session_id: str, db_path: str | Path = ":memory:", session_settings: Any = None) -> None:
            tenant = tenants.of(db_path)
            super().__init__(session_id, store=store_url, tenant=tenant, session_settings=session_settings)
            tenants.opened.append(self)

    return SQLiteSession


def advanced_session_class(store_url: str, tenants: _Tenants) -> type[ChatkeepSession]:
    """``ChatkeepSession`` with ``AdvancedSQLiteSession``'s constructor, on the peer run's store."""

    class AdvancedSQLiteSession(ChatkeepSession):
        def __init__(
            self,
            *,
            session_id: str,
            db_path: str | Path = ":memory:",
            create_tables: bool = False,
            logger: Any = None,
            session_settings: Any = None,
            **sqlite_options: Any,
        ) -> None:
            tenant = tenants.of(db_path)
            super().__init__(session_id, store=store_url, tenant=tenant, session_settings=session_settings)
            tenants.opened.append(self)

        @property
        def _current_branch_id(self) -> str:
            return self.current_branch_id

    return AdvancedSQLiteSession


@pytest.fixture(autouse=True)
def _chatkeep_in_place_of_sqlite_session(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
    tenants = _Tenants()
    module = request.module
    with pytest.MonkeyPatch.context() as patch:
        store_url = STORE_URL.format(tmp=tmp_path)
        if getattr(module, "SQLiteSession", None) is not None:
            patch.setattr(module, "SQLiteSession", session_class(store_url, tenants))
        if getattr(module, "AdvancedSQLiteSession", None) is not None:
            patch.setattr(module, "AdvancedSQLiteSession", advanced_session_class(store_url, tenants))
        yield
    asyncio.run(tenants.clean_up())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_expected("openai-agents", items)
