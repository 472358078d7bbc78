"""The ``redis-py`` transport: redis-py's asyncio clients, on standalone Redis and on Redis Cluster.

It serves every URL: TLS (``rediss://``), redis-py's query options, Redis Cluster (``redis+cluster://``) and
clients handed to the store. On a standalone server its commands are sent again after a lost connection by
:func:`chatkeep.redis._transport.retrying` (redis-py's own retry is off, so a command is never retried twice over);
a cluster client routes and retries single commands itself.

``WAIT`` after a write must run on the write's own connection, so on a cluster :meth:`RedisPyTransport.pipeline`
with a ``key`` sends the batch to the primary that owns the key's slot itself (:func:`_on_slot_owner`): redis-py's
cluster pipeline retries a failed batch without that aim, and ``WAIT`` would then answer for another connection.

This is the only module of the package that touches redis-py's private attributes: the cluster client's
``_initialize`` flag and the connections redis-py keeps per node and pool (:data:`PRIVATE_ATTRIBUTES`).
``packages/redis/tests/test_driver_internals.py`` fails, naming the attribute, when a redis-py release changes one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from chatkeep.core import StoreConfigurationError
from chatkeep.core.backend import record_retry
from chatkeep.redis._config import RedisConfig
from chatkeep.redis._resp import release_socket
from chatkeep.redis._transport import TransportName, backoff, bounded_greeting, retrying
from redis import exceptions as redis_errors
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode, PipelineCommand
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

__all__ = ["PRIVATE_ATTRIBUTES", "RedisClient", "RedisPyTransport", "decodes_responses"]

RedisClient = Redis | RedisCluster
T = TypeVar("T")

#: redis-py's private attributes this module uses: (where, attribute) for the driver-internals test.
PRIVATE_ATTRIBUTES = (
    ("redis.asyncio.RedisCluster instance", "_initialize"),
    ("redis.asyncio.cluster.ClusterNode instance", "_connections"),
    ("redis.asyncio.ConnectionPool instance", "_available_connections"),
    ("redis.asyncio.ConnectionPool instance", "_in_use_connections"),
    ("redis.asyncio.Connection instance", "_reader"),
    ("redis.asyncio.Connection instance", "_writer"),
)

# A failover takes the cluster's node timeout and an election (seconds); a few quick attempts ride over a moved
# slot or a node that was just replaced, and a failover still under way fails the call (StoreUnavailableError),
# for the caller to retry.
_ATTEMPTS = 4
# The node is gone or the cluster is reorganizing: ask it where the slot is now, then try again.
_TOPOLOGY_ERRORS = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ClusterDownError,
    redis_errors.TryAgainError,
    redis_errors.SlotNotCoveredError,
)
_REDIRECTIONS = 16  # MOVED and ASK replies followed before giving up, as redis-py does for one command


def decodes_responses(client: RedisClient) -> bool:
    """Whether a client hands back text instead of bytes (the store reads records as bytes)."""
    kwargs = client.get_connection_kwargs() if isinstance(client, Redis) else client.connection_kwargs  # type: ignore[no-untyped-call]
    return bool(kwargs.get("decode_responses"))


def _new_client(config: RedisConfig) -> RedisClient:
    common: dict[str, Any] = {
        "socket_timeout": config.settings.socket_timeout,
        "socket_connect_timeout": config.settings.connect_timeout,
        "decode_responses": False,
    }
    try:
        if config.cluster:
            return RedisCluster.from_url(
                config.url, startup_nodes=[ClusterNode(host, port) for host, port in config.startup_nodes], **common
            )
        return Redis.from_url(config.url, retry=Retry(NoBackoff(), 0), **common)
    except (TypeError, ValueError, redis_errors.RedisError) as exc:
        raise StoreConfigurationError(
            f"the Redis URL {config.shown_url!r} has an option redis-py does not accept: {exc}"
        ) from exc


class RedisPyTransport:
    """The ``redis-py`` transport on a client it makes from the store's URL, or on a client handed to the store.

    Args:
        config: the store's URL and options.
        client: a ``redis.asyncio.Redis`` or ``RedisCluster`` to use (left open by :meth:`aclose`); ``None``
            makes one from ``config``.
    """

    name: TransportName = "redis-py"

    def __init__(self, config: RedisConfig, client: RedisClient | None = None) -> None:
        self._owns_client = client is None
        self.client: RedisClient = _new_client(config) if client is None else client
        self.cluster = isinstance(self.client, RedisCluster)
        self._address = config.address
        self._connect_timeout = config.settings.connect_timeout
        self._greeted = False

    async def _greet(self) -> None:
        """Before the first command, and after a lost connection: reach the server within ``connect_timeout``.

        redis-py bounds the TCP connect by ``socket_connect_timeout``, then waits for its first reply as long as
        ``socket_timeout`` (a cluster: per startup node, with retries): a peer that accepts and never answers would
        hold the call far longer than ``connect_timeout``. A ``PING`` (a cluster: reading its topology) bounded as a
        whole finds it within the bound.
        """
        if self._greeted:
            return
        client = self.client
        greet: Awaitable[Any] = client.initialize() if isinstance(client, RedisCluster) else client.ping()
        await bounded_greeting(greet, address=self._address, seconds=self._connect_timeout)
        self._greeted = True

    async def _greeted_then(self, send: Callable[[], Awaitable[T]]) -> T:
        """``send()`` after :meth:`_greet`; a failed connection makes the next call greet again."""
        try:
            await self._greet()
            return await send()
        except (redis_errors.ConnectionError, redis_errors.TimeoutError):
            self._greeted = False
            raise

    async def call(self, *args: Any) -> Any:
        """Run one command (a cluster client routes it by its key); a server error reply raises it."""
        client = self.client
        if self.cluster:
            return await _once_more_if_closed_under(lambda: self._greeted_then(lambda: client.execute_command(*args)))
        return await retrying(lambda: self._greeted_then(lambda: client.execute_command(*args)))

    async def pipeline(self, commands: Sequence[Sequence[Any]], *, key: str | None = None) -> list[Any]:
        """Run commands in one pipeline; replies in order, server error replies in their place.

        On a cluster with ``key``, every command goes to the primary owning ``key``'s slot, on one connection;
        without it, redis-py's cluster pipeline sends each command to the node of its own key.
        """
        if self.cluster and key is not None:
            client = self.client
            assert isinstance(client, RedisCluster)
            return await self._greeted_then(lambda: _on_slot_owner(client, key, commands))

        async def send() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            return list(await pipe.execute(raise_on_error=False))

        if self.cluster:
            return await _once_more_if_closed_under(lambda: self._greeted_then(send))
        return await retrying(lambda: self._greeted_then(send))

    async def aclose(self) -> None:
        """Close the client when the store made it."""
        if self._owns_client:
            with contextlib.suppress(redis_errors.RedisError, OSError):
                await self.client.aclose()

    def abandon(self) -> None:
        """Close the client's sockets without its event loop (which is closed), so nothing warns of a leak later."""
        if not self._owns_client:
            return
        client = self.client
        connections: list[Any] = []
        if isinstance(client, RedisCluster):
            nodes = [*client.get_nodes(), *client.nodes_manager.startup_nodes.values(), *client.startup_nodes]
            for node in {id(node): node for node in nodes}.values():
                connections += node._connections
            client._initialize = True  # what aclose() leaves behind: the client no longer counts as open
        else:
            pool = client.connection_pool
            connections += [*pool._available_connections, *pool._in_use_connections]
        for connection in connections:
            writer = connection._writer
            if writer is None:
                continue
            release_socket(writer.transport)
            connection._writer = connection._reader = None


