"""Bounded time: a peer that never answers fails within connect_timeout, a request never answered within read_timeout.

Both bounds cover a request with its retries: the SDK's own timeouts bound each attempt, so a silent endpoint
took read_timeout times (retries + 1) plus the backoff (126 s with the defaults). The error names the option.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from typing import Any

import pytest
from azure.storage.blob.aio import BlobServiceClient

from chatkeep.blob import open_store
from chatkeep.core import Message, SessionKey, StoreUnavailableError
from chatkeep.testing.faults import LoopbackProxy, SilentPeer

KEY = SessionKey("deadlines", "s")


def _through(port: int, netloc: str | None = None) -> str:
    """The test account's connection string with its blob endpoint moved to ``127.0.0.1:port``."""
    conn = os.environ["AZURE_STORAGE_CONNECTION_STRING"]
    if netloc is None:
        endpoint = conn.split("BlobEndpoint=", 1)[1].split(";", 1)[0]
        netloc = urllib.parse.urlsplit(endpoint).netloc
    return conn.replace(netloc, f"127.0.0.1:{port}")


@pytest.mark.timeout(30)
async def test_a_peer_that_never_answers_fails_within_connect_timeout() -> None:
    async with SilentPeer() as peer:
        conn = _through(peer.port)
        async with open_store("azblob://deadlines", connection_string=conn, connect_timeout=0.5) as store:
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError) as caught:
                await store.count(KEY)
            took = time.monotonic() - started
    assert took < 4, f"took {took:.1f} s with connect_timeout=0.5"
    message = str(caught.value)
    assert peer.address in message
    assert "connect_timeout=0.5 s" in message
    assert "?connect_timeout=" in message  # how to change it


@pytest.mark.timeout(30)
async def test_a_request_never_answered_fails_within_read_timeout(service: BlobServiceClient, blob_url: str) -> None:
    endpoint = urllib.parse.urlsplit(service.url)  # the test account's (Azurite's), through a proxy
    proxy = LoopbackProxy(endpoint.port or 80, upstream_host=endpoint.hostname or "127.0.0.1")
    await proxy.start()
    options: dict[str, Any] = {"read_timeout": 0.5, "retry_backoff": 0.05}  # retries: the default 3
    try:
        async with open_store(blob_url, connection_string=_through(proxy.port, endpoint.netloc), **options) as store:
            assert await store.append(KEY, [Message(role="user", text="answered")]) == 1
            proxy.blackhole = True  # the service still does the work; its answers never come back
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError) as caught:
                await store.count(KEY)
            took = time.monotonic() - started
    finally:
        await proxy.aclose()
    # Before: 0.5 s per attempt, 4 attempts, and the backoff between them.
    assert took < 1.5, f"took {took:.1f} s with read_timeout=0.5"
    message = str(caught.value)
    assert "read_timeout=0.5 s" in message
    assert "?read_timeout=" in message


def test_defaults_bound_the_first_answer_by_5_s_and_a_request_by_30_s() -> None:
    settings: Any = open_store("azblob://deadlines").config.settings
    assert (settings.connect_timeout, settings.read_timeout) == (5.0, 30.0)
