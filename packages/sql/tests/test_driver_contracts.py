"""What chatkeep-sql relies on in its drivers beyond their documented API: fails loudly when a release changes it.

Only ``_engine`` uses a private name: ``Pool._invalidate(connection, exception)``, which SQLAlchemy's own
``Connection`` calls on a disconnect. It marks every pooled connection opened before the dead one as stale, so
the pool replaces them on checkout instead of handing the next calls connections that died with the same
server restart. Each call has one retry on a stale connection: without this, a pool of five dead
connections would fail four calls after a restart.

``create_engine`` also passes the async dialects' ``async_creator_fn`` connect argument (what
``create_async_engine(async_creator=...)`` sets): the driver's connect, bounded as a whole by ``connect_timeout``.
"""

from __future__ import annotations

import inspect
import sqlite3
from typing import Any

import pytest
from sqlalchemy.pool import Pool, QueuePool


def _pool() -> tuple[QueuePool, list[sqlite3.Connection]]:
    opened: list[sqlite3.Connection] = []

    def creator() -> sqlite3.Connection:
        opened.append(sqlite3.connect(":memory:", check_same_thread=False))
        return opened[-1]

    return QueuePool(creator, pool_size=5, max_overflow=0), opened


def test_pool_invalidate_keeps_its_signature() -> None:
    parameters = list(inspect.signature(Pool._invalidate).parameters)
    assert parameters[:3] == ["self", "connection", "exception"], (
        "SQLAlchemy changed Pool._invalidate: update EngineTransport._drop in chatkeep/sql/_engine.py"
    )


def test_pool_invalidate_replaces_every_connection_as_old_as_the_dead_one() -> None:
    pool, opened = _pool()
    older: Any = pool.connect()
    dead: Any = pool.connect()
    older.info["chatkeep_used"] = True
    older_raw = older.dbapi_connection
    older.close()  # back in the pool, idle
    pool._invalidate(dead, ConnectionError("server restarted"))
    dead.close()
    again: Any = pool.connect()
    assert again.dbapi_connection is not older_raw, "the idle connection as old as the dead one was handed out again"
    assert "chatkeep_used" not in again.info, "a replaced connection kept the info of the one it replaced"
    assert len(opened) == 3
    again.close()
    pool.dispose()


def test_pooled_connection_exposes_the_driver_objects_the_transports_use() -> None:
    pool, opened = _pool()
    fairy: Any = pool.connect()
    assert fairy.dbapi_connection is opened[0]
    assert fairy.driver_connection is opened[0]
    fairy.close()
    pool.dispose()


class _Sentinel(Exception):
    pass


@pytest.mark.parametrize("driver", ["postgresql+asyncpg", "mysql+asyncmy", "mysql+aiomysql", "postgresql+psycopg"])
async def test_async_dialects_open_connections_through_async_creator_fn(driver: str) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    seen: list[dict[str, Any]] = []

    async def creator(*_args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        raise _Sentinel

    engine = create_async_engine(
        f"{driver}://u@127.0.0.1:1/db", connect_args={"async_creator_fn": creator, "marker": 1}
    )
    try:
        with pytest.raises(_Sentinel):
            await engine.connect()
    finally:
        await engine.dispose()
    assert len(seen) == 1, f"SQLAlchemy no longer calls async_creator_fn on {driver}: update chatkeep/sql/_engine.py"
    assert seen[0]["marker"] == 1, "async_creator_fn no longer gets the connect arguments"
