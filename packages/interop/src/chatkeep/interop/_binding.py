"""Which store an adapter writes to: a store the caller owns, or one the adapter opens by URL and closes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chatkeep.core import DEFAULT_TENANT, HistoryStore, SessionKey, StoreConfigurationError, open_store

__all__ = ["StoreBinding"]


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
            if store_options:
                raise StoreConfigurationError(
                    "store_options only apply to a store opened from a URL; configure the store object you passed "
                    "when you open it instead"
                )
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
