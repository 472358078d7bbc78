"""The stores the adapter tests run on, and the local OpenAI-protocol server the frameworks talk to.

Every adapter test that takes ``store_url`` runs on memory, SQLite (a file of its own), PostgreSQL and
Redis; ``CHATKEEP_TEST_INTEROP_BACKENDS`` (comma-separated names of :data:`TARGETS`) narrows that. Each
test gets a tenant of its own, so tests share the servers' tables and keys without seeing each other. A
server that cannot be reached is skipped with the reason, or fails the run when
``CHATKEEP_REQUIRE_SERVICES=1`` (CI).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from chatkeep.testing.openai_server import FakeOpenAIServer
from chatkeep.testing.services import missing_service

#: backend name -> store URL ("{tmp}" becomes a folder of the test's own).
TARGETS = {
    "memory": "memory://",
    "sqlite": "sqlite:///{tmp}/chat.db",
    "postgresql": os.environ.get("CHATKEEP_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"),
    "redis": os.environ.get("CHATKEEP_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
}


def _chosen() -> list[str]:
    names = [n.strip() for n in os.environ.get("CHATKEEP_TEST_INTEROP_BACKENDS", "").split(",") if n.strip()]
    unknown = sorted(set(names) - set(TARGETS))
    if unknown:
        raise pytest.UsageError(f"CHATKEEP_TEST_INTEROP_BACKENDS names no target {unknown}; known: {sorted(TARGETS)}")
    return names or list(TARGETS)


def _require_reachable(url: str) -> None:
    parts = urlsplit(url)
    if not parts.hostname:
        return
    try:
        socket.create_connection((parts.hostname, parts.port or 0), timeout=2).close()
    except OSError as exc:
        missing_service(f"{parts.scheme} server at {parts.hostname}:{parts.port} is not reachable ({exc})")


@pytest.fixture(params=_chosen())
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL on one of the target backends (the test's ``tenant`` keeps it apart from other tests)."""
    url = TARGETS[request.param].format(tmp=tmp_path)
    _require_reachable(url)
    return url


@pytest.fixture
def tenant() -> str:
    """A tenant no other test uses, so tests on shared servers never meet."""
    return f"interop-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def openai_server() -> Iterator[FakeOpenAIServer]:
    """The project's local OpenAI-protocol server (Chat Completions and Responses, JSON and streaming)."""
    with FakeOpenAIServer() as server:
        yield server
