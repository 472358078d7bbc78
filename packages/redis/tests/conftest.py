"""Which Redis servers the tests target, per-test key prefixes, and cleanup by prefix.

``CHATKEEP_TEST_REDIS_URL`` names the one server a session targets (``redis://127.0.0.1:6379/0`` or
``redis+cluster://127.0.0.1:7000``); unset, the tests run against both defaults. An unreachable server skips
its tests with the reason, or fails them when ``CHATKEEP_REQUIRE_SERVICES=1`` (CI).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
import weakref
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from redis.asyncio import Redis, RedisCluster

from chatkeep.core import HistoryStore, SessionKey
from chatkeep.core.encryption import EncryptedStore
from chatkeep.redis import RedisHistoryStore
from chatkeep.redis._layout import session_keys
from chatkeep.redis._transport import TRANSPORTS
from chatkeep.testing import DocumentDamager
from chatkeep.testing.faults import LoopbackProxy, free_port
from chatkeep.testing.services import missing_service

DEFAULT_TARGETS = ["redis://127.0.0.1:6379/0", "redis+cluster://127.0.0.1:7000"]
_reachable: dict[str, str | None] = {}


def targets() -> list[str]:
    """The server URLs this session tests against."""
    chosen = os.environ.get("CHATKEEP_TEST_REDIS_URL", "").strip()
    return [chosen] if chosen else DEFAULT_TARGETS


def target_id(url: str) -> str:
    return "cluster" if url.startswith("redis+cluster") else "standalone"


def transports_for(url: str) -> list[str]:
    """The transports that serve a target: both on a standalone server, redis-py on a cluster."""
    return ["redis-py"] if url.startswith("redis+cluster") else list(TRANSPORTS)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``redis_target`` (the server URL, without chatkeep options) runs a test once per target server; with
    ``redis_transport`` too, once per transport that serves it (both on a standalone server, redis-py on a
    cluster), so no test is generated for a pair that cannot run. Tests of a private standalone server
    (``private_redis``...) that take ``redis_transport`` run on both transports.
    """
    names = metafunc.fixturenames
    if "redis_target" in names and "redis_transport" in names:
        pairs = [(url, transport) for url in targets() for transport in transports_for(url)]
        ids = [f"{target_id(url)}-{transport}" for url, transport in pairs]
        metafunc.parametrize(("redis_target", "redis_transport"), pairs, ids=ids)
    elif "redis_target" in names:
        metafunc.parametrize("redis_target", targets(), ids=target_id)
    elif "redis_transport" in names:
        metafunc.parametrize("redis_transport", list(TRANSPORTS))


def raw_client(url: str) -> Redis | RedisCluster:
    """A redis-py client on the target (for assertions about keys and for cleanup)."""
    if url.startswith("redis+cluster://"):
        return RedisCluster.from_url("redis://" + url.split("://", 1)[1].split(",")[0])
    return Redis.from_url(url)


async def _probe(url: str) -> str | None:
    client = raw_client(url)
    try:
        await asyncio.wait_for(client.ping(), 5)
        return None
    except Exception as exc:  # any failure means "not usable here"
        return f"{type(exc).__name__}: {exc}"
    finally:
        await client.aclose()


async def require(url: str) -> None:
    """Skip (or fail, with CHATKEEP_REQUIRE_SERVICES=1) when the server is unreachable."""
    if url not in _reachable:
        _reachable[url] = await _probe(url)
    reason = _reachable[url]
    if reason is not None:
        message = f"Redis at {url} is unreachable ({reason}); start it (scripts/redis-cluster up for the cluster)"
        missing_service(message)


async def unlink_prefix(url: str, prefix: str) -> None:
    """Remove every key under ``prefix:`` (this test's own keys only) on every node."""
    client = raw_client(url)
    try:
        batch: list[bytes] = []
        async for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            batch.append(key)
        for key in batch:  # one by one: cluster keys live on different slots
            await client.unlink(key)
    finally:
        await client.aclose()


