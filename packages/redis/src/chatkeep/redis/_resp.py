from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable, Sequence
from typing import Any, cast

from chatkeep.redis._transport import TransportName, bounded_greeting, retrying
from redis import exceptions as redis_errors

try:
    import hiredis
except ImportError:  # pragma: no cover - the resp transport needs hiredis; redis-py serves without it
    hiredis = None  # type: ignore[assignment]

# RESP encoding of a command, in C (hiredis's stub types the argument as a 1-tuple: it takes any tuple).
_pack = cast(Callable[[tuple[Any, ...]], bytes], getattr(hiredis, "pack_command", None))

__all__ = ["RespTransport", "release_socket", "resp_target"]

_URL_PARTS = {"host", "port", "path", "db", "username", "password"}


def _reply_error(text: str) -> Exception:
    if text.startswith("NOSCRIPT"):
        return redis_errors.NoScriptError(text)
    return redis_errors.ResponseError(text)


def resp_target(url: str) -> dict[str, Any]:
    """Where the transport connects for a driver URL (host, port or path, db, username, password).

    Raises:
        ValueError: the transport cannot serve this URL; the message says why (for the store's error).
    """
    if hiredis is None:
        raise ValueError('it needs hiredis: pip install "chatkeep-redis[hiredis]"')
    if not url.startswith(("redis://", "unix://")):
        raise ValueError("it speaks plain TCP or a Unix socket to a standalone server (not TLS nor Redis Cluster)")
    from redis.asyncio.connection import UnixDomainSocketConnection, parse_url

    try:
        kwargs = dict(parse_url(url))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"redis-py cannot read the URL: {exc}") from None
    if url.startswith("unix://") and (
        kwargs.pop("connection_class", None) is not UnixDomainSocketConnection or not kwargs.get("path")
    ):
        raise ValueError("the unix:// URL names no socket path")
    others = sorted(set(kwargs) - _URL_PARTS)
    if others:
        raise ValueError(f"the URL has redis-py options ({', '.join(others)}), which only redis-py implements")
    return kwargs


def release_socket(transport: asyncio.BaseTransport) -> None:
    """Close an asyncio transport's socket when its event loop is already closed (nothing warns of a leak later).

    ``close()`` marks the transport closing, then fails to schedule the rest on the closed loop, and no public
    call releases the socket without its loop: asyncio's own last step, ``_call_connection_lost``, does
    (``tests/test_driver_internals.py`` fails when Python changes it). The redis-py transport uses it too.
    """
    with contextlib.suppress(Exception):
        transport.close()
    with contextlib.suppress(Exception):
        transport._call_connection_lost(None)  # type: ignore[attr-defined]


