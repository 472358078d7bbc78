"""Writes that wait for replicas: Redis ``WAIT`` sent right behind the write, on the write's own connection.

``WAIT numreplicas timeout`` blocks until that many replicas have every write *its connection* made, or the
timeout passes, and answers how many do. On another connection it would count that connection's writes, not
this one's, so the store sends the write and ``WAIT`` in one pipeline on one connection (on a Redis Cluster,
to the primary that owns the write's slot: ``RedisTransport.pipeline(..., key=...)``): one round trip.
"""

from __future__ import annotations

from typing import Any

from chatkeep.core import ReplicationTimeoutError

__all__ = ["check_replicas"]


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
