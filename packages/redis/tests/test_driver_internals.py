"""The private attributes of drivers that the transports use: a driver upgrade that changes one fails here, by name.

redis-py's live in :mod:`chatkeep.redis._redispy`, asyncio's one (``_call_connection_lost``) in
:func:`chatkeep.redis._resp.release_socket`; nothing else in the package touches a private attribute of a driver.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode

from chatkeep.redis._redispy import PRIVATE_ATTRIBUTES
from chatkeep.redis._resp import release_socket


def _instances() -> dict[str, Any]:
    """One instance of each redis-py class named in PRIVATE_ATTRIBUTES (nothing connects)."""
    client = Redis()
    cluster = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", 1)])
    return {
        "redis.asyncio.RedisCluster instance": cluster,
        "redis.asyncio.cluster.ClusterNode instance": ClusterNode("127.0.0.1", 1),
        "redis.asyncio.ConnectionPool instance": client.connection_pool,
        "redis.asyncio.Connection instance": client.connection_pool.make_connection(),
    }


@pytest.mark.parametrize(("where", "attribute"), PRIVATE_ATTRIBUTES, ids=[f"{w}.{a}" for w, a in PRIVATE_ATTRIBUTES])
def test_redis_py_keeps_the_private_attributes_the_redis_py_transport_uses(where: str, attribute: str) -> None:
    instance = _instances()[where]
    assert hasattr(instance, attribute), (
        f"redis-py no longer has {where}.{attribute}, which chatkeep.redis._redispy uses; "
        "update RedisPyTransport.abandon / _on_slot_owner for this redis-py version"
    )


def test_asyncio_transports_keep_call_connection_lost() -> None:
    """``release_socket`` (both transports' ``abandon``) closes a socket whose event loop is closed."""

    async def open_transport() -> tuple[asyncio.BaseTransport, socket.socket]:
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        transport, _ = await asyncio.get_running_loop().create_connection(asyncio.Protocol, *server.getsockname())
        return transport, server

    transport, server = asyncio.run(open_transport())  # the loop is closed when this returns
    try:
        assert hasattr(transport, "_call_connection_lost"), (
            "asyncio's transports no longer have _call_connection_lost, which chatkeep.redis._resp.release_socket "
            "uses; find this Python's way to release a socket without its loop"
        )
        release_socket(transport)
        assert transport.get_extra_info("socket").fileno() == -1  # the socket is closed
    finally:
        server.close()
