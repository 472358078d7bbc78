"""The loopback proxy's faults, against a tiny echo server: pass-through, black hole, cut, down and restore."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from chatkeep.testing.faults import LoopbackProxy, free_port


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
    writer.close()


@pytest_asyncio.fixture(loop_scope="function")
async def proxy() -> AsyncIterator[LoopbackProxy]:
    server = await asyncio.start_server(_echo, "127.0.0.1", free_port())
    proxy = LoopbackProxy(server.sockets[0].getsockname()[1])
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.aclose()
        server.close()
        await server.wait_closed()


async def _round_trip(port: int, payload: bytes = b"ping", timeout: float = 1.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.read(1024), timeout)
    finally:
        writer.close()


async def test_passes_bytes_both_ways(proxy: LoopbackProxy) -> None:
    assert await _round_trip(proxy.port) == b"ping"


async def test_black_hole_swallows_replies_until_restored(proxy: LoopbackProxy) -> None:
    proxy.blackhole = True
    with pytest.raises(asyncio.TimeoutError):
        await _round_trip(proxy.port, timeout=0.3)
    proxy.restore()
    assert await _round_trip(proxy.port) == b"ping"


async def test_cut_closes_open_connections_and_accepts_new_ones(proxy: LoopbackProxy) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"x")
    await writer.drain()
    assert await reader.read(1) == b"x"
    proxy.cut()
    assert await asyncio.wait_for(reader.read(1), 1) == b""  # the open connection is closed
    writer.close()
    assert await _round_trip(proxy.port) == b"ping"


async def _answers(port: int) -> bool:
    try:
        return await _round_trip(port) == b"ping"
    except (OSError, asyncio.TimeoutError):
        return False


async def test_down_refuses_new_connections_until_restored(proxy: LoopbackProxy) -> None:
    proxy.down()
    assert not await _answers(proxy.port)
    proxy.restore()
    assert await _answers(proxy.port)
