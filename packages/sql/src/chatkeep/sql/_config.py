"""Parsing SQL store URLs and options: which driver, which file or server, which chatkeep options."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlencode, urlsplit

import platformdirs

from chatkeep.core import MissingExtraError, StoreConfigurationError
from chatkeep.core.backend import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MAX_MESSAGE_BYTES,
    OptionSet,
    StoreOption,
    boolean,
    non_negative_int,
    positive_int,
    positive_seconds,
    redact_url,
    text,
)

__all__ = [
    "DEFAULT_STATEMENT_TIMEOUT",
    "OPTIONS",
    "TRANSPORTS",
    "SQLConfig",
    "SQLURLError",
    "default_sqlite_path",
    "parse_url",
]

# driver -> (module, pip package). Each family's first driver is its default, installed by the chatkeep-core
# extra named after the family; the others are opt-in, installed by the package's own name.
_DRIVERS: dict[str, tuple[str, str]] = {
    "pysqlite": ("sqlite3", ""),  # the standard library's
    "aiosqlite": ("aiosqlite", "aiosqlite"),
    "asyncpg": ("asyncpg", "asyncpg"),
    "psycopg": ("psycopg", "psycopg[binary]"),
    "psycopg_async": ("psycopg", "psycopg[binary]"),
    "asyncmy": ("asyncmy", "asyncmy"),
    "aiomysql": ("aiomysql", "aiomysql pymysql<1.2"),  # aiomysql 0.3 breaks on pymysql 1.2 (escape_bytes_prefixed)
}
_DEFAULT_DRIVERS = {
    "postgresql": ("asyncpg", "psycopg"),
    "mysql": ("asyncmy", "aiomysql"),
    "mariadb": ("asyncmy", "aiomysql"),
}
_SYNC_ONLY = {"psycopg2", "pg8000", "pymysql", "mysqldb", "mysqlconnector", "mariadbconnector", "pysqlcipher"}
_FAMILIES = {
    "sqlite": "sqlite",
    "postgresql": "postgresql",
    "postgres": "postgresql",
    "mysql": "mysql",
    "mariadb": "mariadb",
}


class SQLURLError(StoreConfigurationError):
    """A SQL store URL or one of its options is malformed."""


#: The transports, each usable with the drivers listed (``sqlalchemy`` runs on every driver SQLAlchemy has).
TRANSPORTS = {"sqlite3": ("pysqlite",), "asyncpg": ("asyncpg",), "asyncmy": ("asyncmy",), "sqlalchemy": ()}


def _transport(value: object) -> str:
    if not isinstance(value, str) or value.lower() not in TRANSPORTS:
        raise ValueError("must be one of " + ", ".join(TRANSPORTS))
    return value.lower()


def _synchronous(value: object) -> str:
    if not isinstance(value, str) or value.lower() not in ("normal", "full"):
        raise ValueError("must be normal or full")
    return value.lower()


#: Seconds a statement may run on a database server before the server cancels it, when the URL does not say: a call
#: never hangs on a lock another transaction keeps, as a SQLite writer waits at most ``busy_timeout``.
DEFAULT_STATEMENT_TIMEOUT = 30.0

#: chatkeep's own options (URL query or keywords). Server URLs may also carry their driver's connect options.
OPTIONS = OptionSet(
    "SQL",
    [
        MAX_MESSAGE_BYTES,
        StoreOption("schema", text, None, "the PostgreSQL schema holding chatkeep's tables"),
        StoreOption("busy_timeout", positive_seconds, 30.0, "seconds a SQLite writer waits for the write lock"),
        StoreOption(
            "synchronous",
            _synchronous,
            "normal",
            "SQLite: normal (a commit survives a crash of the process) or full (also an OS crash or power loss)",
        ),
        StoreOption("connect_timeout", positive_seconds, 10.0, "seconds to wait for a server connection"),
        StoreOption(
            "statement_timeout",
            positive_seconds,
            None,
            f"servers: seconds a statement may run, lock waits included, before the server cancels it "
            f"(default {DEFAULT_STATEMENT_TIMEOUT:g})",
        ),
        StoreOption("pool_size", positive_int, 5, "connections kept open"),
        StoreOption("max_overflow", non_negative_int, 10, "connections opened beyond pool_size under load"),
        StoreOption("pool_recycle", non_negative_int, 1800, "seconds before a pooled connection is replaced"),
        StoreOption("pool_pre_ping", boolean, False, "test each pooled connection with a round trip before use"),
        StoreOption(
            "transport",
            _transport,
            None,
            "what runs the statements: sqlite3, asyncpg or asyncmy (the driver's own API, the default where the "
            "URL's driver is one of them) or sqlalchemy (any driver, through SQLAlchemy's engine)",
        ),
    ],
    error=SQLURLError,
)
# Query parameters SQLAlchemy's dialects read themselves rather than pass to the driver's connect().
_DIALECT_QUERY = {"asyncmy": {"charset"}, "aiomysql": {"charset"}, "asyncpg": {"prepared_statement_cache_size"}}


@dataclass(frozen=True)
class SQLConfig:
    """What a SQL store URL and its options select.

    Attributes:
        family: ``sqlite``, ``postgresql``, ``mysql`` or ``mariadb``.
        driver: the SQLAlchemy driver name (``pysqlite`` means the built-in ``sqlite3``).
        transport: what runs the statements (see ``_transport``): ``sqlite3``, ``asyncpg``, ``asyncmy`` or
            ``sqlalchemy``.
        url: the SQLAlchemy URL to connect with (chatkeep's options removed), or ``None`` for ``sqlite3``.
        sqlite_path: the database file, for SQLite.
        schema: the PostgreSQL schema holding chatkeep's tables (``None``: the connection's default).
        max_message_bytes: the largest message record accepted, in UTF-8 bytes.
        busy_timeout: seconds a SQLite writer waits for the file's write lock.
        synchronous: SQLite's ``PRAGMA synchronous`` in WAL mode: ``normal`` (a commit survives a crash of the
            process, not necessarily of the OS or a power loss) or ``full`` (it survives those too, for an fsync
            per commit).
        connect_timeout: seconds to wait for a server connection.
        statement_timeout: seconds a statement may run on a server, lock waits included, before the server
            cancels it (``None`` for SQLite, whose writers wait at most ``busy_timeout``).
        pool_size, max_overflow, pool_recycle, pool_pre_ping: the connection pool's settings. ``pool_pre_ping`` is
            off by default: instead of a round trip per call, a pooled connection found dead before the server
            answered the call's first statement is replaced and the call runs once more.
    """

    family: str
    driver: str
    url: str | None
    sqlite_path: str | None = None
    schema: str | None = None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    busy_timeout: float = 30.0
    synchronous: str = "normal"
    connect_timeout: float = 10.0
    statement_timeout: float | None = None
    pool_size: int = 5
    max_overflow: int = 10
    pool_recycle: int = 1800
    pool_pre_ping: bool = False
    transport: str = "sqlalchemy"
    extra: dict[str, Any] = field(default_factory=dict)


def default_sqlite_path() -> str:
    """The file ``sqlite://`` opens: ``history.db`` in chatkeep's folder of the user's data directory."""
    return os.path.join(platformdirs.user_data_dir("chatkeep", appauthor=False), "history.db")


