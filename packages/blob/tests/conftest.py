"""The Azurite the blob tests run against, a container of their own per test, and private Azurites for faults.

``CHATKEEP_TEST_BLOB_CONNECTION_STRING`` names the account (default: Azurite's well-known development account
on 127.0.0.1:10000, which ``scripts/azurite up`` starts). Every test gets a new container with a random name
and deletes it afterwards. An unreachable Azurite skips the tests with the reason, or fails them when
``CHATKEEP_REQUIRE_SERVICES=1`` (CI).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from azure.storage.blob.aio import BlobServiceClient

from chatkeep.blob import BlobHistoryStore
from chatkeep.core import HistoryStore, SessionKey
from chatkeep.testing import DocumentDamager
from chatkeep.testing.faults import LoopbackProxy, free_port
from chatkeep.testing.services import missing_service

ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def connection_string(port: int = 10000) -> str:
    """Azurite's development account on ``port``."""
    return (
        f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={ACCOUNT_KEY};"
        f"BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;"
    )


CONNECTION_STRING = os.environ.get("CHATKEEP_TEST_BLOB_CONNECTION_STRING", "").strip() or connection_string()
AZURITE_BIN = Path(__file__).resolve().parents[3] / ".services" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
_reachable: dict[str, str | None] = {}


async def _probe(conn: str) -> str | None:
    client = BlobServiceClient.from_connection_string(conn, retry_total=0, connection_timeout=3)
    try:
        await asyncio.wait_for(client.get_account_information(), 10)
        return None
    except Exception as exc:  # any failure means "not usable here"
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    finally:
        await client.close()


async def require(conn: str) -> None:
    """Skip (or fail, with CHATKEEP_REQUIRE_SERVICES=1) when the account does not answer."""
    if conn not in _reachable:
        _reachable[conn] = await _probe(conn)
    reason = _reachable[conn]
    if reason is not None:
        message = (
            f"Azurite (or the account in CHATKEEP_TEST_BLOB_CONNECTION_STRING) is unreachable ({reason}); "
            "start it with scripts/azurite up"
        )
        missing_service(message)


@pytest.fixture(scope="session", autouse=True)
def account_in_environment() -> Iterator[None]:
    """The test account in AZURE_STORAGE_CONNECTION_STRING, so stores opened by URL (child processes too) find it."""
    before = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    os.environ["AZURE_STORAGE_CONNECTION_STRING"] = CONNECTION_STRING
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("AZURE_STORAGE_CONNECTION_STRING", None)
        else:
            os.environ["AZURE_STORAGE_CONNECTION_STRING"] = before


@pytest_asyncio.fixture(loop_scope="function")
async def service() -> AsyncIterator[BlobServiceClient]:
    """A plain SDK client on the test account, to look at what a store wrote."""
    await require(CONNECTION_STRING)
    client = BlobServiceClient.from_connection_string(CONNECTION_STRING)
    try:
        yield client
    finally:
        await client.close()


@pytest_asyncio.fixture(loop_scope="function")
async def container(service: BlobServiceClient) -> AsyncIterator[str]:
    """A container name no other test or run uses; the store creates it, and it is deleted when the test ends."""
    name = f"cktest-{uuid.uuid4().hex[:16]}"
    try:
        yield name
    finally:
        try:
            await service.get_container_client(name).delete_container()
        except Exception as exc:
            if "ContainerNotFound" not in str(exc):
                raise


@pytest.fixture
def damage_session_document(service: BlobServiceClient, container: str) -> DocumentDamager:
    """The kit's hook: text that is not JSON as the session document inside otherwise intact metadata."""

    async def damage(store: HistoryStore, key: SessionKey) -> None:
        assert isinstance(store, BlobHistoryStore)
        blob = service.get_container_client(container).get_blob_client(store.layout.meta(key.tenant, key.session_id))
        meta = json.loads(await (await blob.download_blob()).readall())
        meta["doc"] = '{"type": "sess'
        listing = (await blob.get_blob_properties()).metadata
        await blob.upload_blob(json.dumps(meta).encode(), overwrite=True, metadata=listing)

    return damage


@pytest.fixture
def blob_url(container: str) -> str:
    """The store URL of this test's container (the account comes from AZURE_STORAGE_CONNECTION_STRING)."""
    return f"azblob://{container}"


class PrivateAzurite:
    """An Azurite blob service this test starts on its own port (never the shared one), to stop and start at will."""

    def __init__(self, port: int, location: str) -> None:
        self.port = port
        self.location = location
        self.process: asyncio.subprocess.Process | None = None

    @property
    def connection_string(self) -> str:
        return connection_string(self.port)

    async def start(self) -> None:
        if not AZURITE_BIN.exists():
            missing_service(f"{AZURITE_BIN} is missing; run scripts/azurite up (it installs Azurite)")
        self.process = await asyncio.create_subprocess_exec(
            str(AZURITE_BIN), "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--location", self.location,
            "--skipApiVersionCheck", "--loose", "--silent", "--disableTelemetry",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        for _ in range(200):
            if await _probe(self.connection_string) is None:
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"the private Azurite on port {self.port} did not start")

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()  # Azurite saves its data on SIGTERM, so a restart finds it
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except asyncio.TimeoutError:
                self.process.kill()
                await self.process.wait()
        self.process = None


@pytest_asyncio.fixture(loop_scope="function")
async def private_azurite() -> AsyncIterator[PrivateAzurite]:
    """A private Azurite keeping its data in a temporary folder (so a restart keeps it), stopped at the end."""
    location = tempfile.mkdtemp(prefix="ck-azurite-")
    server = PrivateAzurite(free_port(), location)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
        shutil.rmtree(location, ignore_errors=True)


class StatusServer:
    """A tiny HTTP server on loopback answering every request with one status (503, 429...), counting requests."""

    def __init__(self, status: int, reason: str) -> None:
        self.status, self.reason = status, reason
        self.requests = 0
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                if length:
                    await reader.readexactly(length)
                self.requests += 1
                body = b"<?xml version='1.0'?><Error><Code>ServerBusy</Code><Message>busy</Message></Error>"
                writer.write(
                    f"HTTP/1.1 {self.status} {self.reason}\r\nContent-Length: {len(body)}\r\n"
                    "Content-Type: application/xml\r\nx-ms-error-code: ServerBusy\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def aclose(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest_asyncio.fixture(loop_scope="function")
async def status_server() -> AsyncIterator[Any]:
    """Starts :class:`StatusServer` instances (``await status_server(503, "Server Busy")``), closed at the end."""
    servers: list[StatusServer] = []

    async def start(status: int, reason: str) -> StatusServer:
        server = StatusServer(status, reason)
        await server.start()
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            await server.aclose()


@pytest_asyncio.fixture(loop_scope="function")
async def proxy(private_azurite: PrivateAzurite) -> AsyncIterator[LoopbackProxy]:
    """A proxy in front of the private Azurite."""
    proxy = LoopbackProxy(private_azurite.port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.aclose()