@pytest_asyncio.fixture(loop_scope="function")
async def redis_prefix(redis_target: str) -> AsyncIterator[str]:
    """A key prefix no other test or run uses; its keys are removed when the test ends."""
    await require(redis_target)
    prefix = f"cktest-{uuid.uuid4().hex[:12]}"
    try:
        yield prefix
    finally:
        await unlink_prefix(redis_target, prefix)


@pytest.fixture
def damage_session_document() -> DocumentDamager:
    """The kit's hook: text that is not JSON in the session hash's ``doc`` field (an encrypted store's inner one)."""

    async def damage(store: HistoryStore, key: SessionKey) -> None:
        inner = store.inner if isinstance(store, EncryptedStore) else store
        assert isinstance(inner, RedisHistoryStore)
        session_hash = session_keys(inner.prefix, key.tenant, key.session_id)[0]
        assert await inner._call("HSET", session_hash, "doc", '{"type": "sess') == 0  # it overwrote the document

    return damage


@pytest.fixture
def redis_url(redis_target: str, redis_prefix: str) -> str:
    """The target URL with this test's prefix."""
    return f"{redis_target}?prefix={redis_prefix}"


class PrivateRedis:
    """A redis-server this test starts on its own port (never the shared one), to stop and start at will."""

    def __init__(self, port: int, *options: str, password: str | None = None) -> None:
        self.port = port
        self.options = options
        self.password = password
        self.process: asyncio.subprocess.Process | None = None
        # Its working folder, where a master writes the RDB a replica syncs from (never the checkout); a
        # ``--dir`` option overrides it.
        self.directory = tempfile.mkdtemp(prefix="chatkeep-private-redis-")
        weakref.finalize(self, shutil.rmtree, self.directory, ignore_errors=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        if shutil.which("redis-server") is None:
            pytest.skip("redis-server is not installed; the failure tests start a private one")
        self.process = await asyncio.create_subprocess_exec(
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            *self.options, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, cwd=self.directory,
        )  # fmt: skip
        for _ in range(100):
            client = Redis(port=self.port, password=self.password, socket_connect_timeout=0.2)
            try:
                await client.ping()
                return
            except Exception:
                await asyncio.sleep(0.05)
            finally:
                await client.aclose()
        raise RuntimeError(f"the private redis-server on port {self.port} did not start")

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        self.process = None


@pytest_asyncio.fixture(loop_scope="function")
async def private_redis() -> AsyncIterator[PrivateRedis]:
    """A private redis-server, stopped at the end of the test."""
    server = PrivateRedis(free_port())
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest_asyncio.fixture(loop_scope="function", params=["everysec", "always"])
async def aof_redis(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[PrivateRedis]:
    """A private redis-server with an append-only file, fsynced every second or at every write."""
    fsync = str(request.param)
    server = PrivateRedis(free_port(), "--appendonly", "yes", "--appendfsync", fsync, "--dir", str(tmp_path))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest_asyncio.fixture(loop_scope="function")
async def secured_redis() -> AsyncIterator[PrivateRedis]:
    """A private redis-server that requires the password ``s3cret``."""
    server = PrivateRedis(free_port(), "--requirepass", "s3cret", password="s3cret")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest_asyncio.fixture(loop_scope="function")
async def proxy(private_redis: PrivateRedis) -> AsyncIterator[LoopbackProxy]:
    """A proxy in front of the private redis-server."""
    proxy = LoopbackProxy(private_redis.port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.aclose()


@pytest_asyncio.fixture(loop_scope="function")
async def raw_redis(redis_target: str, redis_prefix: str) -> AsyncIterator[Redis | RedisCluster]:
    """A plain redis-py client on the target, to look at the keys a store wrote."""
    client = raw_client(redis_target)
    try:
        yield client
    finally:
        await client.aclose()