def _module_missing(driver: str) -> bool:
    module = _DRIVERS[driver][0]
    return importlib.util.find_spec(module) is None


def _missing(url: str, family: str, driver: str) -> MissingExtraError:
    module, package = _DRIVERS[driver]
    if not package:
        return MissingExtraError(
            f"{redact_url(url)} needs Python's built-in {module} module, which this Python was built without; "
            "use a Python build that has it"
        )
    if driver == _DEFAULT_DRIVERS.get(family, ("",))[0]:
        command = f'pip install "chatkeep-core[{family}]"'
    else:
        command = "pip install " + " ".join(f'"{requirement}"' for requirement in package.split())
    return MissingExtraError(
        f"{redact_url(url)} needs the {driver} driver, which is not installed; install it with: {command}"
    )


def _driver_option(driver: str) -> Callable[[str], bool]:
    """Whether the driver's connect() takes a parameter of that name (so a misspelt one fails at open)."""
    if driver in ("psycopg", "psycopg_async"):
        from psycopg import conninfo

        def libpq_option(name: str) -> bool:
            try:
                conninfo.make_conninfo("", **{name: "1"})
            except Exception:  # psycopg.ProgrammingError: "invalid connection option"
                return False
            return True

        return libpq_option
    module = importlib.import_module(_DRIVERS[driver][0])
    names = set(inspect.signature(module.connect).parameters) | _DIALECT_QUERY.get(driver, set())
    target = getattr(module, "Connection", None)  # asyncmy and aiomysql: connect(**kwargs) -> Connection(...)
    if isinstance(target, type):
        names |= set(inspect.signature(target).parameters)
    names -= {"self", "args", "kwargs", "dsn", "host", "port", "user", "password", "database", "db"}
    return names.__contains__


def _chosen_transport(url: str, driver: str, chosen: str | None) -> str:
    """The transport the ``transport`` option names, or the URL's driver's own when it has one."""
    if chosen is None:
        return next((name for name, drivers in TRANSPORTS.items() if driver in drivers), "sqlalchemy")
    if chosen != "sqlalchemy" and driver not in TRANSPORTS[chosen] and not (chosen == "sqlite3" and driver == ""):
        raise SQLURLError(
            f"{redact_url(url)!r}: the {chosen} transport runs on the {chosen} driver, not {driver}; "
            f"use transport=sqlalchemy, or a URL naming the {chosen} driver"
        )
    return chosen


