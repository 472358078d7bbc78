"""What a backend keeps per event loop: :class:`PerLoop`, one driver client per running loop.

A driver's connections belong to the event loop that opened them (asyncpg, redis-py, aiohttp), so a store used
from several loops at once (an app's loop and a worker thread's ``asyncio.run``) gives each loop a client of
its own. A loop's client is made on the first call there and released when that loop shuts down
(``asyncio.run`` ending: the loop finishes its async generators, and a guard generator closes the client while
the loop still runs); ``aclose`` releases every loop's client: on the calling loop directly, on a loop running in
another thread by a call scheduled there, on a closed loop by dropping the client without its loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["PerLoop"]

T = TypeVar("T")

#: How long ``aclose`` waits for a client on a loop running in another thread to close (that loop may be busy).
_CLOSE_ELSEWHERE_S = 5.0


class PerLoop(Generic[T]):
    """A client per running event loop, made on first use there (see the module docstring).

    Args:
        make: makes a new client (called on the loop that will use it).
        close: closes a client on its own loop.
        abandon: releases a client whose loop is closed (or cannot run its close), without that loop.
        first: a client made already, for the first loop that asks (so a store's first loop costs nothing more).
    """

    def __init__(
        self,
        make: Callable[[], T],
        *,
        close: Callable[[T], Awaitable[object]],
        abandon: Callable[[T], None],
        first: T | None = None,
    ) -> None:
        self._make = make
        self._close = close
        self._abandon = abandon
        self._first = first
        self._clients: dict[asyncio.AbstractEventLoop, T] = {}
        self._guards: dict[asyncio.AbstractEventLoop, AsyncGenerator[None, None] | None] = {}
        self._lock = threading.Lock()  # loops in several threads add and drop clients

    def get(self) -> T:
        """The running loop's client (made on the first call on that loop).

        Raises:
            RuntimeError: no event loop is running.
        """
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._add(loop)
        return client

    def current(self) -> T | None:
        """The running loop's client, if it has one (without making one)."""
        return self._clients.get(asyncio.get_running_loop())

    def all(self) -> list[T]:
        """Every loop's client (for counters and descriptions)."""
        with self._lock:
            return list(self._clients.values())

    def _add(self, loop: asyncio.AbstractEventLoop) -> T:
        with self._lock:
            gone = [other for other in self._clients if other.is_closed()]
            dropped = [(self._clients.pop(other), self._guards.pop(other, None)) for other in gone]
            client = self._clients.get(loop)
            if client is None:
                client, self._first = (self._make() if self._first is None else self._first), None
                self._clients[loop] = client
                self._guards[loop] = self._watch(loop)
        for old, guard in dropped:  # their loops ended without finishing async generators (no asyncio.run)
            self._abandon(old)
            _finish(guard)
        return client

    def _watch(self, loop: asyncio.AbstractEventLoop) -> AsyncGenerator[None, None] | None:
        """Start a generator on ``loop`` whose ``finally`` closes its client when the loop shuts down.

        Not on a loop that finished its async generators already and runs on (the Agents SDK's ``run_sync`` keeps
        its loop for the next run): it would warn and never close it. That loop's client is closed by ``aclose``,
        or dropped once the loop is closed.
        """
        if asyncgens_shut_down(loop):
            return None

        async def guard() -> AsyncGenerator[None, None]:
            try:
                yield
            finally:
                with self._lock:
                    client = self._clients.pop(loop, None)
                    self._guards.pop(loop, None)
                if client is not None:
                    await self._close(client)

        generator = guard()
        # The first step registers the generator with the running loop (its first-iteration hook) and stops at
        # the yield without suspending: drive it here, where no await is possible.
        with contextlib.suppress(StopIteration):
            generator.__anext__().send(None)
        return generator

    async def aclose(self) -> None:
        """Release every loop's client (each once); the object stays usable and makes new ones."""
        here = asyncio.get_running_loop()
        with self._lock:
            clients, self._clients = self._clients, {}
            guards, self._guards = self._guards, {}
            first, self._first = self._first, None
        for guard in guards.values():
            _finish(guard)  # its client is taken: the guard's finally finds nothing to close
        if first is not None:
            await self._close(first)
        for loop, client in clients.items():
            if loop is here:
                await self._close(client)
            elif loop.is_closed():
                self._abandon(client)
            elif loop.is_running():
                await _close_on(loop, self._close, client, self._abandon)
            else:
                # Open but idle (a private loop between blocking calls): run the close on it from a thread.
                await asyncio.to_thread(_run_idle, loop, self._close, client, self._abandon)


def asyncgens_shut_down(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop.shutdown_asyncgens()`` has run: the loop no longer finishes async generators started on it.

    asyncio has no public way to ask, so this reads the flag CPython's ``BaseEventLoop`` sets there
    (``_asyncgens_shutdown_called``), here only; ``test_loops.py`` fails on a Python whose loops stop setting it.
    A loop without the flag (another implementation) counts as not shut down: a guard started on it after its
    shutdown only warns, and its client is closed by ``aclose`` or dropped once the loop is closed.
    """
    return getattr(loop, "_asyncgens_shutdown_called", False) is True


async def _close_on(
    loop: asyncio.AbstractEventLoop, close: Callable[[T], Awaitable[object]], client: T, abandon: Callable[[T], None]
) -> None:
    """Close ``client`` on ``loop``, running in another thread; bounded, since that loop may be busy."""

    async def run() -> None:
        await close(client)

    done = asyncio.run_coroutine_threadsafe(run(), loop)
    try:
        await asyncio.wait_for(asyncio.wrap_future(done), _CLOSE_ELSEWHERE_S)
    except Exception:
        done.cancel()
        if loop.is_closed():
            abandon(client)


def _run_idle(
    loop: asyncio.AbstractEventLoop, close: Callable[[T], Awaitable[object]], client: T, abandon: Callable[[T], None]
) -> None:
    async def run() -> None:
        await close(client)

    closing = run()
    try:
        loop.run_until_complete(closing)
    except RuntimeError:  # its thread started running it meanwhile, or closed it: nothing else can run there
        closing.close()
        abandon(client)


def _finish(guard: AsyncGenerator[None, None] | None) -> None:
    """End a guard generator without its loop (its client was taken, so its ``finally`` does not await)."""
    if guard is None:
        return
    with contextlib.suppress(StopIteration, RuntimeError):
        guard.aclose().send(None)
