"""A peer that accepts TCP and never sends the database's greeting: a store call fails within connect_timeout.

The peer is a local listener that accepts and stays silent (a wrong port, a stuck server, a proxy with no
backend). Without a bound on the whole connect-and-greet, asyncmy and aiomysql wait for the greeting forever.
No database server is needed: the test runs in every SQL session.
"""

from __future__ import annotations

import gc
import time
import warnings
from collections.abc import AsyncIterator

import pytest

from chatkeep.core import Message, SessionKey, StoreUnavailableError
from chatkeep.sql import SQLHistoryStore
from chatkeep.testing.faults import SilentPeer

#: Every server driver, on its own transport and on SQLAlchemy's.
URLS = [
    "mysql://root@{address}/test",
    "mariadb://root@{address}/test?transport=sqlalchemy",
    "mysql+aiomysql://root@{address}/test",
    "postgresql://postgres@{address}/test",
    "postgresql://postgres@{address}/test?transport=sqlalchemy",
    "postgresql+psycopg://postgres@{address}/test",
]


@pytest.fixture
async def silent_peer() -> AsyncIterator[str]:
    """``host:port`` of a listener that accepts connections and never writes a byte."""
    async with SilentPeer() as peer:
        yield peer.address


@pytest.mark.timeout(30)
@pytest.mark.parametrize("url", URLS)
async def test_a_peer_that_never_greets_fails_within_connect_timeout(silent_peer: str, url: str) -> None:
    # A cancelled connect's socket is the driver's to close, and asyncmy and aiomysql leave it to the garbage
    # collector (the driver's leak, not chatkeep's: chatkeep never sees the socket). It may be freed at any point
    # of this test (by reference count or by a collection), so the whole test ignores its ResourceWarning and
    # collects it before the end, not in whichever test runs next, where the warning would fail that test.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            message = await _failed_append(silent_peer, url)
        finally:
            gc.collect()
    assert silent_peer in message
    assert "connect_timeout=1" in message
    assert "?connect_timeout=" in message  # how to change it


async def _failed_append(silent_peer: str, url: str) -> str:
    """The message of the error an append gets from a peer that never greets, checked to come within seconds."""
    store = SQLHistoryStore(url.format(address=silent_peer), connect_timeout=1)
    started = time.monotonic()
    try:
        with pytest.raises(StoreUnavailableError) as caught:
            await store.append(SessionKey("connect-timeout", "s"), [Message(role="user", text="hi")])
    finally:
        await store.close()
    assert time.monotonic() - started < 10  # a hang, not a duration: the bound is 1 s
    return str(caught.value)
