"""PerLoop: a client per running event loop, closed when its loop shuts down, and what it relies on in asyncio."""

from __future__ import annotations

import asyncio

from chatkeep.core.backend._loops import PerLoop, asyncgens_shut_down


class _Clients:
    """Makes numbered clients and records which were closed on their loop and which were abandoned."""

    def __init__(self) -> None:
        self.made = 0
        self.closed: list[int] = []
        self.abandoned: list[int] = []

    def make(self) -> int:
        self.made += 1
        return self.made

    async def close(self, client: int) -> None:
        self.closed.append(client)

    def abandon(self, client: int) -> None:
        self.abandoned.append(client)

    def per_loop(self) -> PerLoop[int]:
        return PerLoop(self.make, close=self.close, abandon=self.abandon)


def test_asyncio_still_says_when_a_loop_has_shut_down_its_async_generators() -> None:
    """The one private flag PerLoop reads (asyncio has no public way to ask): fail here if Python changes it."""
    loop = asyncio.new_event_loop()
    try:
        assert "_asyncgens_shutdown_called" in vars(loop), (
            f"{type(loop).__name__} no longer has _asyncgens_shutdown_called: find another way for "
            "chatkeep.core.backend._loops.asyncgens_shut_down to tell a loop past shutdown_asyncgens()"
        )
        assert asyncgens_shut_down(loop) is False
        loop.run_until_complete(loop.shutdown_asyncgens())
        assert asyncgens_shut_down(loop) is True
    finally:
        loop.close()


def test_a_loop_ending_in_asyncio_run_closes_its_client_on_that_loop() -> None:
    clients = _Clients()
    per_loop = clients.per_loop()

    async def use() -> int:
        return per_loop.get()

    assert asyncio.run(use()) == 1
    assert clients.closed == [1]
    assert per_loop.all() == []


def test_a_loop_kept_running_after_shutdown_asyncgens_gets_a_client_without_a_warning() -> None:
    """The Agents SDK's run_sync: the loop shuts its async generators down after a run and runs the next one.

    A guard generator started there would warn (an error under this suite's filterwarnings) and never run its
    ``finally``; the client is closed by ``aclose`` instead.
    """
    clients = _Clients()
    per_loop = clients.per_loop()
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(loop.shutdown_asyncgens())

        async def use() -> int:
            return per_loop.get()

        assert loop.run_until_complete(use()) == 1
        assert loop.run_until_complete(use()) == 1  # the same client for the same loop
        loop.run_until_complete(per_loop.aclose())
        assert clients.closed == [1]
        assert clients.abandoned == []
    finally:
        loop.close()
