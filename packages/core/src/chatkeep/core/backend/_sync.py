"""Blocking use of the async API: :class:`SyncHistoryStore`, and the loop thread it and ``Agent.run_sync`` run on.

One async implementation serves both worlds: a blocking call submits the async one to a private event loop
running on a daemon thread and waits for its result. A store's connections belong to one event loop, so every
call of one view, from however many threads, runs on that one loop; and a call works even from a thread whose
own loop is running (a notebook cell), because it never runs on the caller's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, TypeVar

from typing_extensions import Self

from chatkeep.core._errors import StoreClosedError, SyncCallError
from chatkeep.core._messages import Message
from chatkeep.core._session import DEFAULT_TENANT, AgentSession
from chatkeep.core.backend import HistoryStore, SessionKey, SessionPage, StoredSession

__all__ = ["LoopThread", "SyncHistoryStore"]

T = TypeVar("T")


class LoopThread:
    """A private event loop on a daemon thread; blocking callers from any thread run coroutines on it.

    The thread starts with the first call and runs until :meth:`stop`. Calls made from several threads at once
    run concurrently, as tasks of that one loop.

    Args:
        name: the thread's name (shown in thread dumps and in error messages).
        stopped_error: builds the error a call made after :meth:`stop` raises (default: :class:`SyncCallError`).
    """

    def __init__(self, name: str, *, stopped_error: Callable[[], Exception] | None = None) -> None:
        self.name = name
        self._stopped_error = stopped_error or self._default_stopped_error
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pending: set[concurrent.futures.Future[Any]] = set()
        self._stopping = False

    def __repr__(self) -> str:
        state = "stopped" if self._stopping else "running" if self._loop is not None else "not started"
        return f"<LoopThread {self.name!r} {state}>"

    def _default_stopped_error(self) -> Exception:
        return SyncCallError(
            f"the event-loop thread {self.name!r} was stopped (its owner was closed) as this call was made; "
            "Agent.run_sync starts a new thread when called again"
        )

    @property
    def started(self) -> bool:
        """Whether the thread was started (by a call, or by :meth:`stop` running its last coroutine)."""
        return self._loop is not None

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopping

    def in_loop_thread(self) -> bool:
        """Whether the calling code runs on this loop thread (where a blocking call would wait on itself)."""
        thread = self._thread
        return thread is not None and thread.ident == threading.get_ident()

    def _deadlock_error(self) -> SyncCallError:
        return SyncCallError(
            f"a blocking call was made from the event-loop thread {self.name!r} that would run it, so it could "
            "never return; code running there (a coroutine or tool of the running call) must use the async API "
            "instead: await store.load(...) rather than the sync view, await agent.run(...) rather than run_sync"
        )

    def _start(self) -> asyncio.AbstractEventLoop:
        """Start the thread (the caller holds the lock)."""
        loop = asyncio.new_event_loop()
        # Calls submitted before run_forever starts simply wait in the loop's queue.
        thread = threading.Thread(target=self._serve, args=(loop,), name=self.name, daemon=True)
        self._loop, self._thread = loop, thread
        thread.start()
        # Dropped without stop() (say, an agent made per request and never closed): end its thread with it.
        weakref.finalize(self, _stop_soon, loop).atexit = False
        return loop

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            try:
                # As asyncio.run does: cancel what the calls left behind, finish async generators, close the loop.
                leftovers = asyncio.all_tasks(loop)
                for task in leftovers:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop (starting the thread if needed) and return its future without waiting.

        Raises:
            Exception: the ``stopped_error`` when :meth:`stop` was called.
        """
        with self._lock:
            if self._stopping:
                coro.close()
                raise self._stopped_error()
            future = asyncio.run_coroutine_threadsafe(coro, self._loop or self._start())
            self._pending.add(future)
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._pending.discard(future)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result; its exception is raised here as it is.

        Raises:
            SyncCallError: called from the loop thread itself.
        """
        if self.in_loop_thread():
            coro.close()
            raise self._deadlock_error()
        future = self.submit(coro)
        try:
            return future.result()
        except BaseException:
            # Interrupted (Ctrl-C in a notebook): cancel the call rather than leave it running unseen.
            future.cancel()
            raise

    def stop(self, last: Coroutine[Any, Any, object] | None = None) -> None:
        """Refuse new calls, let the calls in flight finish, run ``last`` on the loop, then stop it and join the thread.

        Safe to call more than once (``last`` runs only on the first call). An error of ``last`` is raised
        after the thread stopped.

        Raises:
            SyncCallError: called from the loop thread itself.
        """
        if self.in_loop_thread():
            if last is not None:
                last.close()
            raise self._deadlock_error()
        with self._lock:
            first, self._stopping = not self._stopping, True
            in_flight = list(self._pending)
            loop = self._loop
            if first and last is not None and loop is None:
                loop = self._start()  # ``last`` needs a loop to run on
        if not first:
            if last is not None:
                last.close()
            self._join()
            return
        concurrent.futures.wait(in_flight)
        if loop is None:
            return  # never started: no thread to stop
        try:
            if last is not None:
                asyncio.run_coroutine_threadsafe(last, loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            self._join()

    async def astop(self, last: Coroutine[Any, Any, object] | None = None) -> None:
        """:meth:`stop` for async code: ``last`` runs where the work ran, on the thread if it started, else here."""
        if self.in_loop_thread():
            if last is not None:
                last.close()
            raise self._deadlock_error()
        with self._lock:
            started = self._loop is not None
            if not started:
                self._stopping = True
        if started:
            # Stopping waits for the calls in flight and joins the thread: keep this event loop free meanwhile.
            await asyncio.to_thread(self.stop, last)
        elif last is not None:
            await last

    def _join(self) -> None:
        thread = self._thread
        if thread is not None:
            thread.join()


def _stop_soon(loop: asyncio.AbstractEventLoop) -> None:
    with contextlib.suppress(RuntimeError):  # already closed by stop()
        loop.call_soon_threadsafe(loop.stop)


async def _open_iterator(store: HistoryStore, key: SessionKey, batch: int) -> AsyncIterator[Message]:
    # Made on the loop thread: a backend may check the running loop as soon as the iterator is made.
    return store.iter_messages(key, batch=batch)


async def _next_chunk(messages: AsyncIterator[Message], size: int) -> tuple[list[Message], bool]:
    """Up to ``size`` next messages, and whether the iterator is exhausted."""
    chunk: list[Message] = []
    try:
        while len(chunk) < size:
            chunk.append(await messages.__anext__())
    except StopAsyncIteration:
        return chunk, True
    return chunk, False


class SyncHistoryStore:
    """A blocking view of a :class:`HistoryStore`, for code that is not async: Flask or Django views, notebooks.

    Each method runs the store's async method of the same name on one private event-loop thread and waits for
    it, so it can be called from any thread, also from one whose event loop is running (a notebook cell; that
    loop waits meanwhile). Calls from several threads run concurrently on that one loop, which keeps the store's
    connections on one loop. The store's errors are raised as they are (same type and message).

    Example:
        ``store = SyncHistoryStore(open_store("sqlite:///chat.db"))``, then ``store.load(key)``; close it with
        ``store.close()`` or use it as ``with SyncHistoryStore(...) as store:``.

    Args:
        store: the async store. The view owns it: closing the view closes the store. Use it only through the
            view while the view is open (on another running event loop it raises :class:`StoreLoopError`).
    """

    def __init__(self, store: HistoryStore) -> None:
        if not isinstance(store, HistoryStore):
            raise TypeError(
                f"SyncHistoryStore wraps a HistoryStore (such as open_store(url)), not a {type(store).__name__}"
            )
        self._store = store
        self._thread = LoopThread(f"chatkeep-sync-{type(store).__name__}", stopped_error=self._closed_error)

    def _closed_error(self) -> StoreClosedError:
        return StoreClosedError(
            f"this SyncHistoryStore of {type(self._store).__name__} is closed; open a new store and wrap it in a new "
            "SyncHistoryStore to keep using it"
        )

    @property
    def store(self) -> HistoryStore:
        """The async store this view runs (for ``describe()`` and the like; do not call it on another loop)."""
        return self._store

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called on this view (or the store itself was closed)."""
        return self._thread.stopped or self._store.closed

    def __repr__(self) -> str:
        return f"<SyncHistoryStore of {self._store!r}{' closed' if self._thread.stopped else ''}>"

    def append(self, key: SessionKey, messages: Sequence[Message]) -> int:
        """Append messages atomically; messages whose ``message_id`` is already stored are skipped.

        Returns:
            How many messages were new.

        Raises:
            MessageTooLargeError: a message is over ``max_message_bytes`` (nothing is stored).
            StoreUnavailableError: the server failed (nothing is stored).
        """
        return self._thread.run(self._store.append(key, messages))

    def load(self, key: SessionKey, *, last: int | None = None) -> list[Message]:
        """Return the history in append order; with ``last=k``, only the k newest (reading only those)."""
        return self._thread.run(self._store.load(key, last=last))

    def iter_messages(self, key: SessionKey, *, batch: int = 1000) -> Iterator[Message]:
        """Iterate over the whole history in append order, ``batch`` messages per read.

        Each step brings at most ``batch`` messages over from the loop thread, so memory stays bounded by
        ``batch`` however long the history is. Stopping early (``break``) closes the store's iterator.
        """
        messages = self._thread.run(_open_iterator(self._store, key, batch))
        exhausted = False
        try:
            while not exhausted:
                # max(): a batch below 1 reaches the store, which refuses it with its own error.
                chunk, exhausted = self._thread.run(_next_chunk(messages, max(batch, 1)))
                yield from chunk
        finally:
            aclose = getattr(messages, "aclose", None)
            # A view closed meanwhile (or a collection on the loop thread) leaves it to asyncio's finalizer.
            if not exhausted and aclose is not None and not self._thread.stopped and not self._thread.in_loop_thread():
                self._thread.run(aclose())

    def count(self, key: SessionKey) -> int:
        """How many messages the session holds."""
        return self._thread.run(self._store.count(key))

    def delete(self, key: SessionKey) -> bool:
        """Delete the session's messages and document; ``True`` if anything was there."""
        return self._thread.run(self._store.delete(key))

    def trim(self, key: SessionKey, keep_last: int) -> int:
        """Delete all but the ``keep_last`` newest messages; returns how many were deleted."""
        return self._thread.run(self._store.trim(key, keep_last))

    def pop(self, key: SessionKey) -> Message | None:
        """Remove the newest message of the session and return it; None when the session has no messages.

        Atomic: concurrent pops of one session return distinct messages. The session document stays.

        Raises:
            UnsupportedOperationError: the backend's plugin predates ``pop`` (upgrade the plugin).
        """
        return self._thread.run(self._store.pop(key))

    def list_sessions(
        self, tenant: str = DEFAULT_TENANT, *, limit: int = 100, cursor: str | None = None
    ) -> SessionPage:
        """List one tenant's sessions, most recently updated first."""
        return self._thread.run(self._store.list_sessions(tenant, limit=limit, cursor=cursor))

    def save_session(
        self,
        key: SessionKey,
        session: AgentSession,
        *,
        expected_version: str | None = None,
        owner: str | None = None,
    ) -> str:
        """Store a whole-session document and return its new version.

        Args:
            key: where to store it (its tenant must be the session's tenant).
            session: the session to store (as ``session.to_dict()``).
            expected_version: ``None`` writes unconditionally; a version from ``load_session`` or an earlier
                ``save_session`` writes only if the stored document still has that version.
            owner: binds the document to a user within the tenant; a document bound to another owner is refused.

        Raises:
            ConcurrencyConflictError: the stored version is not ``expected_version`` (or there is none).
            SessionOwnershipError: the document belongs to another owner.
        """
        return self._thread.run(self._store.save_session(key, session, expected_version=expected_version, owner=owner))

    def load_session(self, key: SessionKey, *, owner: str | None = None) -> StoredSession | None:
        """Read a session document and its version; ``None`` when there is none.

        Another tenant's key is simply not found.

        Raises:
            SessionOwnershipError: ``owner`` is given and the document is bound to another owner.
        """
        return self._thread.run(self._store.load_session(key, owner=owner))

    def prune(self, *, older_than: timedelta | datetime, tenant: str | None = None) -> int:
        """Delete sessions not updated since ``older_than`` (an age or a cut-off time); returns how many."""
        return self._thread.run(self._store.prune(older_than=older_than, tenant=tenant))

    def delete_tenant(self, tenant: str) -> int:
        """Delete every session of a tenant; returns how many sessions were deleted."""
        return self._thread.run(self._store.delete_tenant(tenant))

    def close(self) -> None:
        """Release connections; safe to call more than once.

        Calls still running on other threads finish first; then the store is closed on its loop, and the
        loop thread stops. Later calls raise :class:`StoreClosedError`.
        """
        if not self._thread.stopped:
            self._thread.stop(self._store.close())

    def __enter__(self) -> Self:
        if self._thread.stopped:
            raise self._closed_error()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
