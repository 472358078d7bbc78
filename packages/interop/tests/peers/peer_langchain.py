"""A pytest plugin that runs langchain-core's own chat-history tests with ``ChatkeepChatMessageHistory`` in place
of ``InMemoryChatMessageHistory`` (``python -m peers langchain`` loads it; see docs/frameworks/index.md).

Each test module's ``InMemoryChatMessageHistory`` name is replaced, for the test's duration, by a subclass of
``ChatkeepChatMessageHistory`` with the in-memory history's constructor: ``(messages=[...])`` makes a new
conversation (a session of its own in the test's tenant, on the store of ``CHATKEEP_PEER_STORE_URL``) holding
those messages, and two histories are equal when their messages are, as two in-memory histories (pydantic
models) are. Nothing else of the adapter changes. The tenant is deleted and the store closed after the test.
LangChain's own conftest stays in force, with its blocking-call guard (blockbuster), plus one exemption: asyncpg,
as it opens a connection, looks for ``~/.pgpass`` and the TLS files (``os.stat``) on the event loop, which the
guard flags (docs/operations.md, "Blocking calls", tells LangChain users to exempt it the same way).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from langchain_core.messages import BaseMessage

from chatkeep.core import SyncHistoryStore, open_store
from chatkeep.interop.langchain import ChatkeepChatMessageHistory
from peers._expected import mark_expected

STORE_URL = os.environ.get("CHATKEEP_PEER_STORE_URL", "memory://")


def history_class(view: SyncHistoryStore, tenant: str) -> type[ChatkeepChatMessageHistory]:
    """``ChatkeepChatMessageHistory`` with ``InMemoryChatMessageHistory``'s constructor and equality."""

    class InMemoryChatMessageHistory(ChatkeepChatMessageHistory):
        def __init__(self, messages: Sequence[BaseMessage] = ()) -> None:
            super().__init__(f"history-{uuid.uuid4().hex[:12]}", view, tenant=tenant)
            if messages:
                self.add_messages(messages)

        def __eq__(self, other: object) -> bool:
            if not isinstance(other, ChatkeepChatMessageHistory):
                return NotImplemented
            return self.messages == other.messages

        __hash__ = None  # type: ignore[assignment]  # equal by value, as the pydantic model it stands for

    return InMemoryChatMessageHistory


@pytest.fixture(autouse=True)
def _asyncpg_file_lookups_may_block(request: pytest.FixtureRequest) -> None:
    if "blockbuster" in request.fixturenames:
        guard = request.getfixturevalue("blockbuster")
        for function in guard.functions.values():
            function.can_block_in("asyncpg/connect_utils.py", "_parse_connect_dsn_and_args")


@pytest.fixture(autouse=True)
def _chatkeep_in_place_of_in_memory_history(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
    module = request.module
    if getattr(module, "InMemoryChatMessageHistory", None) is None:
        yield
        return
    tenant = f"peer-{uuid.uuid4().hex[:12]}"
    view = open_store(STORE_URL.format(tmp=tmp_path)).sync()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(module, "InMemoryChatMessageHistory", history_class(view, tenant))
            yield
    finally:
        view.delete_tenant(tenant)
        view.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_expected("langchain", items)
