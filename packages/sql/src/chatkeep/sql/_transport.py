"""The seam between the storage operations (``_ops``) and a database driver: a transport.

The operations are written once against :class:`Connection` (``fetch`` and ``execute`` of one statement in
the driver's parameter style, autocommit unless the operation says ``BEGIN``). A :class:`Transport` lends a
connection for one store call. A :class:`LendingTransport` does it on the event loop: it checks one out of its
pool, runs the call, and returns it; a pooled connection found dead before the server answered any statement of
the call is replaced and the call runs once more. A driver error becomes a chatkeep error (``_errors.translate``).
Transports: ``sqlite3`` (``_sqlite``, the whole call in a worker thread),
``asyncpg`` and ``asyncmy`` (``_native``), and ``sqlalchemy``, any SQLAlchemy ``AsyncEngine`` (``_engine``).
"""

from __future__ import annotations

import abc
import asyncio
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from chatkeep.core import ChatkeepError
from chatkeep.core.backend import finish_if_cancelled, record_retry
from chatkeep.sql._errors import SERVER_HINT, NoAnswerError, translate
from chatkeep.sql._sql import Statements

__all__ = ["ANSWER_GRACE", "Cancelled", "Connection", "Flag", "LendingTransport", "StatementDeadline", "Transport"]

T = TypeVar("T")
C = TypeVar("C", bound="Connection")


class Flag:
    """Set by the event loop when the calling task is cancelled; a write checks it just before committing."""

    __slots__ = ("is_set",)

    def __init__(self) -> None:
        self.is_set = False

    def set(self) -> None:
        """The calling task was cancelled."""
        self.is_set = True


class Cancelled(Exception):
    """A write saw its task cancelled before it committed and rolled back."""


_NEVER = Flag()  # the flag of a call nobody can cancel half way (it never suspends, or it is a read)

#: Seconds past ``statement_timeout`` a statement waits for the server's answer before the call gives up on it: the
#: server cancels a statement at its timeout and says so at once, so no answer by then means a server (or the
#: network to it) that stopped answering; the driver would wait for it as long as the socket stays open.
ANSWER_GRACE = 1.0


