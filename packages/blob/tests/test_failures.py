"""Failures: a private Azurite stopped and restarted mid-use, refused connections, throttling, lost replies."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from chatkeep.blob import open_store
from chatkeep.core import Message, SessionKey, StoreUnavailableError
from chatkeep.testing.faults import free_port
from chatkeep.testing.telemetry import Telemetry

KEY = SessionKey("tenant", "session")
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
FAST = {"retries": 1, "retry_backoff": 0.05, "connect_timeout": 1, "read_timeout": 2}


def make_messages(n: int, label: str = "m") -> list[Message]:
    return [Message(role="user", text=f"{label}-{i}") for i in range(n)]


def connection_string(port: int) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={ACCOUNT_KEY};"
        f"BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;"
    )


def container_url() -> str:
    return f"azblob://ck-{uuid.uuid4().hex[:16]}"


@pytest.mark.reliability
async def test_store_recovers_after_azurite_restarts(private_azurite: Any) -> None:
    async with open_store(container_url(), connection_string=private_azurite.connection_string, **FAST) as store:
        before = make_messages(3, "before")
        assert await store.append(KEY, before) == 3
        await private_azurite.stop()

        for call in (
            lambda: store.append(KEY, make_messages(2)),
            lambda: store.load(KEY, last=5),
            lambda: store.count(KEY),
            lambda: store.list_sessions(KEY.tenant),
        ):
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError) as caught:
                await call()
            assert time.monotonic() - started < 10, "a call on a stopped Azurite did not fail within a bounded time"
            assert caught.value.__cause__ is not None
            assert f"127.0.0.1:{private_azurite.port}" in str(caught.value)
            assert ACCOUNT_KEY not in str(caught.value)

        await private_azurite.start()  # the same data folder: what was stored is still there
        after = make_messages(2, "after")
        assert await store.append(KEY, after) == 2  # the same store, no restart: new connections
        assert [m.message_id for m in await store.load(KEY)] == [m.message_id for m in before + after]
        assert await store.append(KEY, after) == 0


@pytest.mark.reliability
async def test_refused_connection_names_the_endpoint_and_hides_the_key() -> None:
    port = free_port()
    async with open_store(container_url(), connection_string=connection_string(port), **FAST) as store:
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as caught:
            await store.count(KEY)
        assert time.monotonic() - started < 10
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message
    assert ACCOUNT_KEY not in message
    assert isinstance(caught.value.__cause__, Exception)


@pytest.mark.reliability
@pytest.mark.parametrize(("status", "reason"), [(503, "Server Busy"), (429, "Too Many Requests")])
async def test_throttling_is_retried_with_backoff_then_said_plainly(
    status: int, reason: str, status_server: Any, telemetry: Telemetry
) -> None:
    server = await status_server(status, reason)
    options = {**FAST, "retries": 3, "retry_backoff": 0.1}
    async with open_store(container_url(), connection_string=connection_string(server.port), **options) as store:
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as caught:
            await store.load(KEY, last=5)
        elapsed = time.monotonic() - started
    assert server.requests == 4, "the SDK's retry policy did not retry the throttled request 3 times"
    # Backoff of about 0.1, 0.2 and 0.4 s (each within ±25%) between the four attempts.
    assert 0.5 < elapsed < 5
    message = str(caught.value)
    assert "throttling" in message
    assert f"HTTP {status}" in message
    assert "retries=" in message
    retried = telemetry.span("load")
    assert retried.attributes["chatkeep.retries"] == 3
    assert [event.attributes["chatkeep.retry.reason"] for event in retried.events] == ["throttled"] * 3


@pytest.mark.reliability
async def test_lost_reply_leaves_the_append_whole_and_counts_it_once(private_azurite: Any, proxy: Any) -> None:
    url = container_url()
    batch = make_messages(40, "lost")
    async with open_store(
        url, connection_string=connection_string(proxy.port), retries=2, retry_backoff=0.05, read_timeout=1
    ) as store:
        assert await store.append(KEY, make_messages(1, "first")) == 1  # container and session exist
        proxy.blackhole = True
        with pytest.raises(StoreUnavailableError):
            await store.append(KEY, batch)  # every reply is lost: the SDK's retries fail too
        proxy.blackhole = False
        proxy.cut()
        async with open_store(url, connection_string=private_azurite.connection_string) as direct:
            stored = await direct.load(KEY)
        # The block either landed whole (visible at once, like any landed append) or not at all.
        assert [m.text for m in stored[1:]] in ([], [m.text for m in batch])
        assert await store.append(KEY, batch) == 40 - (len(stored) - 1)
        assert [m.message_id for m in (await store.load(KEY))[1:]] == [m.message_id for m in batch]


@pytest.mark.reliability
async def test_a_retried_append_whose_block_landed_counts_it_once(
    blob_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An Append Block whose reply was lost is retried by the SDK; the retry finds the block (by its token)."""
    from chatkeep.blob import _layout

    async with open_store(blob_url) as store:
        first = make_messages(2, "first")
        assert await store.append(KEY, first) == 2
        meta, _ = await store._read_meta(KEY)  # type: ignore[misc]
        batch = make_messages(5, "again")
        # The first attempt's block landed (its reply never came back): it is in the segment already.
        monkeypatch.setattr(_layout, "new_token", lambda: "0123456789abcdef")
        block = _layout.frame("0123456789abcdef", [m.to_record().encode() for m in batch])
        segment = store.layout.segment(KEY.tenant, KEY.session_id, meta.generation, meta.segments[-1].number)
        await store._container().get_blob_client(segment).append_block(block)
        # This store's cached metadata does not know the block: its append position fails, it reads the
        # block, sees its own token and finishes the append, counting the five messages as new.
        assert await store.append(KEY, batch) == 5
        assert [m.text for m in await store.load(KEY)] == [m.text for m in first + batch]
        assert await store.count(KEY) == 7
        assert await store.append(KEY, batch) == 0
        assert (await store.list_sessions(KEY.tenant)).items[0].message_count == 7
