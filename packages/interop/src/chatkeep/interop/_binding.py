"""Which store an adapter writes to: a store the caller owns, or one the adapter opens by URL and closes."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from types import TracebackType
from typing import Any, TypeVar

from typing_extensions import Self

from chatkeep.core import (
    DEFAULT_TENANT,
    HistoryStore,
    SessionKey,
    StoreConfigurationError,
    SyncHistoryStore,
    open_store,
)

__all__ = ["BoundAdapter", "ClosesItsStore", "StoreBinding", "SyncStoreBinding"]

T = TypeVar("T")


def _refuse_options_for_an_object(store_options: Mapping[str, Any] | None) -> None:
    if store_options:
        raise StoreConfigurationError(
            "store_options only apply to a store opened from a URL; configure the store object you passed "
            "when you open it instead"
        )


class StoreBinding:
    """A store and whether the adapter owns it (opened it from a URL or backend name, so closes it).

    Args:
        store: a :class:`HistoryStore` (the caller keeps owning it), or a store URL (``"redis://..."``) or an
            installed backend's name (``"memory"``), which the binding opens and closes.
        store_options: options for a store opened from a URL (what its query takes, as keywords).

    Raises:
        UnknownBackendError: no installed backend handles the URL; the message names the extra to install.
        StoreConfigurationError: ``store_options`` given with a store object, or ``store`` of the wrong type.
    """

    def __init__(self, store: HistoryStore | str, *, store_options: Mapping[str, Any] | None = None) -> None:
        if isinstance(store, HistoryStore):
            _refuse_options_for_an_object(store_options)
            self.store, self.owns_store = store, False
        elif isinstance(store, str):
            self.store, self.owns_store = open_store(store, **dict(store_options or {})), True
        else:
            raise StoreConfigurationError(
                f"store must be a HistoryStore, a store URL such as 'sqlite:///chat.db' or a backend name such as "
                f"'memory', not a {type(store).__name__}"
            )

    @staticmethod
    def key(session_id: str, tenant: str = DEFAULT_TENANT) -> SessionKey:
        """The key of a conversation (checked: raises :class:`InvalidSessionKeyError` for a bad id)."""
        return SessionKey(tenant, session_id)

    async def aclose(self) -> None:
        """Close the store if the binding opened it; a store the caller passed stays open."""
        if self.owns_store:
            await self.store.close()


class _LeavesAsyncWith:
    """``async with`` for an adapter holding either binding as ``_binding``: leaving it closes what the binding
    opened (both bindings' ``aclose``)."""

    _binding: StoreBinding | SyncStoreBinding

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._binding.aclose()


class ClosesItsStore(_LeavesAsyncWith):
    """``close()`` and ``async with`` for an async adapter object holding a :class:`StoreBinding` as ``_binding``."""

    _binding: StoreBinding

    async def close(self) -> None:
        """Close the store if this object opened it from a URL (a store object you passed stays open)."""
        await self._binding.aclose()


class SyncStoreBinding:
    """A store's sync view, for an adapter whose framework calls it from sync and async code alike.

    Every call runs on the view's private event loop: blocking methods call the view, async ones await
    ``view.arun(view.store...)``. So one store serves both kinds of caller, and a blocking call made where an
    event loop is running (a sync function called from async code) never waits on that loop. The store serves
    other event loops too (``store.serves_any_loop``): code elsewhere may use it directly meanwhile.

    Args:
        store: a store's sync view, ``open_store(url).sync()`` (the caller keeps owning it: the way to share one
            store, its connections and its event loop between many adapters), or a store URL or an installed
            backend's name, which the binding opens in a view of its own and closes.
        store_options: options for a store opened from a URL (what its query takes, as keywords).

    Raises:
        UnknownBackendError: no installed backend handles the URL; the message names the extra to install.
        StoreConfigurationError: an async :class:`HistoryStore` (the blocking methods need its sync view: pass
            ``store.sync()``), ``store_options`` given with a view, or ``store`` of another type.
    """

    def __init__(self, store: SyncHistoryStore | str, *, store_options: Mapping[str, Any] | None = None) -> None:
        if isinstance(store, SyncHistoryStore):
            _refuse_options_for_an_object(store_options)
            self.view, self.owns_view = store, False
        elif isinstance(store, HistoryStore):
            raise StoreConfigurationError(
                f"this adapter has blocking and async methods, so it runs its store on a private event loop; pass "
                f"a sync view of your {type(store).__name__}: store.sync() (make one view, share it between all "
                "your histories and close it with view.close() when done), or a store URL"
            )
        elif isinstance(store, str):
            self.view, self.owns_view = StoreBinding(store, store_options=store_options).store.sync(), True
        else:
            raise StoreConfigurationError(
                f"store must be a store's sync view such as open_store('sqlite:///chat.db').sync(), a store URL "
                f"or a backend name such as 'memory', not a {type(store).__name__}"
            )

    key = staticmethod(StoreBinding.key)

    def close(self) -> None:
        """Close the view (and its store) if the binding opened it; a view the caller passed stays open."""
        if self.owns_view:
            self.view.close()

    async def aclose(self) -> None:
        """:meth:`close` for async code: the caller's event loop runs on while the view's thread stops."""
        if self.owns_view:
            await asyncio.to_thread(self.view.close)


class BoundAdapter(_LeavesAsyncWith):
    """An adapter that keeps its store in ``self._binding`` (a :class:`SyncStoreBinding`): how it runs a call, and
    its life cycle.

    Its blocking methods run a call with :meth:`_run` (on the view's loop), its async ones with :meth:`_arun`: on
    the caller's own loop when the store serves any loop (every bundled store opened from a URL: each loop gets
    its own connections), so an async call costs no hand-off between threads; otherwise on the view's loop.
    :meth:`close` (or leaving ``with`` / ``async with``) closes the store if the adapter opened it from a URL; a
    view the caller passed stays open.
    """

    _binding: SyncStoreBinding

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        return self._binding.view.run(call)

    async def _arun(self, call: Coroutine[Any, Any, T]) -> T:
        view = self._binding.view
        if view.store.serves_any_loop and not view.closed:
            return await call
        return await view.arun(call)

    def close(self) -> None:
        """Close the store if this adapter opened it from a URL; a view you passed stays open."""
        self._binding.close()

    async def aclose(self) -> None:
        """:meth:`close` for async code."""
        await self._binding.aclose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
