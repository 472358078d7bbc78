"""A server that stops answering after the handshake: a statement fails at statement_timeout plus a grace.

The server cancels a statement at ``statement_timeout`` and says so at once; when nothing comes back (the server
is stuck, or the network to it black-holes), the driver would wait as long as the socket stays open. A proxy in
front of the real server drops its replies after the first call.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

import pytest

from chatkeep.core import Message, SessionKey, StoreUnavailableError
from chatkeep.sql import SQLHistoryStore
from chatkeep.sql._transport import ANSWER_GRACE
from chatkeep.testing.faults import LoopbackProxy

PSYCOPG_CANCEL_WAIT = 10.0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["default", "sqlalchemy", "psycopg"])
async def test_a_server_that_stops_answering_fails_at_the_statement_timeout(sql_target: Any, transport: str) -> None:
    if sql_target.family == "sqlite":
        pytest.skip("a SQLite file has no server to stop answering")
    parts = urlsplit(sql_target.url)
    proxy = LoopbackProxy(parts.port or 0, upstream_host=parts.hostname or "127.0.0.1")
    await proxy.start()
    url = sql_target.url.replace(f"{parts.hostname}:{parts.port}", f"127.0.0.1:{proxy.port}", 1)
    if transport == "psycopg":
        if sql_target.family != "postgresql":
            pytest.skip("psycopg is a PostgreSQL driver")
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    elif transport != "default":
        url += ("&" if "?" in url else "?") + f"transport={transport}"
    store = SQLHistoryStore(url, statement_timeout=0.5, connect_timeout=1)
    key = SessionKey("statement-deadline", f"s-{transport}")
    try:
        await store.count(key)  # connected, greeted, the schema checked
        proxy.blackhole = True  # the server still runs each statement; its answers never come back
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as caught:
            await store.append(key, [Message(role="user", text="unanswered")])
        took = time.monotonic() - started
        # Before: it waited as long as the socket stayed open (forever here). Not re-run on a new connection.
        # psycopg, interrupted in a query, tries to cancel it for 5 s, then waits 5 s more for the query to end.
        bound = 0.5 + ANSWER_GRACE + 1.5 + (PSYCOPG_CANCEL_WAIT if transport == "psycopg" else 0)
        assert took < bound, f"took {took:.1f} s with statement_timeout=0.5"
        message = str(caught.value)
        assert "statement_timeout=0.5 s" in message
        assert "?statement_timeout=" in message  # how to change it
        assert f"127.0.0.1:{proxy.port}" in message
        proxy.restore()
        await store.delete(key)  # the same store works again once the server answers
        assert await store.count(key) == 0
    finally:
        await store.close()
        await proxy.aclose()
