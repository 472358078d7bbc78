"""A server that stops answering after the handshake: a statement fails at statement_timeout plus a grace.

The server cancels a statement at ``statement_timeout`` and says so at once; when nothing comes back (the server
is stuck, or the network to it black-holes), the driver would wait as long as the socket stays open. A proxy in
front of the real server drops its replies after the first call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import pytest

from chatkeep.core import Message, SessionKey, StoreUnavailableError
from chatkeep.sql import SQLHistoryStore
from chatkeep.sql._errors import NoAnswerError
from chatkeep.sql._transport import ANSWER_GRACE, Connection
from chatkeep.testing.faults import LoopbackProxy

PSYCOPG_CANCEL_WAIT = 10.0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["default", "sqlalchemy", "psycopg"])
async def test_a_server_that_stops_answering_fails_at_the_statement_timeout(sql_target: Any, transport: str) -> None:
    if sql_target.family == "sqlite":
        pytest.skip("a SQLite file has no server to stop answering")
    if transport == "psycopg" and sql_target.family != "postgresql":
        pytest.skip("psycopg is a PostgreSQL driver")  # before the proxy listens: a skip would leave it open
    parts = urlsplit(sql_target.url)
    proxy = LoopbackProxy(parts.port or 0, upstream_host=parts.hostname or "127.0.0.1")
    await proxy.start()
    url = sql_target.url.replace(f"{parts.hostname}:{parts.port}", f"127.0.0.1:{proxy.port}", 1)
    if transport == "psycopg":
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


class _Answering(Connection):
    """A connection whose statements are answered when the test says so: the deadline's own bookkeeping, on the
    event loop's clock moved by the test (no server, no sleeping)."""

    def __init__(self) -> None:
        super().__init__()
        self.statement_timeout = 0.5
        self.pending: asyncio.Future[list[tuple[int]]] | None = None
        self.sent = asyncio.Event()

    async def _fetch(self, statement: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
        self.pending = asyncio.get_running_loop().create_future()
        self.sent.set()
        return await self.pending

    async def next_statement(self) -> asyncio.Future[list[tuple[int]]]:
        """The next statement sent, once it is."""
        await self.sent.wait()
        self.sent.clear()
        assert self.pending is not None
        return self.pending

    async def _execute(self, statement: str, params: Sequence[Any]) -> int:
        return len(await self._fetch(statement, params))


@pytest.fixture
def clock() -> Callable[[float], Awaitable[None]]:
    """Moves the running loop's clock on by some seconds and lets the timers due by then run."""
    offset = [0.0]

    async def advance(seconds: float) -> None:
        running = asyncio.get_running_loop()
        if "time" not in vars(running):
            real = running.time
            running.time = lambda: real() + offset[0]  # type: ignore[method-assign]
        offset[0] += seconds
        for _ in range(3):
            await asyncio.sleep(0)

    return advance


async def _answer_after(conn: _Answering, advance: Callable[[float], Awaitable[None]], seconds: float) -> None:
    pending = await conn.next_statement()
    await advance(seconds)
    if not pending.done():
        pending.set_result([(1,)])


async def test_each_statement_has_its_own_bound_not_the_call(clock: Callable[[float], Awaitable[None]]) -> None:
    conn = _Answering()  # bound: 0.5 s + ANSWER_GRACE
    for _ in range(4):  # four statements of 1 s each, with 5 s between them: 24 s in all, none unanswered for long
        answer = asyncio.ensure_future(_answer_after(conn, clock, 1.0))
        assert await conn.fetch("SELECT 1") == [(1,)]
        await answer
        await clock(5.0)  # the timer (armed once, at the first statement) fires between statements and stops
    conn.end()


async def test_a_statement_unanswered_past_its_bound_raises(clock: Callable[[float], Awaitable[None]]) -> None:
    conn = _Answering()
    await _first_then(conn, clock, ANSWER_GRACE + 0.6)
    conn.end()


async def _first_then(conn: _Answering, clock: Callable[[float], Awaitable[None]], late: float) -> None:
    answer = asyncio.ensure_future(_answer_after(conn, clock, 0.2))
    await conn.fetch("SELECT 1")  # answered in time: the timer stays armed for the call
    await answer
    waiting = asyncio.ensure_future(conn.fetch("SELECT 2"))
    await conn.next_statement()
    await clock(late)  # the timer fires at the first statement's due time, re-arms at the second's, then fires
    await clock(0.0)
    with pytest.raises(NoAnswerError):
        await waiting
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr] - the deadline took its cancel back


async def test_a_cancelled_caller_stays_cancelled(clock: Callable[[float], Awaitable[None]]) -> None:
    conn = _Answering()
    waiting = asyncio.ensure_future(conn.fetch("SELECT 1"))
    await conn.next_statement()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    conn.end()
