"""A store's own engine keeps its connections checked out between calls (``_engine._Engine``), newest first.

What must still hold: a call takes the connection the last call gave back, with no trip through SQLAlchemy's
pool; one kept past ``pool_recycle`` is replaced; with ``pool_pre_ping`` none is kept; a connection found dead
drops the kept ones too (no call runs on another dead one); the schema's own work can still get a connection
when the pool has no room to spare; ``close()`` gives every kept connection back.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from chatkeep.core import Message, SessionKey
from chatkeep.sql import SQLHistoryStore


@pytest.fixture
def server(sql_target: Any) -> Any:
    if sql_target.family == "sqlite":
        pytest.skip("the sqlite3 transport keeps its own connections; this is the server engines' pool")
    return sql_target


def _join(url: str, options: str) -> str:
    return url + ("&" if "?" in url else "?") + options


async def _backend_id(store: SQLHistoryStore) -> int:
    """The server's id of the connection a call runs on."""
    statement = "SELECT pg_backend_pid()" if store.dialect == "postgresql" else "SELECT CONNECTION_ID()"
    rows = await store._transport.run(lambda conn: conn.fetch(statement))
    return int(rows[0][0])


def _pool(store: SQLHistoryStore) -> Any:
    return store._transport.engine.sync_engine.pool  # type: ignore[attr-defined]


async def _kill(server: Any, backend_id: int) -> None:
    """End a connection from the server's side, as a restart or an idle timeout would."""
    killer = SQLHistoryStore(server.url)
    try:
        if killer.dialect == "postgresql":
            statement = f"SELECT pg_terminate_backend({backend_id})"
        else:
            statement = f"KILL {backend_id}"
        await killer._transport.run(lambda conn: conn.execute(statement))
    finally:
        await killer.close()


async def test_a_call_takes_the_connection_the_last_one_gave_back(server: Any) -> None:
    store = SQLHistoryStore(server.url)
    try:
        key = SessionKey("kept", "s")
        await store.append(key, [Message(role="user", text="hi")])
        first = await _backend_id(store)
        for _ in range(3):
            await store.load(key, last=20)
            assert await _backend_id(store) == first
        pool = _pool(store)
        assert (pool.checkedout(), pool.checkedin()) == (1, 0)  # kept in chatkeep's hands, not the pool's
    finally:
        await store.close()
    assert pool.checkedout() == 0  # close() gave it back before disposing of the pool


async def test_a_connection_kept_past_pool_recycle_is_replaced(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SQLHistoryStore(_join(server.url, "pool_recycle=60"))
    try:
        before = await _backend_id(store)
        assert await _backend_id(store) == before
        # A fake clock, an hour on: chatkeep's age check (monotonic) and the pool's own (time).
        monotonic, wall = time.monotonic, time.time
        monkeypatch.setattr(time, "monotonic", lambda: monotonic() + 3600)
        monkeypatch.setattr(time, "time", lambda: wall() + 3600)
        after = await _backend_id(store)
        assert after != before
        assert await _backend_id(store) == after
    finally:
        await store.close()


async def test_pool_pre_ping_keeps_none(server: Any) -> None:
    store = SQLHistoryStore(_join(server.url, "pool_pre_ping=true"))
    try:
        await _backend_id(store)
        pool = _pool(store)
        assert (pool.checkedout(), pool.checkedin()) == (0, 1)
    finally:
        await store.close()


@pytest.mark.reliability
async def test_a_dead_connection_drops_the_kept_ones(server: Any) -> None:
    store = SQLHistoryStore(server.url)
    try:
        key = SessionKey("kept", "dead")
        await store.count(key)  # the schema checked
        # Two calls at once: two connections, both kept afterwards.
        ids = await asyncio.gather(*(_slow_backend_id(store) for _ in range(2)))
        assert len(set(ids)) == 2
        assert _pool(store).checkedout() == 2
        for backend_id in ids:
            await _kill(server, backend_id)
        await asyncio.sleep(0.2)  # the server closes them
        # The first kept one fails before the server answered: the call runs again on a new connection, and the
        # other kept one (as dead) is dropped with it rather than tried next.
        await store.append(key, [Message(role="user", text="after the restart")])
        assert [m.text for m in await store.load(key)] == ["after the restart"]
        assert await _backend_id(store) not in ids
    finally:
        await store.close()


async def _slow_backend_id(store: SQLHistoryStore) -> int:
    if store.dialect == "postgresql":
        statement = "SELECT pg_backend_pid(), pg_sleep(0.2)"
    else:
        statement = "SELECT CONNECTION_ID(), SLEEP(0.2)"
    rows = await store._transport.run(lambda conn: conn.fetch(statement))
    return int(rows[0][0])


async def test_the_schema_work_gets_a_connection_from_a_pool_with_no_room(server: Any) -> None:
    store = SQLHistoryStore(_join(server.url, "pool_size=1&max_overflow=0"))
    try:
        await store.append(SessionKey("kept", "full"), [Message(role="user", text="hi")])
        assert _pool(store).checkedout() == 1  # the one connection, kept
        await asyncio.wait_for(store.migrate(), 20)  # not a 30 s wait for the pool
    finally:
        await store.close()
