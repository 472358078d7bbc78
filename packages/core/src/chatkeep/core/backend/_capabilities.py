"""What only some backends can do, as protocols checked with ``isinstance`` (never ``getattr``)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = [
    "SupportsExistenceCheck",
    "SupportsMigrate",
    "SupportsNativeTTL",
    "SupportsReadProbe",
    "SupportsSchemaRevision",
]


@runtime_checkable
class SupportsMigrate(Protocol):
    """A store with a schema that ``chatkeep migrate`` creates or upgrades."""

    async def migrate(self) -> str:
        """Create or upgrade the store's schema to this release's; returns the schema revision."""
        ...


@runtime_checkable
class SupportsSchemaRevision(Protocol):
    """A store with a versioned schema that it can report without changing it (``chatkeep doctor`` shows it)."""

    async def schema_revision(self) -> str:
        """The schema revision the store is at (checking, as a first call does, that this release can use it)."""
        ...


@runtime_checkable
class SupportsExistenceCheck(Protocol):
    """A store that creates its storage on first use (a SQLite file, a container) and can say whether it exists.

    The ``chatkeep`` commands that only read or delete (``sessions``, ``export``, ``prune``, ``copy --from``) ask
    before their first call, so that a misspelled path is reported instead of created empty and listed as empty.
    """

    async def missing_storage(self) -> str | None:
        """Without creating anything: what of this store's storage does not exist, or ``None`` when it all does.

        Name it so a person can find the typo, e.g. ``"the SQLite file /srv/chat.db"``.
        """
        ...


@runtime_checkable
class SupportsNativeTTL(Protocol):
    """A store whose engine expires idle sessions itself (the ``ttl`` option)."""

    @property
    def ttl(self) -> float | None:
        """Seconds an idle session lives (``None``: no expiry)."""
        ...


@runtime_checkable
class SupportsReadProbe(Protocol):
    """A store that counts the message records it has read: the conformance kit proves windowed reads with it."""

    @property
    def messages_read(self) -> int:
        """How many message records this store instance has read from its backing so far."""
        ...
