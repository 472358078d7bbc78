"""``finish_if_cancelled``: a cancelled caller's write ends (rolled back if it can) before the cancellation is seen.

An async caller's write runs as a task of its own, shielded; a blocking call of a sync view runs it in the call's
own task, and Ctrl-C (simulated here by a loop callback raising KeyboardInterrupt, as Python's handler does)
waits for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from chatkeep.core._loop_thread import LoopThread
from chatkeep.core.backend import finish_if_cancelled


class FakeWrite:
    """A write that commits at its end unless told to roll back, and records what it saw."""

    def __init__(self) -> None:
        self.rolled_back = False
        self.outcome: str | None = None
        self.tasks_seen: int | None = None
        self.go_on: asyncio.Future[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.sent = asyncio.Event()

    def roll_back(self) -> None:
        self.rolled_back = True

    async def run(self, *, fail: bool = False) -> str:
        loop = self.loop = asyncio.get_running_loop()
        self.tasks_seen = len(asyncio.all_tasks())
        self.go_on = loop.create_future()
        self.sent.set()
        try:
            await self.go_on  # the server's answer
        except asyncio.CancelledError:
            self.outcome = "cut short"
            raise
        self.outcome = "rolled back" if self.rolled_back else "committed"
        if fail:
            raise ValueError("the write failed")
        return self.outcome


def ctrl_c() -> None:
    raise KeyboardInterrupt


async def test_a_cancelled_async_caller_sees_its_cancellation_only_once_the_write_ended() -> None:
    write = FakeWrite()
    tasks_before = len(asyncio.all_tasks())
    caller = asyncio.ensure_future(finish_if_cancelled(write.run(fail=True), write.roll_back))
    await write.sent.wait()
    caller.cancel()
    for _ in range(3):
        await asyncio.sleep(0)
    assert write.rolled_back
    assert not caller.done(), "the caller was let go before its write ended"
    caller.cancel()  # cancelled again: still waits
    await asyncio.sleep(0)
    assert not caller.done()
    write.go_on.set_result(None)
    with pytest.raises(asyncio.CancelledError):
        await caller  # the write's own error is dropped: the caller is told of its cancellation
    assert write.outcome == "rolled back"
    assert write.tasks_seen == tasks_before + 2, "an async caller's write runs as a task of its own"


async def test_an_async_callers_write_that_is_not_cancelled_returns_or_raises_as_it_is() -> None:
    write = FakeWrite()
    caller = asyncio.ensure_future(finish_if_cancelled(write.run(), write.roll_back))
    await write.sent.wait()
    write.go_on.set_result(None)
    assert await caller == "committed"
    failing = FakeWrite()
    caller = asyncio.ensure_future(finish_if_cancelled(failing.run(fail=True)))
    await failing.sent.wait()
    failing.go_on.set_result(None)
    with pytest.raises(ValueError, match="the write failed"):
        await caller


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    """A sync view's kind of loop: a blocking call runs it in the caller's thread, in_blocking_call() there."""
    loop_thread = LoopThread("chatkeep-test-finish", caller_may_block=True)
    yield loop_thread
    loop_thread.stop()


async def tasks_left() -> int:
    return len(asyncio.all_tasks())


def test_a_blocking_calls_write_runs_in_the_calls_own_task(loop_thread: LoopThread) -> None:
    write = FakeWrite()

    async def call() -> str:
        answer = asyncio.get_running_loop().call_soon  # the answer arrives on the next turn
        pending = finish_if_cancelled(write.run(), write.roll_back)
        answer(lambda: write.go_on.set_result(None))  # type: ignore[union-attr]
        return await pending

    assert loop_thread.run(call()) == "committed"
    assert write.tasks_seen == 1, "a blocking call's write made a task of its own"
    failing = FakeWrite()

    async def failing_call() -> str:
        asyncio.get_running_loop().call_soon(lambda: failing.go_on.set_result(None))  # type: ignore[union-attr]
        return await finish_if_cancelled(failing.run(fail=True))

    with pytest.raises(ValueError, match="the write failed"):  # not cancelled: its error is raised as it is
        loop_thread.run(failing_call())


def test_ctrl_c_in_a_blocking_call_lets_its_write_end_rolled_back_then_interrupts(loop_thread: LoopThread) -> None:
    write = FakeWrite()
    after_the_write: list[str] = []

    async def call() -> str:
        loop = asyncio.get_running_loop()
        loop.call_soon(ctrl_c)  # Ctrl-C while the write waits for its answer...
        loop.call_soon(lambda: write.go_on.set_result(None))  # type: ignore[union-attr]  # ...which then arrives
        result = await finish_if_cancelled(write.run(), write.roll_back)
        after_the_write.append(result)  # the interrupted call goes no further
        await asyncio.sleep(0)
        return result

    with pytest.raises(KeyboardInterrupt):
        loop_thread.run(call())
    assert write.rolled_back, "Ctrl-C did not tell the write to roll back"
    assert write.outcome == "rolled back", "the write was cut short instead of ending"
    assert after_the_write == []
    assert write.tasks_seen == 1
    assert loop_thread.run(tasks_left()) == 1, "the interrupted call left a task running"


def test_a_second_ctrl_c_cuts_the_write_short(loop_thread: LoopThread) -> None:
    write = FakeWrite()

    def roll_back_and_press_again() -> None:
        write.roll_back()  # (called as Ctrl-C left the loop: no loop runs here)
        write.loop.call_soon(ctrl_c)  # type: ignore[union-attr]  # impatient: Ctrl-C again while the write ends

    async def call() -> str:
        asyncio.get_running_loop().call_soon(ctrl_c)
        return await finish_if_cancelled(write.run(), roll_back_and_press_again)  # its answer never arrives

    with pytest.raises(KeyboardInterrupt):
        loop_thread.run(call())
    assert write.rolled_back
    assert write.outcome == "cut short"
    assert loop_thread.run(tasks_left()) == 1, "the interrupted call left a task running"


def test_ctrl_c_between_writes_cancels_the_call_at_once(loop_thread: LoopThread) -> None:
    write = FakeWrite()

    async def call() -> str:
        asyncio.get_running_loop().call_soon(ctrl_c)
        await asyncio.get_running_loop().create_future()  # not a write: nothing to wait for
        return await finish_if_cancelled(write.run(), write.roll_back)

    with pytest.raises(KeyboardInterrupt):
        loop_thread.run(call())
    assert write.outcome is None
    assert not write.rolled_back