class _Protocol(asyncio.Protocol):
    """Feeds received bytes to hiredis and resolves the oldest waiting future with each whole reply."""

    def __init__(self, owner: RespTransport) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.reader = hiredis.Reader(protocolError=redis_errors.InvalidResponse, replyError=_reply_error)
        self.pending: collections.deque[tuple[asyncio.Future[Any], asyncio.TimerHandle | None]] = collections.deque()
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.broken: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        pending = self.pending
        try:
            while (reply := reader.gets()) is not False:
                if not pending:
                    raise redis_errors.InvalidResponse("a reply came for no command")
                future, timer = pending.popleft()
                if timer is not None:
                    timer.cancel()
                if future.done():
                    continue  # a cancelled waiter: its reply is read and dropped
                if isinstance(reply, redis_errors.ResponseError):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)
        except redis_errors.InvalidResponse as exc:
            self.fail(redis_errors.ConnectionError(f"{self.owner.address} sent an invalid reply: {exc}"))

    def eof_received(self) -> bool:
        self.fail(redis_errors.ConnectionError(f"{self.owner.address} closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        error = redis_errors.ConnectionError(
            f"the connection to {self.owner.address} was lost" + (f": {exc}" if exc else "")
        )
        error.__cause__ = exc
        self.fail(error)
        if not self.lost.done():
            self.lost.set_result(None)

    def fail(self, error: BaseException) -> None:
        """Mark the connection broken, fail every waiting command with ``error`` and close the socket."""
        if self.broken is None:
            self.broken = error
        pending, self.pending = self.pending, collections.deque()
        for future, timer in pending:
            if timer is not None:
                timer.cancel()
            if not future.done():
                # One exception per waiter: a raised exception collects its raiser's traceback.
                copy = type(error)(*error.args)
                copy.__cause__ = error.__cause__
                future.set_exception(copy)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()

    def timed_out(self) -> None:
        self.fail(redis_errors.TimeoutError(f"Timeout reading from {self.owner.address}"))

    def send(self, commands: list[bytes], timeout: float) -> list[asyncio.Future[Any]]:
        """Write commands at once; returns a future per reply, each failing after ``timeout`` seconds."""
        if self.broken is not None or self.transport is None or self.transport.is_closing():
            raise redis_errors.ConnectionError(f"the connection to {self.owner.address} is closed")
        loop = asyncio.get_running_loop()
        futures = []
        deadline = loop.time() + timeout
        for _ in commands:
            future = loop.create_future()
            self.pending.append((future, loop.call_at(deadline, self.timed_out)))
            futures.append(future)
        self.transport.write(b"".join(commands) if len(commands) > 1 else commands[0])
        return futures


class RespTransport:
    """The ``resp`` transport: one pipelined connection to a standalone server (see the module's notes).

    It reconnects on the next command after a failure. Not thread-safe, like everything asyncio.
    """

    name: TransportName = "resp"
    cluster = False

    def __init__(self, target: dict[str, Any], *, address: str, socket_timeout: float, connect_timeout: float) -> None:
        self.target = target
        self.address = address
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Lock | None = None
        self.closed = False

    # -- commands ------------------------------------------------------------------------------

    async def call(self, *args: Any) -> Any:
        """Run one command and return its reply (a server error reply raises it)."""
        command = [_pack(args)]
        return await retrying(lambda: self._one(command))

    async def pipeline(self, commands: Sequence[Sequence[Any]], *, key: str | None = None) -> list[Any]:
        """Run commands sent in one write, so they follow each other on this connection; their replies in order.

        A server error reply is returned in its place as the exception (``NoScriptError``...); a failed
        connection raises. ``key`` changes nothing: a standalone server owns every key.
        """
        packed = [_pack(tuple(command)) for command in commands]
        return await retrying(lambda: self._replies(packed))

    def _one(self, command: list[bytes]) -> Any:
        """The awaitable reply of one packed command (a future when connected, else a coroutine connecting first)."""
        protocol = self._protocol
        if protocol is None or protocol.broken is not None:
            return self._connect_then_send(command)
        return protocol.send(command, self.socket_timeout)[0]

    async def _connect_then_send(self, command: list[bytes]) -> Any:
        protocol = await self._connected()
        return await protocol.send(command, self.socket_timeout)[0]

    async def _replies(self, commands: list[bytes]) -> list[Any]:
        protocol = await self._connected()
        replies = await asyncio.gather(*protocol.send(commands, self.socket_timeout), return_exceptions=True)
        for reply in replies:
            if isinstance(reply, BaseException) and not isinstance(reply, redis_errors.ResponseError):
                raise reply  # the connection failed (retried), not the command
        return replies

    # -- connection ----------------------------------------------------------------------------

    async def _connected(self) -> _Protocol:
        if self.closed:
            raise redis_errors.ConnectionError("the store is closed")
        protocol = self._protocol
        if protocol is not None and protocol.broken is None:
            return protocol
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            protocol = self._protocol
            if protocol is not None and protocol.broken is None:
                return protocol  # another caller connected while this one waited
            self._protocol = None
            if protocol is not None:
                await self._wait_lost(protocol)
            protocol = await self._connect()
            if self.closed:
                self._drop(protocol)
                raise redis_errors.ConnectionError("the store is closed")
            self._protocol = protocol
            return protocol

    async def _connect(self) -> _Protocol:
        """A new connection, logged in and answering, within ``connect_timeout`` as a whole."""
        protocol = _Protocol(self)
        try:
            await bounded_greeting(self._open(protocol), address=self.address, seconds=self.connect_timeout)
        except OSError as exc:
            self._drop(protocol)
            raise redis_errors.ConnectionError(f"Error connecting to {self.address}: {exc}") from exc
        except BaseException:
            self._drop(protocol)
            raise
        return protocol

    async def _open(self, protocol: _Protocol) -> None:
        """Connect ``protocol``, then log in, select the database or ping: a peer that never answers is found here."""
        loop = asyncio.get_running_loop()
        target = self.target
        if "path" in target:
            await loop.create_unix_connection(lambda: protocol, target["path"])
        else:
            host, port = target.get("host") or "localhost", int(target.get("port") or 6379)
            await loop.create_connection(lambda: protocol, host, port)
        greeted = False
        password = target.get("password")
        if password is not None:
            username = target.get("username")
            auth = ("AUTH", username, password) if username else ("AUTH", password)
            try:
                await protocol.send([_pack(auth)], self.connect_timeout)[0]
            except redis_errors.ResponseError as exc:
                raise redis_errors.AuthenticationError(f"{self.address} refused the password: {exc}") from exc
            greeted = True
        if int(target.get("db") or 0):
            await protocol.send([_pack(("SELECT", int(target["db"])))], self.connect_timeout)[0]
            greeted = True
        if not greeted:
            await protocol.send([_pack(("PING",))], self.connect_timeout)[0]

    @staticmethod
    def _drop(protocol: _Protocol) -> None:
        protocol.fail(redis_errors.ConnectionError("the connection was closed"))

    @staticmethod
    async def _wait_lost(protocol: _Protocol) -> None:
        """Let a failed connection finish closing its socket (bounded: it was aborted)."""
        if protocol.transport is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(protocol.lost), 1)

    async def aclose(self) -> None:
        """Close the connection; commands still waiting fail with ``ConnectionError``."""
        self.closed = True
        protocol, self._protocol = self._protocol, None
        if protocol is None:
            return
        protocol.fail(redis_errors.ConnectionError("the store was closed"))
        await self._wait_lost(protocol)

    def abandon(self) -> None:
        """Release the socket without its event loop (which is closed), so nothing warns of a leak later."""
        self.closed = True
        protocol, self._protocol = self._protocol, None
        if protocol is None or protocol.transport is None:
            return
        protocol.pending.clear()  # their loop is gone: nobody waits on them
        release_socket(protocol.transport)
