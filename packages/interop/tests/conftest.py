"""The stores the adapter tests run on, and the local OpenAI-protocol server the frameworks talk to.

Every adapter test that takes ``store_url`` runs on memory, SQLite (a file of its own), PostgreSQL and
Redis; ``CHATKEEP_TEST_INTEROP_BACKENDS`` (comma-separated names of :data:`TARGETS`) narrows that. Each
test gets a tenant of its own, so tests share the servers' tables and keys without seeing each other. A
server that cannot be reached is skipped with the reason, or fails the run when
``CHATKEEP_REQUIRE_SERVICES=1`` (CI).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import textwrap
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from chatkeep.core import DEFAULT_TENANT, Message, SessionKey, SessionPage
from chatkeep.memory import MemoryHistoryStore
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
def store_urls(tmp_path: Path) -> dict[str, str]:
    """Every chosen target's URL by name, for a test that serves them all from one process it starts (a new
    process per target costs a framework's import each time); an unreachable one skips or fails as ``store_url``."""
    urls = {name: TARGETS[name].format(tmp=tmp_path) for name in _chosen()}
    for url in urls.values():
        _require_reachable(url)
    return urls


@pytest.fixture
def tenant() -> str:
    """A tenant no other test uses, so tests on shared servers never meet."""
    return f"interop-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def openai_server() -> Iterator[FakeOpenAIServer]:
    """The project's local OpenAI-protocol server (Chat Completions and Responses, JSON and streaming)."""
    with FakeOpenAIServer() as server:
        yield server


NewProcess = Callable[..., Awaitable[str]]


@pytest.fixture
def new_process(tmp_path: Path) -> NewProcess:
    """``await new_process(script, *args)``: run a Python script in a process of its own; its output, stripped.

    asyncio's subprocess, so the local server in the test's process keeps answering meanwhile. The script must
    end with exit code 0 (else the test fails with its stderr).
    """

    async def run(script: str, *args: str) -> str:
        path = tmp_path / f"process_{uuid.uuid4().hex[:8]}.py"
        path.write_text(textwrap.dedent(script), encoding="utf-8")
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(path), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
        assert process.returncode == 0, stderr.decode()
        return stdout.decode().strip()

    return run


class GatedStore(MemoryHistoryStore):
    """A memory store whose calls, once ``armed``, wait (on its own loop thread) until ``opened`` is set.

    The gate is a ``threading.Event`` polled with ``asyncio.sleep``: no worker thread of its own, so a test can
    forbid ``asyncio.to_thread`` while the chat store's methods run.
    """

    def __init__(self) -> None:
        super().__init__(namespace=f"interop-gated-{uuid.uuid4().hex}")
        self.armed = False
        self.opened = threading.Event()
        self.waiting = threading.Event()  # a call reached the gate
        self.calls: list[str] = []

    async def _gate(self, name: str) -> None:
        self.calls.append(name)
        if not self.armed:
            return
        self.waiting.set()
        for _ in range(1000):  # 10 s at most
            if self.opened.is_set():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{name} waited 10 s: the caller's event loop never ran the task that opens the gate")

    async def run_with_the_loop_free(self, call: Awaitable[object], monkeypatch: pytest.MonkeyPatch) -> None:
        """Run ``call`` with the gate armed and ``asyncio.to_thread`` forbidden; a task of the caller's loop opens
        the gate, so ``call`` ends only if it left that loop free while the store waited."""

        def no_thread_hop(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("an async method ran through asyncio.to_thread")

        monkeypatch.setattr(asyncio, "to_thread", no_thread_hop)
        self.armed = True
        running = asyncio.ensure_future(call)

        async def opener() -> None:
            for _ in range(2000):
                if self.waiting.is_set():
                    break
                await asyncio.sleep(0.005)
            self.opened.set()

        try:
            await asyncio.wait_for(asyncio.gather(running, opener()), timeout=30)
        finally:
            monkeypatch.undo()
            self.armed = False
        assert self.waiting.is_set()

    async def load(self, key: SessionKey, *, last: int | None = None) -> list[Message]:
        await self._gate("load")
        return await super().load(key, last=last)

    async def append(self, key: SessionKey, messages: Sequence[Message]) -> int:
        await self._gate("append")
        return await super().append(key, messages)

    async def count(self, key: SessionKey) -> int:
        await self._gate("count")
        return await super().count(key)

    async def trim(self, key: SessionKey, keep_last: int) -> int:
        await self._gate("trim")
        return await super().trim(key, keep_last)

    async def pop(self, key: SessionKey) -> Message | None:
        await self._gate("pop")
        return await super().pop(key)

    async def delete(self, key: SessionKey) -> bool:
        await self._gate("delete")
        return await super().delete(key)

    async def list_sessions(
        self, tenant: str = DEFAULT_TENANT, *, limit: int = 100, cursor: str | None = None
    ) -> SessionPage:
        await self._gate("list_sessions")
        return await super().list_sessions(tenant, limit=limit, cursor=cursor)


@pytest.fixture
def gated_store() -> GatedStore:
    """A memory store whose calls wait at a gate once armed: proves an async method keeps its caller's loop free."""
    return GatedStore()
