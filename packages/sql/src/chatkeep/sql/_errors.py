"""Driver errors, read once for every transport: which may run again, which mean a full disk or a timeout, and
the :class:`StoreUnavailableError` (or :class:`StoreFullError`) a caller sees instead of the driver's error."""

from __future__ import annotations

import errno
from collections.abc import Iterator

from chatkeep.core import ChatkeepError, StoreConfigurationError, StoreFullError, StoreUnavailableError
from chatkeep.core.backend import redact_url

__all__ = [
    "SERVER_HINT",
    "SQLITE_FILE_HINT",
    "NoAnswerError",
    "connect_timed_out",
    "disk_full",
    "retryable",
    "sqlstate",
    "stale_snapshot",
    "timed_out",
    "translate",
]

#: What to check when a call fails: a server's reachability, or (for a SQLite file) its folder.
SERVER_HINT = "check that it is running and reachable, then retry"
SQLITE_FILE_HINT = "check that the file's folder exists and that this process may read and write there, then retry"

#: PostgreSQL's SQLSTATE ``disk_full``; MySQL/MariaDB's ER_RECORD_FILE_FULL ("the table is full") and ER_DISK_FULL.
_PG_DISK_FULL = "53100"
_MYSQL_DISK_FULL = (1114, 1021)
_MYSQL_DRIVERS = ("asyncmy", "pymysql", "MySQLdb", "aiomysql")
_SQLITE_FULL = 13  # the primary result code (sqlite3.SQLITE_FULL at run time; typeshed does not list it)
#: PostgreSQL's SQLSTATE ``query_canceled``; MariaDB's ER_STATEMENT_TIMEOUT, MySQL's ER_QUERY_TIMEOUT and InnoDB's
#: ER_LOCK_WAIT_TIMEOUT.
_PG_CANCELED = "57014"
_MYSQL_TIMED_OUT = (1969, 3024, 1205)
#: Serialization failure, deadlock, lock not available (PostgreSQL); deadlock and lock wait timeout (MySQL).
_PG_RETRYABLE = ("40001", "40P01", "55P03")
_MYSQL_RETRYABLE = (1213, 1205)
#: Errors no retry can fix, by what the URL names wrongly: PostgreSQL's invalid_catalog_name,
#: invalid_authorization_specification and invalid_password; MySQL/MariaDB's ER_BAD_DB_ERROR,
#: ER_DBACCESS_DENIED_ERROR and ER_ACCESS_DENIED_ERROR; SQLite's SQLITE_NOTADB (not a database file).
_PG_REFUSED: dict[str, str] = {"3D000": "database", "28000": "login", "28P01": "login"}
_MYSQL_REFUSED: dict[int, str] = {1049: "database", 1044: "login", 1045: "login"}
_SQLITE_NOTADB = 26
_SQLITE_CORRUPT = 11
_REFUSED_HINTS = {
    "database": "the database the URL names does not exist there: fix the name in the URL, or create it "
    "(PostgreSQL: createdb NAME; MySQL/MariaDB: CREATE DATABASE NAME); chatkeep creates its tables, not databases",
    "login": "the server refused the URL's user or password (or that user may not use the database): fix them in "
    "the URL, or grant the user access",
    "file": "the file is not a SQLite database: check that the URL's path names chatkeep's database file and not "
    "another file",
}
#: PostgreSQL's ``division_by_zero``, which the one-statement append raises on purpose (see ``_sql``).
_PG_STALE_SNAPSHOT = "22012"


def _errors_within(exc: BaseException) -> Iterator[BaseException]:
    """A driver error and every error it wraps: SQLAlchemy's ``orig`` and the chained causes, each once."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        orig = getattr(error, "orig", None)
        pending += [orig if isinstance(orig, BaseException) else None, error.__cause__, error.__context__]


def _mysql_code(error: BaseException) -> object:
    """A MySQL/MariaDB driver error's number (``None`` for another driver's error)."""
    driver = type(error).__module__.split(".", 1)[0]
    return error.args[0] if driver in _MYSQL_DRIVERS and error.args else None


def sqlstate(error: BaseException) -> object:
    """A PostgreSQL driver error's SQLSTATE (``None`` for another error)."""
    return getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)


