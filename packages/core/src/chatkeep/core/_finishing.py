"""A write that a cancelled caller lets end: :func:`finish_if_cancelled`, the rule every backend's writes share."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from chatkeep.core._loop_thread import _BLOCKING_CALL, _Drive

__all__ = ["Write", "finish_if_cancelled"]

T = TypeVar("T")


class Write:
    """A write that :func:`finish_if_cancelled` runs in a blocking call's own task: what to do if Ctrl-C stops it."""

    __slots__ = ("interrupted", "on_cancel")

    def __init__(self, on_cancel: Callable[[], None] | None) -> None:
        self.on_cancel = on_cancel
        self.interrupted = False  # Ctrl-C came while it ran: it was told to roll back, and the call is cancelled


async def finish_if_cancelled(work: Awaitable[T], on_cancel: Callable[[], None] | None = None) -> T:
    """Await ``work`` (a write) so that a cancellation of the caller lets it end instead of cutting it short.

    At the cancellation ``on_cancel`` is called (a write not yet committed then rolls back instead of committing);
    the cancellation reaches the caller once ``work`` has ended, so its outcome is final by then. The error of
    ``work``, if any, is seen and dropped: the caller is told of its cancellation instead.

    In a blocking call of a store's sync view, run in the caller's thread, ``work`` runs in the call's own task
    (no task of its own, no shield: that costs turns of the loop on every write), because only Ctrl-C cancels
    that task, and Ctrl-C waits for the write: it calls ``on_cancel``, runs the loop until ``work`` has ended,
    then cancels the call. A second Ctrl-C meanwhile cancels the call at once, cutting ``work`` short (a
    transaction not committed is then lost with its connection, and a request already sent may still land); a
    third stops waiting. Anything else that cancels such a call's task (``asyncio.timeout`` around a store
    write inside the call) cuts ``work`` short too, without ``on_cancel``: store code run by a sync view does not.
    """
    drive = _BLOCKING_CALL.get()
    if drive is not None and drive.pausable and drive.call is asyncio.current_task():
        return await _in_the_call(drive, work, Write(on_cancel))
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if on_cancel is not None:
            on_cancel()
        while not task.done():
            try:
                await asyncio.wait([task])
            except asyncio.CancelledError:  # cancelled again: the work must still end first
                continue
        if not task.cancelled():
            task.exception()  # seen: the caller is told of its cancellation instead
        raise


async def _in_the_call(drive: _Drive, work: Awaitable[T], write: Write) -> T:
    """``work`` in the blocking call's own task, known to its drive: Ctrl-C (``_Drive.interrupt``) waits for it."""
    drive.writes.append(write)
    try:
        result = await work
    except Exception:
        if not write.interrupted:
            raise
    finally:
        drive.writes.remove(write)
        if write.interrupted and not drive.writes and drive.call is not None:
            drive.call.cancel()  # the last write in flight ended: the interrupted call is cancelled now
    if write.interrupted:
        raise asyncio.CancelledError
    return result