class StatementDeadline:
    """The bound on each statement of one call, kept by one timer for the whole call instead of one per statement.

    A statement unanswered ``seconds`` after it was sent cancels the calling task, and the statement raises
    :class:`~chatkeep.sql._errors.NoAnswerError`. The timer is armed at the first statement's due time; when it
    fires it compares with the statement running then, and re-arms at that statement's due time if it is not yet
    due (or stops, between statements). A call of four statements so arms one timer, not four: an event-loop timer
    (``asyncio.timeout``) costs tens of microseconds to arm and cancel, as much as a statement's own Python work.
    """

    __slots__ = ("_cancelling", "_expired", "_handle", "_loop", "_seconds", "_sent", "_task")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = None
        self._sent: float | None = None  # when the running statement was sent (None: none is running)
        self._task: Any = None  # the calling task (Task.cancelling and uncancel: Python 3.11+)
        self._cancelling = 0
        self._expired = False

    def started(self) -> None:
        """A statement is sent now."""
        self._sent = now = self._loop.time()
        task: Any = asyncio.current_task()
        if task is not self._task:
            self._task = task
            self._cancelling = task.cancelling() if task is not None else 0
        if self._handle is None:
            self._handle = self._loop.call_at(now + self._seconds, self._check)

    def answered(self) -> None:
        """The running statement ended (answered, failed or cancelled)."""
        self._sent = None

    def fired(self) -> bool:
        """Whether a cancellation the statement saw is this deadline's own (then it is taken back from the task)."""
        if not self._expired or self._task is None:
            return False
        self._expired = False
        return bool(self._task.uncancel() <= self._cancelling)

    def disarm(self) -> None:
        """Cancel the timer (the call is over)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        self._handle = None
        if self._sent is None or self._task is None:
            return  # between statements: the next one arms it again
        due = self._sent + self._seconds
        if self._loop.time() < due:
            self._handle = self._loop.call_at(due, self._check)
            return
        self._expired = True
        self._task.cancel()


class Connection(abc.ABC):
    """One pooled connection, lent to one store call."""

    __slots__ = ("_deadline", "answered", "cancel", "reused", "statement_timeout")

    def __init__(self, *, reused: bool = False) -> None:
        #: Whether the server has answered a statement of this call (after that, a failed call is not re-run).
        self.answered = False
        #: Whether it was used by an earlier call (a connection just opened is not suspected of being stale).
        self.reused = reused
        self.cancel = _NEVER
        #: The server's statement timeout (``None``: none); a statement unanswered :data:`ANSWER_GRACE` past it
        #: raises :class:`~chatkeep.sql._errors.NoAnswerError`.
        self.statement_timeout: float | None = None
        self._deadline: StatementDeadline | None = None

    @property
    def cancelled(self) -> bool:
        """Whether the calling task was cancelled: a write rolls back instead of committing."""
        return self.cancel.is_set

    async def fetch(self, statement: str, params: Sequence[Any] = ()) -> Sequence[Sequence[Any]]:
        """Run one statement; its rows (none for a statement that returns none)."""
        if self.statement_timeout is None:
            return await self._fetch(statement, params)
        return await self._bounded(self._fetch(statement, params))

    async def execute(self, statement: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; how many rows it changed."""
        if self.statement_timeout is None:
            return await self._execute(statement, params)
        return await self._bounded(self._execute(statement, params))

    async def _bounded(self, work: Awaitable[T]) -> T:
        assert self.statement_timeout is not None
        seconds = self.statement_timeout + ANSWER_GRACE
        if sys.version_info < (3, 11):  # pragma: no cover - CI runs 3.11 (no Task.uncancel before it)
            try:
                return await asyncio.wait_for(work, seconds)
            except asyncio.TimeoutError as exc:
                raise NoAnswerError(self.statement_timeout) from exc
        deadline = self._deadline
        if deadline is None:
            deadline = self._deadline = StatementDeadline(seconds)
        deadline.started()
        try:
            return await work
        except asyncio.CancelledError as exc:
            if deadline.fired():
                raise NoAnswerError(self.statement_timeout) from exc
            raise
        finally:
            deadline.answered()

    def end(self) -> None:
        """The call is over: its statement deadline's timer, if one was armed, is cancelled."""
        if self._deadline is not None:
            self._deadline.disarm()

    @abc.abstractmethod
    async def _fetch(self, statement: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
        """The driver's run of one statement, returning its rows."""

    @abc.abstractmethod
    async def _execute(self, statement: str, params: Sequence[Any]) -> int:
        """The driver's run of one statement, returning how many rows it changed."""

    async def pause(self, seconds: float) -> None:
        """Wait before an operation's next attempt (the event loop runs on; a transport off the loop sleeps)."""
        await asyncio.sleep(seconds)


class Transport(abc.ABC, Generic[C]):
    """A driver's pool of connections, lending one per store call (see the module docstring)."""

    #: The transport's name, as ``store.transport`` and the ``transport`` option spell it.
    name: ClassVar[str]
    #: Whether the store may call it from several running event loops at once (its pools are kept per loop).
    serves_any_loop: bool = False

    statements: Statements
    description: str
    #: The database server's host and port, as the URL names them (``None``: a file, or not named).
    address: str | None = None
    port: int | None = None
    hint: str = SERVER_HINT
    #: The statement timeout its connections were opened with (``None``: not chatkeep's to say).
    statement_timeout: float | None = None
    #: The driver's exceptions, translated into chatkeep's (:func:`chatkeep.sql._errors.translate`).
    errors: tuple[type[BaseException], ...] = (OSError,)

    @abc.abstractmethod
    async def run(self, op: Callable[[C], Awaitable[T]], *, write: bool = False) -> T:
        """Run ``op`` on a lent connection; a driver error raises its translation (see :meth:`translate`).

        A ``write`` whose caller is cancelled rolls back unless it had already committed, and the outcome is
        final when the cancellation reaches the caller.
        """

    def translate(self, exc: BaseException) -> ChatkeepError:
        """The error a caller sees for a driver error of this transport."""
        return translate(exc, description=self.description, hint=self.hint, statement_timeout=self.statement_timeout)

    @abc.abstractmethod
    async def prepare(self, *, upgrade: bool = False) -> str:
        """Check (and in an empty database create, or with ``upgrade`` migrate) the schema; returns its revision."""

    def on_loop_change(self) -> None:
        """Drop connections that belonged to an event loop that is gone (one serving a single loop at a time)."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release every connection."""


class LendingTransport(Transport[C]):
    """A transport lending pooled connections on the event loop: checkout, the call, checkin (or discard)."""

    async def run(self, op: Callable[[C], Awaitable[T]], *, write: bool = False) -> T:
        """Run ``op`` on a lent connection; a driver error raises its translation (see :meth:`translate`).

        A ``write`` whose caller is cancelled rolls back unless it had already committed, and the outcome is
        final (the connection back in the pool) when the cancellation reaches the caller.
        """
        if not write:
            return await self._lend(op, _NEVER)
        flag = Flag()
        return await finish_if_cancelled(self._lend(op, flag), flag.set)

    async def _lend(self, op: Callable[[C], Awaitable[T]], cancel: Flag) -> T:
        try:
            for attempt in (0, 1):
                conn = await self._checkout()
                conn.cancel = cancel
                conn.statement_timeout = self.statement_timeout
                try:
                    result = await op(conn)
                except ChatkeepError:
                    conn.end()
                    await self._checkin(conn)  # raised by the operation after a clean rollback: the connection is fine
                    raise
                except BaseException as exc:
                    conn.end()
                    # An unanswered statement is not re-run: it already took its deadline, and may have run.
                    stale = isinstance(exc, Exception) and not isinstance(exc, NoAnswerError) and self._stale(conn, exc)
                    await self._discard(conn, exc, stale=stale)
                    if stale and conn.reused and not conn.answered and attempt == 0:
                        record_retry("connection lost")
                        continue  # the server never saw the call take effect: run it again on a new connection
                    raise
                conn.end()
                await self._checkin(conn)
                return result
            raise AssertionError("unreachable")
        except ChatkeepError:
            raise  # some are OSErrors (SessionOwnershipError is a PermissionError): not the database's failure
        except self.errors as exc:
            raise self.translate(exc) from exc

    @abc.abstractmethod
    async def _checkout(self) -> C:
        """A connection from the pool (opening one if none is idle)."""

    @abc.abstractmethod
    async def _checkin(self, conn: C) -> None:
        """Give a connection back after a call that ended cleanly."""

    @abc.abstractmethod
    async def _discard(self, conn: C, exc: BaseException, *, stale: bool) -> None:
        """Give a connection back after a call that failed: its state is unknown, so it is not reused as it is.

        ``stale``: the connection is dead (the server restarted or dropped it), and so may be every pooled
        connection as old as it.
        """

    def _stale(self, conn: C, exc: Exception) -> bool:
        """Whether ``exc`` means the connection is dead (not a SQL error)."""
        return isinstance(exc, OSError)
