"""Blocking use of the async API: :class:`SyncHistoryStore`, a view of a store for code that is not async.

Its store methods are generated from :class:`HistoryStore`'s (:func:`_blocking`): same signature, same
docstring, and each runs the async method on the view's private loop (:class:`LoopThread`), so there is one
implementation of every call and nothing to keep in step by hand. The view of a store with the search
capability is a :class:`SyncSearchableStore`, whose search methods are generated the same way from
:class:`SearchableStore`'s.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from types import TracebackType
from typing import Any, Concatenate, TypeVar

from typing_extensions import ParamSpec, Self

from chatkeep.core._errors import InvalidArgumentTypeError, StoreClosedError
from chatkeep.core._loop_thread import LoopThread
from chatkeep.core._messages import Message
from chatkeep.core.backend import HistoryStore, SearchableStore, SessionKey, SupportsSearch

__all__ = ["SyncHistoryStore", "SyncSearchableStore"]

_T = TypeVar("_T")
_P = ParamSpec("_P")
_Store = TypeVar("_Store", bound=HistoryStore)


def _blocking(
    method: Callable[Concatenate[_Store, _P], Coroutine[Any, Any, _T]],
) -> Callable[Concatenate[SyncHistoryStore, _P], _T]:
    """The blocking twin of a ``HistoryStore`` (or ``SearchableStore``) coroutine method, for a view's class body.

    It has the async method's name, signature (for type checkers, through ``ParamSpec``) and docstring, and
    calls the view's store's method of that name (a backend's override included) on the view's loop.
    """
    name = method.__name__

    def call(self: SyncHistoryStore, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        bound: Callable[_P, Coroutine[Any, Any, _T]] = getattr(self._store, name)
        return self._thread.run(bound(*args, **kwargs))

    owner = "SyncSearchableStore" if method.__qualname__.startswith("SearchableStore.") else "SyncHistoryStore"
    call.__name__, call.__qualname__, call.__doc__ = name, f"{owner}.{name}", method.__doc__
    # Not __wrapped__: code that unwraps a callable to see whether it is async would take this one for async.
    call.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]
    return call


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
        store: the async store. The view owns it: closing the view closes the store. A store that
            ``serves_any_loop`` (every bundled store opened from a URL) may be awaited on other loops meanwhile;
            another raises :class:`StoreLoopError` there. A store with the search capability gets a
            :class:`SyncSearchableStore`.
    """

    def __new__(cls, store: HistoryStore) -> SyncHistoryStore:
        """A :class:`SyncSearchableStore` for a store with the search capability."""
        if cls is SyncHistoryStore and isinstance(store, SupportsSearch):
            cls = SyncSearchableStore
        return super().__new__(cls)

    def __init__(self, store: HistoryStore) -> None:
        if not isinstance(store, HistoryStore):
            raise InvalidArgumentTypeError(
                f"SyncHistoryStore wraps a HistoryStore (such as open_store(url)), not a {type(store).__name__}"
            )
        self._store = store
        # Its calls are store operations, run whole for a caller that waits: a backend may block in them.
        self._thread = LoopThread(
            f"chatkeep-sync-{type(store).__name__}", stopped_error=self._closed_error, caller_may_block=True
        )

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

    append = _blocking(HistoryStore.append)
    load = _blocking(HistoryStore.load)
    count = _blocking(HistoryStore.count)
    delete = _blocking(HistoryStore.delete)
    trim = _blocking(HistoryStore.trim)
    pop = _blocking(HistoryStore.pop)
    list_sessions = _blocking(HistoryStore.list_sessions)
    session_info = _blocking(HistoryStore.session_info)
    save_session = _blocking(HistoryStore.save_session)
    load_session = _blocking(HistoryStore.load_session)
    prune = _blocking(HistoryStore.prune)
    list_tenants = _blocking(HistoryStore.list_tenants)
    delete_tenant = _blocking(HistoryStore.delete_tenant)
    fork = _blocking(HistoryStore.fork)
    usage = _blocking(HistoryStore.usage)
    update_info = _blocking(HistoryStore.update_info)

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

    def run(self, call: Coroutine[Any, Any, _T]) -> _T:
        """Run a coroutine that uses :attr:`store` on this view's loop and wait for its result, from blocking code.

        For a rule that makes several store calls (read, then write): it runs whole on the view's loop, as one
        call, where the view's own methods would each be a call of their own. From a plain thread that costs
        no more than the store calls themselves (the loop runs in the calling thread). The store's errors are
        raised as they are. :meth:`arun` is the same for async code.

        Example:
            ``view.run(move_oldest(view.store, key, archive))`` for an ``async def move_oldest(store, ...)``.

        Raises:
            StoreClosedError: the view is closed.
            SyncCallError: called from code running on the view's loop (a coroutine of this view's store).
        """
        return self._thread.run(call)

    async def arun(self, call: Coroutine[Any, Any, _T]) -> _T:
        """Await a call of :attr:`store` from async code on any event loop: it runs on this view's loop thread.

        For code that serves sync and async callers from one store (a framework's history class with both kinds
        of method): async callers await the store on the loop the blocking calls use, so the store stays on one
        loop, and the caller's loop runs other tasks while it waits. Cancelling the caller cancels the call on
        the loop thread (an append stays all or none). The store's errors are raised as they are.

        Example:
            ``messages = await view.arun(view.store.load(key, last=20))``

        Raises:
            StoreClosedError: the view is closed.
        """
        return await asyncio.wrap_future(self._thread.submit(call))

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


class SyncSearchableStore(SyncHistoryStore):
    """The blocking view of a store with the search capability: :class:`SyncHistoryStore` plus ``search``,
    ``reindex``, ``index_info`` and ``unindex``, each running the store's method on the view's loop.

    ``SyncHistoryStore(store)`` and ``store.sync()`` return one for a store that can search. A ``reindex``
    progress callback runs on the view's loop thread.
    """

    search = _blocking(SearchableStore.search)
    reindex = _blocking(SearchableStore.reindex)
    index_info = _blocking(SearchableStore.index_info)
    unindex = _blocking(SearchableStore.unindex)
