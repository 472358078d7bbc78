"""Faults on loopback for backend tests: a TCP proxy that cuts, refuses and black-holes, a silent peer, free ports.

Fault tests never stop a shared server: they put a :class:`LoopbackProxy` in front of it (or of a private
instance) and break the path instead. Nothing here imports pytest.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

__all__ = ["LoopbackProxy", "SilentPeer", "free_cluster_ports", "free_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (for a private server to take)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_cluster_ports(count: int) -> list[int]:
    """``count`` free loopback ports for a private Redis Cluster: each one's bus port (port + 10000) is free too."""
    chosen: list[int] = []
    while len(chosen) < count:
        port = free_port()
        taken = {q + d for q in chosen for d in (0, 10000)}
        if port + 10000 < 65536 and _bindable(port + 10000) and not {port, port + 10000} & taken:
            chosen.append(port)
    return chosen


class SilentPeer:
    """A listener on 127.0.0.1 that accepts TCP connections and never sends a byte.

    It stands for a wrong port, a stuck server or a proxy with no backend: a client's connect succeeds, then
    the greeting (or the answer) never comes. Use it as ``async with SilentPeer() as peer:`` and point the
    client at :attr:`address`.
    """

    def __init__(self) -> None:
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    @property
    def address(self) -> str:
        """``host:port`` to connect to."""
        return f"127.0.0.1:{self.port}"

    async def start(self) -> int:
        """Listen on a free loopback port; returns it (also :attr:`port`)."""

        async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._writers.append(writer)  # kept open, never written to

        self._server = await asyncio.start_server(hold, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def aclose(self) -> None:
        """Close the connections it holds and stop listening."""
        for writer in self._writers:
            writer.close()
        self._writers.clear()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def __aenter__(self) -> SilentPeer:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()


class LoopbackProxy:
    """A TCP proxy on 127.0.0.1 in front of a server, with three faults to inject.

    * :attr:`blackhole`: while true, the server's replies are dropped (it did the work; the client never hears).
    * :meth:`cut`: close every connection through the proxy; new ones are accepted.
    * :meth:`down`: reset every connection and refuse new ones, as a server that went away; :meth:`restore`
      undoes it (and the black hole).

    Args:
        upstream_port: the server's port.
        upstream_host: the server's host (loopback by default).
    """

    def __init__(self, upstream_port: int, *, upstream_host: str = "127.0.0.1") -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.blackhole = False
        self.port = 0
        self._refusing = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        """Listen on a free loopback port; returns it (also :attr:`port`)."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            client_writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except OSError:
            client_writer.transport.abort()
            return
        self._writers |= {client_writer, up_writer}
        for task in (
            asyncio.create_task(self._pipe(client_reader, up_writer, replies=False)),
            asyncio.create_task(self._pipe(up_reader, client_writer, replies=True)),
        ):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, replies: bool) -> None:
        try:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await reader.read(65536):
                    if replies and self.blackhole:
                        continue  # the server did the work; the client never hears of it
                    writer.write(data)
                    await writer.drain()
        finally:
            writer.close()
            self._writers.discard(writer)

    def cut(self) -> None:
        """Close every connection through the proxy (new ones are accepted)."""
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    def down(self) -> None:
        """Reset every connection and refuse new ones until :meth:`restore`."""
        self._refusing = True
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def restore(self) -> None:
        """Accept connections again and let replies through."""
        self._refusing = False
        self.blackhole = False

    async def aclose(self) -> None:
        """Close every connection and stop listening."""
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