def parse_url(url: str, **options: Any) -> SQLConfig:
    """Read a SQL store URL: ``sqlite://``, ``sqlite:///path``, ``postgresql[+driver]://...``, ``mysql[+driver]://...``.

    Keyword options override the query's chatkeep options; ``None`` means "not given". On a server URL,
    query parameters that are not chatkeep options must be options of its driver's ``connect()``.

    Raises:
        SQLURLError: the URL or an option is malformed or unknown.
        MissingExtraError: the URL's driver is not installed (the message names the package).
    """
    if url.lower() == "sql":  # the backend's name, as open_store("sql") passes it
        url = "sqlite://"
    if "://" not in url:
        raise SQLURLError(
            f"{redact_url(url)!r} is not a SQL store URL; write sqlite://, postgresql://... or mysql://..."
        )
    scheme, rest = url.split("://", 1)
    family_name, _, driver = scheme.lower().partition("+")
    family = _FAMILIES.get(family_name)
    if family is None:
        raise SQLURLError(
            f"{redact_url(url)!r} is not a SQL URL; the schemes are sqlite, postgresql, mysql and mariadb"
        )
    parts = urlsplit(url)
    if parts.fragment:
        raise SQLURLError(f"{redact_url(url)!r} has a fragment (#...); remove it")

    if family == "sqlite":
        driver = driver or "pysqlite"
        if driver not in ("pysqlite", "aiosqlite"):
            raise SQLURLError(f"{redact_url(url)!r}: SQLite stores use sqlite:// (built-in) or sqlite+aiosqlite://")
        values = OPTIONS.parse(parts.query, options, url=url).values
        if values["schema"] is not None:
            raise SQLURLError("the schema option is for PostgreSQL; a SQLite store is one file: name another file")
        if values["statement_timeout"] is not None:
            raise SQLURLError(
                "the statement_timeout option is for database servers; a SQLite writer waits at most busy_timeout "
                "for the file's write lock (busy_timeout=30 by default)"
            )
        path_part = rest.split("?", 1)[0]
        if path_part.startswith("/"):
            path_part = path_part[1:]
        elif path_part:
            raise SQLURLError(
                f"{url!r} names a host; write sqlite:///relative/file.db, sqlite:////absolute/file.db or sqlite://"
            )
        path = unquote(path_part) if path_part else default_sqlite_path()
        if path == ":memory:" or path.startswith("file:"):
            raise SQLURLError(
                f"{url!r}: an in-memory SQLite database cannot be shared between connections; "
                "use memory:// for a process-local store, or name a file"
            )
        values = {**values, "transport": _chosen_transport(url, driver, values["transport"])}
        transport = values["transport"]
        if transport == "sqlalchemy":
            driver = "aiosqlite"
        if _module_missing(driver):
            raise _missing(url, family, driver)
        sa_url = None if transport == "sqlite3" else f"sqlite+aiosqlite:///{path}"
        return SQLConfig(family="sqlite", driver=driver, url=sa_url, sqlite_path=path, **values)

    if driver in _SYNC_ONLY:
        raise SQLURLError(
            f"{redact_url(url)!r} names the synchronous driver {driver}; chatkeep runs on asyncio, so use "
            + ("postgresql+asyncpg:// or postgresql+psycopg://" if family == "postgresql" else "mysql+asyncmy://")
        )
    if driver:
        if driver not in _DRIVERS:
            raise SQLURLError(f"{redact_url(url)!r} names an unknown driver {driver!r}")
        if _module_missing(driver):
            raise _missing(url, family, driver)
    else:
        candidates = _DEFAULT_DRIVERS[family]
        driver = next((d for d in candidates if not _module_missing(d)), "")
        if not driver:
            raise _missing(url, family, candidates[0])
    parsed = OPTIONS.with_driver(driver, _driver_option(driver)).parse(parts.query, options, url=url)
    values = dict(parsed.values)
    if values["synchronous"] != "normal":
        raise SQLURLError(
            "the synchronous option is for SQLite; a database server decides its own durability "
            "(PostgreSQL: synchronous_commit; MySQL/MariaDB: innodb_flush_log_at_trx_commit)"
        )
    if values["statement_timeout"] is None:
        values["statement_timeout"] = DEFAULT_STATEMENT_TIMEOUT
    values["transport"] = _chosen_transport(url, driver, values["transport"])
    if family != "postgresql" and values["schema"] is not None:
        raise SQLURLError("the schema option is for PostgreSQL; on MySQL and MariaDB, name the database in the URL")
    query = urlencode(parsed.driver)
    sa_scheme = f"{'postgresql' if family == 'postgresql' else family}+{driver}"
    netloc_path = rest.split("?", 1)[0]
    sa_url = f"{sa_scheme}://{netloc_path}" + (f"?{query}" if query else "")
    if family in ("mysql", "mariadb") and "charset" not in dict(parsed.driver):
        sa_url += ("&" if query else "?") + "charset=utf8mb4"
    return SQLConfig(family=family, driver=driver, url=sa_url, **values)