def _lost_if_closed_under(exc: AttributeError) -> BaseException:
    """The connection error an ``AttributeError`` from redis-py's connection code means, or ``exc`` itself.

    redis-py closes a cluster node's connections when another task refreshes the topology (a failover); a call
    that already holds one of them then finds its writer or reader gone (``None``) before it sent anything:
    ``'NoneType' object has no attribute 'writelines'``. That is a lost connection, not a bug.
    """
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    module = str(frame.tb_frame.f_globals.get("__name__", "")) if frame is not None else ""
    if module.startswith("redis.") and "'NoneType' object" in str(exc):
        return redis_errors.ConnectionError("a connection was closed under this call by a topology refresh")
    return exc


async def _once_more_if_closed_under(send: Callable[[], Awaitable[T]]) -> T:
    """``send()``, once more when redis-py closed its connection under it (see :func:`_lost_if_closed_under`).

    Other failures of a cluster call are redis-py's to retry (it refreshes the topology and tries again).
    """
    for attempt in (0, 1):
        try:
            return await send()
        except AttributeError as exc:
            lost = _lost_if_closed_under(exc)
            if lost is exc:
                raise  # a bug, not a closed connection
            if attempt == 1:
                raise lost from exc
            record_retry("connection lost")
    raise AssertionError("unreachable")


