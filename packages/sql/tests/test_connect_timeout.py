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
    store = SQLHistoryStore(url.format(address=silent_peer), connect_timeout=1)
    started = time.monotonic()
    try:
        with pytest.raises(StoreUnavailableError) as caught:
            await store.append(SessionKey("connect-timeout", "s"), [Message(role="user", text="hi")])
    finally:
        await store.close()
    assert time.monotonic() - started < 10  # a hang, not a duration: the bound is 1 s
    message = str(caught.value)
    del caught
    # The cancelled connect's socket is left to the garbage collector (aiomysql does not close it when cancelled,
    # and the exception's frames keep it in a cycle): collect it here, not in whichever test runs next, where its
    # ResourceWarning would fail that test at random.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    assert silent_peer in message
    assert "connect_timeout=1" in message
    assert "?connect_timeout=" in message  # how to change it