def disk_full(exc: BaseException) -> bool:
    """Whether a driver error, or any error it wraps (SQLAlchemy's ``orig``, the chained causes), means "no space".

    SQLite's SQLITE_FULL, PostgreSQL's SQLSTATE 53100, MySQL/MariaDB errors 1114 and 1021, or an OS error
    ENOSPC / EDQUOT (a full disk or quota while a file is created or grown).
    """
    for error in _errors_within(exc):
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        code = getattr(error, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF == _SQLITE_FULL:
            return True
        if sqlstate(error) == _PG_DISK_FULL or _mysql_code(error) in _MYSQL_DISK_FULL:
            return True
    return False


def timed_out(exc: BaseException) -> bool:
    """Whether the server cancelled a statement for running past the connection's statement timeout.

    PostgreSQL's SQLSTATE 57014 (``statement_timeout``), MariaDB's error 1969 (``max_statement_time``),
    MySQL's 3024 (``max_execution_time``) and InnoDB's 1205 (``innodb_lock_wait_timeout``).
    """
    return any(sqlstate(e) == _PG_CANCELED or _mysql_code(e) in _MYSQL_TIMED_OUT for e in _errors_within(exc))


def retryable(exc: BaseException) -> bool:
    """A deadlock, serialization failure, lock timeout or busy database: the transaction can run again."""
    if sqlstate(exc) in _PG_RETRYABLE:
        return True
    args = getattr(exc, "args", ())
    if args and isinstance(args[0], int) and args[0] in _MYSQL_RETRYABLE:
        return True
    text = str(exc).lower()
    return "database is locked" in text or "deadlock" in text


def stale_snapshot(exc: BaseException) -> bool:
    """PostgreSQL's one-statement append found its snapshot stale and rolled back on purpose (see ``_sql``)."""
    return sqlstate(exc) == _PG_STALE_SNAPSHOT


def refused(exc: BaseException) -> str | None:
    """What the URL names wrongly when the server refused it for good (``"database"``, ``"login"``, ``"file"``)."""
    for error in _errors_within(exc):
        mysql_code = _mysql_code(error)
        kind = _PG_REFUSED.get(str(sqlstate(error)))
        if kind is None and isinstance(mysql_code, int):
            kind = _MYSQL_REFUSED.get(mysql_code)
        if kind is not None:
            return kind
        code = getattr(error, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF == _SQLITE_NOTADB:
            return "file"
    return None


def _damaged_sqlite_file(exc: BaseException) -> bool:
    return any(
        isinstance(code := getattr(error, "sqlite_errorcode", None), int) and code & 0xFF == _SQLITE_CORRUPT
        for error in _errors_within(exc)
    )


def translate(exc: BaseException, *, description: str, hint: str, statement_timeout: float | None) -> ChatkeepError:
    """The one translation of a driver error: what the caller can do about it decides the class.

    :class:`StoreConfigurationError` for a database, login or file the URL names wrongly (no retry fixes it),
    :class:`StoreFullError` for a full disk, else :class:`StoreUnavailableError` with ``hint``.
    """
    detail = f"{type(exc).__name__}: {redact_url(str(exc)).strip()[:500]}"
    kind = refused(exc)
    if kind is not None:
        return StoreConfigurationError(
            f"the database at {description} refused this store ({detail}): {_REFUSED_HINTS[kind]}"
        )
    if isinstance(exc, NoAnswerError):
        return StoreUnavailableError(
            f"the database at {description} did not answer a statement of this call within "
            f"statement_timeout={exc.seconds:g} s (the server cancels a statement at that bound and says so at "
            "once): the server or the network to it stopped answering. The connection was dropped; what the "
            "statement did, if it ran, is rolled back with it unless it had committed. Check that the server "
            "runs and is not stuck, then retry; if statements are known to run longer, raise the bound in the URL "
            "(e.g. ?statement_timeout=60)"
        )
    if timed_out(exc):
        limit = f"statement_timeout={statement_timeout:g} s" if statement_timeout is not None else "statement timeout"
        return StoreUnavailableError(
            f"the database at {description} cancelled a statement of this call at its {limit} ({detail}), and "
            "rolled back what it did. Most often another transaction holds a "
            "lock on the session for long (a stuck client, a long migration), or the server is overloaded: "
            "find what holds it (PostgreSQL: pg_stat_activity; MySQL/MariaDB: SHOW PROCESSLIST) and retry, or "
            "raise the bound in the URL (e.g. ?statement_timeout=60)"
        )
    if disk_full(exc):
        return StoreFullError(
            f"the database at {description} has no room left: its disk, volume, quota or tablespace is "
            f"full ({detail}); nothing of this call was stored and what was stored before is intact. Free "
            "space where the database keeps its files (or raise its quota), then retry: the store works again "
            "without a restart"
        )
    if _damaged_sqlite_file(exc):
        return StoreUnavailableError(
            f"the SQLite file at {description} is damaged ({detail}): restore it from a backup, or check it with "
            "sqlite3 FILE 'PRAGMA integrity_check' and recover what it can with sqlite3 FILE .recover"
        )
    return StoreUnavailableError(f"the database at {description} failed or could not be reached ({detail}); {hint}")


class NoAnswerError(TimeoutError):
    """A statement got no answer from the server by ``statement_timeout`` plus a grace (the server is silent).

    Attributes:
        seconds: the ``statement_timeout``.
    """

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no answer to a statement within statement_timeout={seconds:g} s")
        self.seconds = seconds


def connect_timed_out(address: str, connect_timeout: float) -> StoreUnavailableError:
    """A server connection that was not ready (connected, greeted, logged in) within ``connect_timeout``."""
    return StoreUnavailableError(
        f"the database server at {address} did not complete a connection within connect_timeout={connect_timeout:g} "
        "s: nothing answers there, or something that is not the database (or a stuck server or proxy) accepts the "
        "connection and never greets. Check the URL's host and port and that the database is running there, then "
        "retry; on a slow network raise the bound in the URL (e.g. ?connect_timeout=30) or the connect_timeout "
        "option"
    )
