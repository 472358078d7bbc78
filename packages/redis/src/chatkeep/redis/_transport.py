"""The seam between the store's logic and a Redis driver: what a transport does, and the retry every one shares.

The store (:mod:`chatkeep.redis._store`) holds every rule: the scripts, the key layout, the ``EVALSHA`` to ``EVAL``
fallback, ``WAIT`` for replicas and the translation of errors. A transport only carries commands to the server
and their replies back. There are two: :mod:`chatkeep.redis._resp` (the store's own pipelined asyncio connection
with hiredis, standalone servers) and :mod:`chatkeep.redis._redispy` (redis-py, standalone and Redis Cluster).

Errors are redis-py's exception classes (``redis.exceptions``, a dependency of the package either way), so the
store translates them once: ``ConnectionError`` or ``TimeoutError`` when the command may not have reached the
server or its reply did not come back, ``ResponseError`` (``NoScriptError`` for ``NOSCRIPT``) for a server's
error reply.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, Protocol, TypeVar

from chatkeep.core.backend import record_retry
from redis import exceptions as redis_errors

__all__ = [
    "RETRIES",
    "TRANSPORTS",
    "ConnectTimeoutError",
    "RedisTransport",
    "TransportName",
    "backoff",
    "bounded_greeting",
    "retrying",
]

T = TypeVar("T")

TransportName = Literal["resp", "redis-py"]
#: The transports, fastest first (the store's default is the first one that supports the URL).
TRANSPORTS: tuple[TransportName, ...] = ("resp", "redis-py")

#: A command that failed on its connection (not on the server) is sent again this many times, on a new connection.
RETRIES = 2
_BACKOFF_BASE = 0.05
_BACKOFF_CAP = 0.5


class ConnectTimeoutError(redis_errors.TimeoutError):
    """A new connection did not open and answer its greeting within ``connect_timeout`` seconds.

    Attributes:
        seconds: the ``connect_timeout`` that passed.
    """

    def __init__(self, address: str, seconds: float) -> None:
        super().__init__(f"{address} did not answer a new connection's greeting within {seconds:g} s")
        self.seconds = seconds


async def bounded_greeting(greet: Awaitable[T], *, address: str, seconds: float) -> T:
    """``greet`` (open a connection and exchange a first command), bounded as a whole by ``seconds``.

    A driver's own connect timeout covers the TCP connect only; a peer that accepts and never answers (a wrong
    port, a stuck server, a black-holed proxy) would then hold the first command for the socket timeout, once per
    retry. Any timeout while greeting is reported as :class:`ConnectTimeoutError`.
    """
    try:
        return await asyncio.wait_for(greet, seconds)
    except (asyncio.TimeoutError, redis_errors.TimeoutError) as exc:
        raise ConnectTimeoutError(address, seconds) from exc


class RedisTransport(Protocol):
    """What the store needs from a driver: commands, commands in one write, closing.

    A transport belongs to the event loop it was first used on; the store replaces it when its loop changes.
    """

    #: The transport's name, as the ``transport`` option takes it.
    name: TransportName
    #: The server is a Redis Cluster: a session's keys and its tenant's index live on different nodes.
    cluster: bool

    async def call(self, *args: Any) -> Any:
        """Run one command and return its reply; a server error reply raises it (``ResponseError``)."""
        ...

    async def pipeline(self, commands: Sequence[Sequence[Any]], *, key: str | None = None) -> list[Any]:
        """Run commands sent in one write on one connection; their replies in order.

        A server error reply is returned in its place as the exception; a failed connection raises. With ``key``,
        on a cluster, the connection is to the primary that owns ``key``'s slot (what ``WAIT`` after a write needs).
        """
        ...

    async def aclose(self) -> None:
        """Release the connections this transport opened (a client handed to the store stays open)."""
        ...

    def abandon(self) -> None:
        """Release the sockets without their event loop, which is closed (nothing may warn of a leak later)."""
        ...


def backoff(failures: int) -> float:
    """Seconds to wait before the next attempt: exponential from 50 ms, capped at 0.5 s, with equal jitter.

    The jitter keeps many clients cut off by the same failure from all coming back in the same instant.
    """
    ceiling: float = min(_BACKOFF_CAP, _BACKOFF_BASE * 2.0**failures)
    return ceiling / 2 + random.random() * ceiling / 2


async def retrying(send: Callable[[], Awaitable[T]], *, retries: int = RETRIES) -> T:
    """``send()``, again after a back-off when it failed on its connection (at most ``retries`` more times).

    Only what is safe to repeat is sent through here: the store's commands are reads, or scripts that are
    idempotent (appends by message id) or answer a retry as the first attempt (a pop's receipt). A refused
    password is not retried: it stays wrong. Nor is a timeout: it already took the whole deadline the store was
    given (``connect_timeout`` or ``socket_timeout``), and a retry would multiply it.
    """
    failures = 0
    while True:
        try:
            return await send()
        except (redis_errors.AuthenticationError, redis_errors.TimeoutError):
            raise
        except redis_errors.ConnectionError:
            failures += 1
            if failures > retries:
                raise
            record_retry("connection failed")
            await asyncio.sleep(backoff(failures))
