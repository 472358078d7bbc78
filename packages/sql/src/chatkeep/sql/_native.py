"""The ``asyncpg`` and ``asyncmy`` transports: the engine's pooled connections, statements on the driver's own API.

A statement through SQLAlchemy's DBAPI adapter costs a greenlet hop and the adapter's bookkeeping; the
driver's own async API runs it straight on the event loop. Connections still come from the engine the
store made (its pool, connect settings, statement timeout and recycling), so only the statements differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chatkeep.sql._engine import EngineTransport, Leased

__all__ = ["AsyncmyTransport", "AsyncpgTransport"]


class _AsyncpgConnection(Leased):
    __slots__ = ("_raw",)

    def __init__(self, lease: Any, raw: Any, *, reused: bool) -> None:
        super().__init__(lease, reused=reused)
        self._raw = raw

    async def _fetch(self, statement: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
        rows = await self._raw.fetch(statement, *params)
        self.answered = True
        return rows  # type: ignore[no-any-return]

    async def _execute(self, statement: str, params: Sequence[Any]) -> int:
        status = await self._raw.execute(statement, *params)  # e.g. "DELETE 3", "INSERT 0 2", "BEGIN"
        self.answered = True
        count = status.rsplit(" ", 1)[-1]
        return int(count) if count.isdigit() else 0


class AsyncpgTransport(EngineTransport[_AsyncpgConnection]):
    """PostgreSQL on asyncpg's own API (see the module docstring)."""

    name = "asyncpg"

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        import asyncpg  # type: ignore[import-untyped]

        return (asyncpg.PostgresError, asyncpg.InterfaceError)

    def _wrap(self, lease: Any, pooled: Any, *, reused: bool) -> _AsyncpgConnection:
        return _AsyncpgConnection(lease, pooled.driver_connection, reused=reused)

    def _stale(self, conn: _AsyncpgConnection, exc: Exception) -> bool:
        import asyncpg

        if isinstance(exc, (OSError, asyncpg.ConnectionDoesNotExistError)):
            return True
        return type(exc).__name__ == "InterfaceError" and "closed" in str(exc).lower()


class _AsyncmyConnection(Leased):
    __slots__ = ("_raw",)

    def __init__(self, lease: Any, raw: Any, *, reused: bool) -> None:
        super().__init__(lease, reused=reused)
        self._raw = raw

    async def _run(self, statement: str, params: Sequence[Any]) -> tuple[Sequence[Sequence[Any]], int]:
        async with self._raw.cursor() as cur:
            changed = await cur.execute(statement, params or None)
            self.answered = True
            return (await cur.fetchall() if cur.description else ()), int(changed)

    async def _fetch(self, statement: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
        return (await self._run(statement, params))[0]

    async def _execute(self, statement: str, params: Sequence[Any]) -> int:
        return (await self._run(statement, params))[1]


#: asyncmy's "server gone", "lost connection" and "not connected" errors.
_MYSQL_CONNECTION_LOST = (2006, 2013, 2055)


class AsyncmyTransport(EngineTransport[_AsyncmyConnection]):
    """MySQL and MariaDB on asyncmy's own API (see the module docstring)."""

    name = "asyncmy"

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        from asyncmy import errors

        return (errors.Error,)

    def _wrap(self, lease: Any, pooled: Any, *, reused: bool) -> _AsyncmyConnection:
        return _AsyncmyConnection(lease, pooled.driver_connection, reused=reused)

    def _stale(self, conn: _AsyncmyConnection, exc: Exception) -> bool:
        if isinstance(exc, OSError):
            return True
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        # InterfaceError(0, '') on a closed connection.
        return code in _MYSQL_CONNECTION_LOST or (type(exc).__name__ == "InterfaceError" and code in (0, None))
