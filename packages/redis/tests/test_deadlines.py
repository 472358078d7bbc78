"""Bounded time: a peer that never greets fails within connect_timeout, a command never answered within socket_timeout.

Each failure names the option and its value, and is not retried (a retry would multiply the deadline).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from chatkeep.core import Message, SessionKey, StoreUnavailableError
from chatkeep.redis import open_store
from chatkeep.testing.faults import LoopbackProxy, SilentPeer

KEY = SessionKey("deadlines", "s")

#: URL templates for a silent peer, and the transport each is opened with.
SILENT_URLS = [
    ("redis://{address}/0", "resp"),
    ("redis://:pw@{address}/2", "resp"),  # the greeting is AUTH, then SELECT
    ("redis://{address}/0", "redis-py"),
    ("redis://:pw@{address}/2", "redis-py"),
    ("redis+cluster://{address}", "redis-py"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("template", "transport"), SILENT_URLS)
async def test_a_peer_that_never_greets_fails_within_connect_timeout(template: str, transport: str) -> None:
    async with SilentPeer() as peer:
        url = template.format(address=peer.address)
        async with open_store(url, connect_timeout=0.5, transport=transport) as store:
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError) as caught:
                await store.count(KEY)
            took = time.monotonic() - started
    # Before: the first command waited socket_timeout (10 s) three times, and the message said 10 s.
    assert took < 4, f"took {took:.1f} s with connect_timeout=0.5"
    message = str(caught.value)
    assert peer.address in message
    assert "connect_timeout=0.5 s" in message
    assert "?connect_timeout=" in message  # how to change it
    assert "pw" not in message.replace("***", "")


@pytest.mark.timeout(30)
async def test_a_command_never_answered_fails_within_socket_timeout(proxy: LoopbackProxy, redis_transport: str) -> None:
    url = f"redis://127.0.0.1:{proxy.port}/0"
    async with open_store(url, socket_timeout=0.5, connect_timeout=1, transport=redis_transport) as store:
        await store.count(KEY)  # connected and greeted
        proxy.blackhole = True  # the server still runs each command; its replies never come back
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as caught:
            await store.append(KEY, [Message(role="user", text="unanswered")])
        took = time.monotonic() - started
    # Not retried: a retry on a new connection would wait socket_timeout once more, per retry.
    assert took < 1.4, f"took {took:.1f} s with socket_timeout=0.5"
    message = str(caught.value)
    assert f"127.0.0.1:{proxy.port}" in message
    assert "socket_timeout=0.5 s" in message
    assert "?socket_timeout=" in message


@pytest.mark.timeout(30)
async def test_after_a_timeout_the_same_store_works_again(proxy: LoopbackProxy, redis_transport: str) -> None:
    url = f"redis://127.0.0.1:{proxy.port}/0?prefix=deadlines-again"
    async with open_store(url, socket_timeout=0.5, connect_timeout=0.5, transport=redis_transport) as store:
        await store.delete(KEY)
        proxy.blackhole = True
        with pytest.raises(StoreUnavailableError):
            await store.count(KEY)
        proxy.cut()  # the black-holed connections go; new ones are black-holed too: the greeting times out
        with pytest.raises(StoreUnavailableError, match=r"connect_timeout=0\.5 s"):
            await store.count(KEY)
        proxy.restore()
        assert await store.append(KEY, [Message(role="user", text="back")]) == 1
        assert await store.count(KEY) == 1
        await store.delete(KEY)


def test_defaults_bound_a_connect_by_5_s_and_a_command_by_10_s() -> None:
    settings: Any = open_store("redis://127.0.0.1:6379/0").config.settings
    assert (settings.connect_timeout, settings.socket_timeout) == (5.0, 10.0)
