"""Writes that wait for replicas: Redis ``WAIT`` sent right behind the write, on the write's own connection.

``WAIT numreplicas timeout`` blocks until that many replicas have every write *its connection* made, or the
timeout passes, and answers how many do. On another connection it would count that connection's writes, not
this one's, so the store sends the write and ``WAIT`` in one write on one connection: one round trip.

On a Redis Cluster that connection must be to the primary that owns the write's slot. redis-py's cluster
pipeline can aim both commands at that node, but when the connection fails it retries the batch without the
aim, and ``WAIT`` would then go to the default node (another connection, another node) and answer for nothing.
:func:`on_slot_owner` sends the batch to the slot's primary itself, and after a lost node, a moved slot or a
cluster that is down refreshes the topology as redis-py does, and sends the whole batch again (the store's
writes are idempotent appends, or a session document whose version is checked).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from chatkeep.core import ReplicationTimeoutError
from redis import exceptions as redis_errors
from redis.asyncio import RedisCluster
from redis.asyncio.cluster import ClusterNode, PipelineCommand

__all__ = ["check_replicas", "on_slot_owner"]

# A failover takes the cluster's node timeout and an election (seconds); a few quick attempts ride over a moved
# slot or a node that was just replaced, and a failover still under way fails the call (StoreUnavailableError),
# for the caller to retry.
_ATTEMPTS = 4
_BACKOFF_BASE = 0.05
_BACKOFF_CAP = 0.5
# The node is gone or the cluster is reorganizing: ask it where the slot is now, then try again.
_TOPOLOGY_ERRORS = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ClusterDownError,
    redis_errors.TryAgainError,
    redis_errors.SlotNotCoveredError,
)
_REDIRECTIONS = 16  # MOVED and ASK replies followed before giving up, as redis-py does for one command


async def on_slot_owner(client: RedisCluster, key: str, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """Run ``commands`` on the primary that owns ``key``'s slot, in one write on one of its connections.

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
                # redis-py closes a node's connections when another task refreshes the topology; a command then
                # finds its connection's writer gone (None) before anything was sent: a lost connection.
                raise redis_errors.ConnectionError(f"the connection to {node.name} was closed under this call") from exc
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
            await asyncio.sleep(min(_BACKOFF_CAP, _BACKOFF_BASE * 2**failures))
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


def check_replicas(acknowledged: Any, required: int, timeout_ms: int, *, where: str, what: str, retry: str) -> None:
    """Raise :class:`~chatkeep.core.ReplicationTimeoutError` when fewer than ``required`` replicas have the write.

    Args:
        acknowledged: ``WAIT``'s reply (how many replicas have the write).
        required: the store's ``wait_replicas``.
        timeout_ms: the store's ``wait_timeout_ms``.
        where: the server, for the message.
        what: what was written (``"append"``, ``"session document"``).
        retry: what the caller can safely do next.
    """
    got = int(acknowledged)
    if got >= required:
        return
    raise ReplicationTimeoutError(
        f"the {what} was stored on the Redis primary at {where}, but only {got} of {required} replicas confirmed it "
        f"within {timeout_ms} ms (wait_replicas={required}, wait_timeout_ms={timeout_ms}); the write itself is NOT "
        f"undone, and may be lost if the primary fails before a replica has it. {retry} If this keeps happening, "
        "check the replicas (INFO replication: connected_slaves, lag) or raise wait_timeout_ms",
        acknowledged=got,
        required=required,
        timeout_ms=timeout_ms,
    )