async def _on_slot_owner(client: RedisCluster, key: str, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """Run ``commands`` on the primary that owns ``key``'s slot, in one write on one of its connections.

    After a lost node, a moved slot or a cluster that is down it refreshes the topology as redis-py does, and
    sends the whole batch again (the store's writes are idempotent appends, or a session document whose version
    is checked).

    Returns:
        Their replies in order; a server error reply (``NOSCRIPT``...) is returned in its place as the exception.

    Raises:
        redis.exceptions.RedisError: the slot's primary could not be reached after a few attempts, each on the
            topology as the cluster told it after the last failure.
    """
    failures = redirections = 0
    asking: ClusterNode | None = None
    while True:
        node: ClusterNode | None = None
        try:
            await client.initialize()  # a no-op unless a failure below asked for the topology again
            node = asking or client.get_node_from_key(key)
            if node is None:  # pragma: no cover - get_node_from_key raises SlotNotCoveredError instead
                raise redis_errors.SlotNotCoveredError(f"no primary owns the slot of {key!r}")
            batch = [PipelineCommand(n, *command) for n, command in enumerate(commands)]
            if asking is not None:  # the slot is being migrated: its target takes it after ASKING, on this connection
                batch.insert(0, PipelineCommand(-1, "ASKING"))
            try:
                await node.execute_pipeline(batch)
            except AttributeError as exc:
                lost = _lost_if_closed_under(exc)
                if lost is exc:
                    raise
                raise lost from exc
            replies = [command.result for command in batch if command.position >= 0]
            first = replies[0]
            if isinstance(first, _TOPOLOGY_ERRORS):
                raise first
            if not isinstance(first, (redis_errors.MovedError, redis_errors.AskError)):
                return replies
        except _TOPOLOGY_ERRORS:
            if node is not None:
                node.update_active_connections_for_reconnect()
                await node.disconnect_free_connections()
                client.nodes_manager.move_node_to_end_of_cached_nodes(node.name)
            client._initialize = True  # what redis-py's own commands do: the next attempt reads the topology anew
            failures += 1
            if failures >= _ATTEMPTS:
                raise
            await asyncio.sleep(backoff(failures))
            asking = None
            continue
        redirections += 1
        if redirections > _REDIRECTIONS:
            raise redis_errors.ClusterError(f"the slot of {key!r} kept moving ({first}); try again")
        if isinstance(first, redis_errors.MovedError):
            asking = None
            await client.nodes_manager.move_slot(first)  # after a failover or a resharding: the slot's new owner
        else:
            asking = client.nodes_manager.get_node(host=first.host, port=first.port)
            if asking is None:
                client._initialize = True  # a node this client does not know yet: read the topology first
