"""The private event loop that blocking callers run coroutines on: :class:`LoopThread`.

One async implementation serves both worlds: a blocking call (``SyncHistoryStore``, ``Agent.run_sync``) runs the
async one on a private event loop and waits for its result. A store's connections belong to one event loop, so
every call of one owner, from however many threads, runs on that one loop; and a call works even from a thread
whose own loop is running (a notebook cell), because it never runs on the caller's loop.

Who runs the private loop: a blocking call made from a thread without a running event loop, while no other call
is running the loop, runs it right there in its own thread (no handover to another thread, which costs about
0.1 ms a call on a small machine, as much as a Redis round trip). Every other call (the loop is busy with
another call, the caller's own loop is running, or an async caller awaits it through ``submit``) is handed to
the loop as a task; the thread running it keeps running it until the handed calls are done, and a helper thread
runs it when no caller does. So calls from several threads at once still run concurrently, as tasks of one loop.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import threading
import time
import weakref
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from chatkeep.core._errors import SyncCallError

if TYPE_CHECKING:
    from chatkeep.core._finishing import Write

__all__ = ["LoopThread", "in_blocking_call", "run_in_place"]

T = TypeVar("T")

#: In the task of a blocking call that runs the private loop in the caller's own thread (``_Drive.drive``), for a
#: loop made with ``caller_may_block``: that loop's drive; every other task (a handed call, an async caller's)
#: sees None.
_BLOCKING_CALL: contextvars.ContextVar[_Drive | None] = contextvars.ContextVar("chatkeep_blocking_call", default=None)


def in_blocking_call() -> bool:
    """Whether the running code is a blocking call's own, run by a store's sync view in the caller's thread.

    The caller waits for it in any case, and no application's event loop runs there: a short blocking operation
    (a SQLite statement) may run there with :func:`run_in_place`, holding up only that caller and the calls other
    threads hand to the loop meanwhile (which wait their turn), instead of hopping to a worker thread and back.
    """
    return _pausable_drive() is not None


def _pausable_drive() -> _Drive | None:
    """The drive of the blocking call running here, while it may pause its loop for :func:`run_in_place`."""
    drive = _BLOCKING_CALL.get()
    return drive if drive is not None and drive.pausable and drive.driver == threading.get_ident() else None


async def run_in_place(function: Callable[[], T]) -> T:
    """Run a blocking ``function`` in the thread of a blocking call (:func:`in_blocking_call`), with the loop paused.

    The loop stops, ``function`` runs in the caller's thread while no event loop runs there (so blocking-call
    guards such as blockbuster, which refuse blocking calls made while a loop runs, see none), then the loop goes
    on. It runs in the calling task's context.

    Raises:
        RuntimeError: not in a blocking call (check :func:`in_blocking_call` first).
    """
    drive = _pausable_drive()
    if drive is None:
        raise RuntimeError("run_in_place is for the blocking call of a sync view; check in_blocking_call() first")
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()
    drive.paused.append((contextvars.copy_context(), function, done))
    loop.stop()  # run_forever returns after this turn of the loop; drive() runs the function, then the loop again
    return await done


#: A loop nobody ran for this long first handles what arrived meanwhile (a server closing an idle
#: connection, a due timer) before it runs a call, as a loop that never stopped would have.
_SETTLE_AFTER_S = 0.5


class _Drive:
    """The private loop and who runs it now; shared with the helper thread, which must not keep its owner alive."""

    def __init__(self, name: str, *, caller_may_block: bool = False) -> None:
        self.name = name
        self.caller_may_block = caller_may_block  # mark a driving caller's task (in_blocking_call)
        self.pausable = False  # drive() runs the loop in its caller's thread and runs what run_in_place asks
        self.paused: collections.deque[tuple[contextvars.Context, Callable[[], Any], asyncio.Future[Any]]] = (
            collections.deque()
        )
        self.call: asyncio.Task[Any] | None = None  # the task of the blocking call that drive() runs now
        self.writes: list[Write] = []  # the call's writes in flight (finish_if_cancelled), Ctrl-C waits for them
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # the driver, the handed calls or the state changed
        self.loop: asyncio.AbstractEventLoop | None = None
        self.driver: int | None = None  # the thread running the loop now; None while nobody does
        self.handed: set[object] = set()  # a token per call handed to the loop whose task has not ended
        self.all_ended: asyncio.Future[None] | None = None  # set on the loop when the last handed call ends
        self.helper: threading.Thread | None = None
        self.stopping = False  # new calls are refused
        self.finished = False  # the loop is closed; the helper thread exits
        self.idle_since = time.monotonic()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        """The loop, made on first use (the caller holds the lock)."""
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
        return self.loop

    def in_driver_thread(self) -> bool:
        return self.driver == threading.get_ident()

    def try_claim(self) -> bool:
        """Become the loop's driver, if nobody drives it and this thread can (it runs no loop of its own).

        The caller holds the lock.
        """
        if self.driver is not None or _loop_running_here():
            return False
        self.get_loop()
        self.driver = threading.get_ident()
        return True

    def hand(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; the driver runs it, or the helper thread when nobody drives.

        The call counts as handed until its task on the loop has ended, not merely until its future is done: a
        cancelled caller's future is done at once, and the loop must still run the cancellation to its end.
        """
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        token = object()
        with self.lock:
            loop = self.get_loop()
            self.handed.add(token)
            loop.call_soon_threadsafe(self._start, loop, coro, future, token)
            if self.driver is None:
                self._wake_helper()
        return future

    def _start(
        self,
        loop: asyncio.AbstractEventLoop,
        coro: Coroutine[Any, Any, T],
        future: concurrent.futures.Future[T],
        token: object,
    ) -> None:
        """On the loop: run a handed call as a task whose end settles its future and ends its handing."""
        if future.cancelled():  # cancelled before it started
            coro.close()
            self._ended(token)
            return
        task = loop.create_task(coro)

        def settle(task: asyncio.Task[T]) -> None:
            with contextlib.suppress(concurrent.futures.InvalidStateError):  # the caller cancelled meanwhile
                if task.cancelled():
                    future.cancel()
                elif (error := task.exception()) is not None:
                    future.set_exception(error)
                else:
                    future.set_result(task.result())
            self._ended(token)

        def cancel_task(future: concurrent.futures.Future[T]) -> None:
            if future.cancelled():
                with contextlib.suppress(RuntimeError):  # the loop is closed: the task ended with it
                    loop.call_soon_threadsafe(task.cancel)

        task.add_done_callback(settle)
        future.add_done_callback(cancel_task)

    def _ended(self, token: object) -> None:
        """On the loop: a handed call's task ended (or never started)."""
        with self.lock:
            self.handed.discard(token)
            if not self.handed and self.all_ended is not None and not self.all_ended.done():
                self.all_ended.set_result(None)
            self.changed.notify_all()

    def _wake_helper(self) -> None:
        if self.helper is None:
            self.helper = threading.Thread(target=_help, args=(self,), name=self.name, daemon=True)
            self.helper.start()
        self.changed.notify_all()

    def drive(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop in this thread (its driver, by :meth:`try_claim`), then hand the loop back."""
        loop = self.loop
        assert loop is not None
        try:
            if time.monotonic() - self.idle_since > _SETTLE_AFTER_S:
                loop.run_until_complete(_settle())
            marked = _BLOCKING_CALL.set(self) if self.caller_may_block else None
            try:
                task = loop.create_task(_then_stop(loop, coro))  # the task keeps the context it was made in
            finally:
                if marked is not None:
                    _BLOCKING_CALL.reset(marked)
            self.pausable, self.call = True, task
            try:
                while not task.done():  # (a coroutine of the call, or run_in_place, may have stopped the loop)
                    loop.run_forever()
                    self._run_paused()
            except BaseException:
                self.pausable = False  # the cancelled call's last steps hop to the worker threads again
                if not task.done():  # interrupted (Ctrl-C): cancel the call rather than leave it half done
                    self.interrupt(task)
                    for _ in (0, 1):  # a second Ctrl-C cancels the call at once; a third stops waiting
                        with contextlib.suppress(BaseException):  # (the call's outcome: Ctrl-C is raised instead)
                            loop.run_until_complete(task)
                        if task.done():
                            break
                        task.cancel()
                raise
            finally:
                self.pausable, self.call = False, None
                self._run_paused()  # asked in the call's last turn of the loop, by a task it left running
            return task.result()
        finally:
            self.release()

    def interrupt(self, task: asyncio.Task[Any]) -> None:
        """Ctrl-C stopped the call: its writes in flight roll back and end first (the last cancels it), or cancel it."""
        if not self.writes:
            task.cancel()
            return
        for write in self.writes:
            write.interrupted = True
            if write.on_cancel is not None:
                write.on_cancel()

    def _run_paused(self) -> None:
        """Run what :func:`run_in_place` asked for, in this thread while the loop is stopped, and set its results."""
        while self.paused:
            context, function, done = self.paused.popleft()
            if done.cancelled():
                continue
            try:
                result = context.run(function)
            except Exception as exc:
                done.set_exception(exc)
            except BaseException:  # Ctrl-C: drive() cancels the call; what else was asked is cancelled with it
                done.cancel()
                for _, _, other in self.paused:
                    other.cancel()
                self.paused.clear()
                raise
            else:
                done.set_result(result)

    def release(self) -> None:
        """Run the loop until every handed call has ended, then stop driving it (this thread is the driver)."""
        loop = self.loop
        assert loop is not None
        try:
            while True:
                with self.lock:
                    if not self.handed:
                        self.driver, self.idle_since = None, time.monotonic()
                        self.changed.notify_all()
                        return
                    # A future, not a task: stop()'s last coroutine cancels the loop's tasks, never this wait.
                    self.all_ended = loop.create_future()
                loop.run_until_complete(self.all_ended)
        except BaseException:
            with self.lock:  # interrupted: the helper thread takes over what is still handed
                self.driver = None
                if self.handed:
                    self._wake_helper()
                self.changed.notify_all()
            raise

    def wait_idle(self) -> None:
        """Wait until nobody drives the loop and no handed call is left (the caller holds the lock)."""
        while self.driver is not None or self.handed:
            self.changed.wait()

    def finish(self) -> None:
        """Close the loop and let the helper thread end (nobody drives it; the caller holds the lock)."""
        self.finished = True
        self.changed.notify_all()
        if self.loop is not None and not self.loop.is_closed():
            self.loop.close()


def _help(drive: _Drive) -> None:
    """The helper thread: drives the loop whenever calls are handed to it and no caller drives it."""
    while True:
        with drive.lock:
            while not drive.finished and not (drive.handed and drive.driver is None):
                drive.changed.wait()
            if drive.finished:
                return
            drive.driver = threading.get_ident()
        drive.release()


def _abandon(drive: _Drive) -> None:
    """The owner was dropped without :meth:`LoopThread.stop`: end the helper thread and close an idle loop."""
    with drive.lock:
        drive.stopping = True
        if drive.driver is None and not drive.handed:
            drive.finish()
        else:
            drive.finished = True  # the helper ends after this; the loop is left to the collector
            drive.changed.notify_all()


async def _then_stop(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """``coro``, then stop the loop in the same step: ``run_forever`` returns without another turn of the loop.

    (``run_until_complete`` learns that its task ended from a callback, which costs one more turn, a ``select``.)
    A task cancelled before its first step would never get here; nothing cancels it that early: it is made and run
    by the same ``drive``, and only :meth:`LoopThread.stop`'s last coroutine cancels the loop's tasks, when no call
    runs.
    """
    try:
        return await coro
    finally:
        loop.stop()


async def _settle() -> None:
    # Two turns of the loop: the I/O that arrived while nobody ran it is read, and what that schedules runs.
    await asyncio.sleep(0)
    await asyncio.sleep(0)


def _loop_running_here() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def _final(loop: asyncio.AbstractEventLoop, last: Coroutine[Any, Any, object] | None) -> None:
    """``last``, then what ``asyncio.run`` does at its end: cancel the leftovers, finish async generators."""
    try:
        if last is not None:
            await last
    finally:
        current = asyncio.current_task()
        leftovers = [task for task in asyncio.all_tasks() if task is not current]
        for task in leftovers:
            task.cancel()
        await asyncio.gather(*leftovers, return_exceptions=True)
        await loop.shutdown_asyncgens()
        await loop.shutdown_default_executor()


class LoopThread:
    """A private event loop that blocking callers from any thread run coroutines on.

    A blocking call from a thread without a running loop runs the loop in that thread while no other call does;
    other calls are handed to the loop, and a helper thread (started on the first such call) runs it when no
    caller does. Calls made from several threads at once run concurrently, as tasks of that one loop.

    Args:
        name: the helper thread's name (shown in thread dumps and in error messages).
        stopped_error: builds the error a call made after :meth:`stop` raises (default: :class:`SyncCallError`).
        caller_may_block: a blocking call that runs the loop in its own thread may block it
            (:func:`in_blocking_call` is true there): set for a store's sync view, whose calls are store
            operations; not for an agent's run, whose concurrent tasks (a streamed answer) must keep moving.
    """

    def __init__(
        self, name: str, *, stopped_error: Callable[[], Exception] | None = None, caller_may_block: bool = False
    ) -> None:
        self.name = name
        self._stopped_error = stopped_error or self._default_stopped_error
        self._drive = _Drive(name, caller_may_block=caller_may_block)
        # Dropped without stop() (say, an agent made per request and never closed): end its thread with it.
        weakref.finalize(self, _abandon, self._drive).atexit = False

    def __repr__(self) -> str:
        state = "stopped" if self.stopped else "running" if self.started else "not started"
        return f"<LoopThread {self.name!r} {state}>"

    def _default_stopped_error(self) -> Exception:
        return SyncCallError(
            f"the event loop {self.name!r} was stopped (its owner was closed) as this call was made; "
            "Agent.run_sync starts a new one when called again"
        )

    @property
    def started(self) -> bool:
        """Whether the loop was made (by a call, or by :meth:`stop` running its last coroutine)."""
        return self._drive.loop is not None

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._drive.stopping

    def in_loop_thread(self) -> bool:
        """Whether the calling code runs on this loop (where a blocking call would wait on itself)."""
        return self._drive.in_driver_thread()

    def _refuse_on_the_loop(self, coro: Coroutine[Any, Any, object] | None) -> None:
        """Raise :class:`SyncCallError` (closing ``coro``) when called from code this loop runs: it would hang."""
        if self._drive.in_driver_thread():
            if coro is not None:
                coro.close()
            raise self._deadlock_error()

    def _deadlock_error(self) -> SyncCallError:
        return SyncCallError(
            f"a blocking call was made from code running on the event loop {self.name!r} that would run it, so it "
            "could never return; code running there (a coroutine or tool of the running call) must use the async "
            "API instead: await store.load(...) rather than the sync view, await agent.run(...) rather than run_sync"
        )

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop and return its future without waiting.

        Raises:
            Exception: the ``stopped_error`` when :meth:`stop` was called.
        """
        drive = self._drive
        with drive.lock:
            if drive.stopping:
                coro.close()
                raise self._stopped_error()
            return drive.hand(coro)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result; its exception is raised here as it is.

        Raises:
            SyncCallError: called from code running on the loop itself.
        """
        drive = self._drive
        self._refuse_on_the_loop(coro)
        with drive.lock:
            if drive.stopping:
                coro.close()
                raise self._stopped_error()
            future = None if drive.try_claim() else drive.hand(coro)
        if future is None:
            return drive.drive(coro)
        try:
            return future.result()
        except BaseException:
            # Interrupted (Ctrl-C in a notebook): cancel the call rather than leave it running unseen.
            future.cancel()
            raise

    def stop(self, last: Coroutine[Any, Any, object] | None = None) -> None:
        """Refuse new calls, let the calls in flight finish, run ``last`` on the loop, then close it.

        Safe to call more than once (``last`` runs only on the first call). An error of ``last`` is raised
        after the loop closed.

        Raises:
            SyncCallError: called from code running on the loop itself.
        """
        drive = self._drive
        self._refuse_on_the_loop(last)
        with drive.lock:
            first, drive.stopping = not drive.stopping, True
            if not first:
                if last is not None:
                    last.close()
                while not drive.finished:
                    drive.changed.wait()
                return
            drive.wait_idle()
            if drive.loop is None and last is None:
                drive.finish()  # never used: nothing to run or close
                return
            loop = drive.get_loop()
            inline = drive.try_claim()
            future = None if inline else drive.hand(_final(loop, last))
        try:
            if future is None:
                drive.drive(_final(loop, last))
            else:
                future.result()
        finally:
            with drive.lock:
                drive.wait_idle()
                drive.finish()
            helper = drive.helper
            if helper is not None and helper is not threading.current_thread():
                helper.join()

    async def astop(self, last: Coroutine[Any, Any, object] | None = None) -> None:
        """:meth:`stop` for async code: ``last`` runs on the private loop if it was made, else here."""
        drive = self._drive
        self._refuse_on_the_loop(last)
        with drive.lock:
            started = drive.loop is not None
            if not started:
                drive.stopping = True
                drive.finish()
        if started:
            # Stopping waits for the calls in flight: keep this event loop free meanwhile.
            await asyncio.to_thread(self.stop, last)
        elif last is not None:
            await last
