"""Parsing SQL store URLs and options: which driver, which file or server, which chatkeep options."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import unquote, urlencode, urlsplit

import platformdirs
from pydantic import Field

from chatkeep.core import MissingExtraError, StoreConfigurationError
from chatkeep.core.backend import (
    DriverOptions,
    Flag,
    NonEmptyText,
    NonNegativeInt,
    PositiveInt,
    Seconds,
    StoreSettings,
    converted,
    redact_url,
)

__all__ = [
    "DEFAULT_MMAP_SIZE",
    "DEFAULT_STATEMENT_TIMEOUT",
    "TRANSPORTS",
    "SQLConfig",
    "SQLSettings",
    "SQLURLError",
    "default_sqlite_path",
    "parse_url",
    "sqlite_pragmas",
]

# driver -> (module, pip package). Each family's first driver is its default, installed by the chatkeep-core
# extra named after the family; the others are opt-in, installed by the package's own name.
_DRIVERS: dict[str, tuple[str, str]] = {
    "pysqlite": ("sqlite3", ""),  # the standard library's
    "apsw": ("apsw", "chatkeep-sql[recall]"),  # its own SQLite, which can load sqlite-vec
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
TRANSPORTS = {
    "sqlite3": ("pysqlite",),
    "apsw": ("pysqlite", "apsw"),
    "asyncpg": ("asyncpg",),
    "asyncmy": ("asyncmy",),
    "sqlalchemy": (),
}


def _transport(value: object) -> str:
    if not isinstance(value, str) or value.lower() not in TRANSPORTS:
        raise ValueError("must be one of " + ", ".join(TRANSPORTS))
    return value.lower()


def _synchronous(value: object) -> str:
    if not isinstance(value, str) or value.lower() not in ("normal", "full"):
        raise ValueError("must be normal or full")
    return value.lower()


#: Bytes of a SQLite file its connections read through memory mapping when the URL does not say: reads of a mapped
#: page cost no system call and no copy. A search scans all of a tenant's vectors (150 MB for 100,000 of 384
#: floats), which takes about half the time mapped. The mapping is address space: the pages are the operating
#: system's file cache, shared by every connection, not memory of the process's own.
DEFAULT_MMAP_SIZE = 1 << 30


def sqlite_pragmas(synchronous: str = "normal", mmap_size: int | None = None) -> tuple[str, ...]:
    """The pragmas every SQLite connection of a store sets when it opens (WAL mode is switched on apart)."""
    # NORMAL is durable across application crashes in WAL mode; only a power loss can undo the last commits. FULL
    # syncs the WAL at every commit, so a commit also survives a power loss.
    mapped = DEFAULT_MMAP_SIZE if mmap_size is None else mmap_size
    return (f"synchronous={synchronous.upper()}", "foreign_keys=ON", f"mmap_size={mapped}")


#: Seconds a statement may run on a database server before the server cancels it, when the URL does not say: a call
#: never hangs on a lock another transaction keeps, as a SQLite writer waits at most ``busy_timeout``.
DEFAULT_STATEMENT_TIMEOUT = 30.0


class SQLSettings(StoreSettings):
    """The store's options (URL query or keywords); ``max_message_bytes`` comes with the base.

    Server URLs may also carry their driver's connect options: those are in :attr:`driver_query`.
    """

    store_name = "SQL"
    store_error = SQLURLError

    schema_: NonEmptyText | None = Field(
        None, alias="schema", description="the PostgreSQL schema holding chatkeep's tables"
    )
    busy_timeout: Seconds = Field(30.0, description="seconds a SQLite writer waits for the write lock")
    synchronous: Annotated[str, converted(_synchronous)] = Field(
        "normal",
        description="SQLite: normal (a commit survives a crash of the process) or full (also an OS crash or power "
        "loss)",
    )
    mmap_size: NonNegativeInt | None = Field(
        None,
        description=f"SQLite: bytes of the file read through memory mapping (default {DEFAULT_MMAP_SIZE}: 1 GiB; 0: "
        "none)",
    )
    connect_timeout: Seconds = Field(5.0, description="seconds a server connection may take to open, greet and log in")
    statement_timeout: Seconds | None = Field(
        None,
        description=f"servers: seconds a statement may run, lock waits included, before the server cancels it "
        f"(default {DEFAULT_STATEMENT_TIMEOUT:g})",
    )
    pool_size: PositiveInt = Field(5, description="connections kept open")
    max_overflow: NonNegativeInt = Field(10, description="connections opened beyond pool_size under load")
    pool_recycle: NonNegativeInt = Field(1800, description="seconds before a pooled connection is replaced")
    pool_pre_ping: Flag = Field(False, description="test each pooled connection with a round trip before use")
    transport: Annotated[str, converted(_transport)] | None = Field(
        None,
        description="what runs the statements: sqlite3, asyncpg or asyncmy (the driver's own API, the default "
        "where the URL's driver is one of them) or sqlalchemy (any driver, through SQLAlchemy's engine)",
    )


# Query parameters SQLAlchemy's dialects read themselves rather than pass to the driver's connect().
_DIALECT_QUERY = {"asyncmy": {"charset"}, "aiomysql": {"charset"}, "asyncpg": {"prepared_statement_cache_size"}}


@dataclass(frozen=True)
class SQLConfig:
    """What a SQL store URL and its options select.

    Attributes:
        family: ``sqlite``, ``postgresql``, ``mysql`` or ``mariadb``.
        driver: the SQLAlchemy driver name (``pysqlite`` means the built-in ``sqlite3``).
        url: the SQLAlchemy URL to connect with (chatkeep's options removed), or ``None`` for ``sqlite3``.
        settings: the store's options (:class:`SQLSettings`). On a server URL, ``statement_timeout`` is never
            ``None`` (:data:`DEFAULT_STATEMENT_TIMEOUT` when not given); on SQLite it always is, as a SQLite writer
            waits at most ``busy_timeout``. ``pool_pre_ping`` is off by default: instead of a round trip per call,
            a pooled connection found dead before the server answered the call's first statement is replaced and
            the call runs once more.
        transport: what runs the statements: ``settings.transport`` when given, else the URL's driver's own
            (``sqlite3``, ``asyncpg``, ``asyncmy``), else ``sqlalchemy``.
        sqlite_path: the database file, for SQLite.
    """

    family: str
    driver: str
    url: str | None
    settings: SQLSettings
    transport: str
    sqlite_path: str | None = None


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
    sqlite_file = chosen in ("sqlite3", "apsw") and driver == ""
    if chosen != "sqlalchemy" and driver not in TRANSPORTS[chosen] and not sqlite_file:
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
    if family != "sqlite":
        try:
            url.encode("utf-8")
        except UnicodeEncodeError as error:  # a lone surrogate: no server can be sent such a name
            raise SQLURLError(
                f"{redact_url(url)!r} holds {url[error.start]!r}, which is not valid text; a server URL's names "
                "must be text (percent-encode bytes as %XX)"
            ) from None

    if family == "sqlite":
        driver = driver or "pysqlite"
        if driver not in ("pysqlite", "aiosqlite"):
            raise SQLURLError(f"{redact_url(url)!r}: SQLite stores use sqlite:// (built-in) or sqlite+aiosqlite://")
        settings = SQLSettings.parse(parts.query, options, url=url)
        if settings.schema_ is not None:
            raise SQLURLError("the schema option is for PostgreSQL; a SQLite store is one file: name another file")
        if settings.statement_timeout is not None:
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
        transport = _chosen_transport(url, driver, settings.transport)
        if transport in ("sqlalchemy", "apsw"):
            driver = "aiosqlite" if transport == "sqlalchemy" else "apsw"
        if _module_missing(driver):
            raise _missing(url, family, driver)
        sa_url = None if transport in ("sqlite3", "apsw") else f"sqlite+aiosqlite:///{path}"
        return SQLConfig(
            family="sqlite", driver=driver, url=sa_url, settings=settings, transport=transport, sqlite_path=path
        )

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
    settings = SQLSettings.parse(parts.query, options, url=url, driver=DriverOptions(driver, _driver_option(driver)))
    if settings.synchronous != "normal":
        raise SQLURLError(
            "the synchronous option is for SQLite; a database server decides its own durability "
            "(PostgreSQL: synchronous_commit; MySQL/MariaDB: innodb_flush_log_at_trx_commit)"
        )
    if settings.mmap_size is not None:
        raise SQLURLError("the mmap_size option is for SQLite; a database server maps its own files")
    if family != "postgresql" and settings.schema_ is not None:
        raise SQLURLError("the schema option is for PostgreSQL; on MySQL and MariaDB, name the database in the URL")
    if settings.statement_timeout is None:
        settings = settings.model_copy(update={"statement_timeout": DEFAULT_STATEMENT_TIMEOUT})
    transport = _chosen_transport(url, driver, settings.transport)
    query = urlencode(settings.driver_query)
    sa_scheme = f"{'postgresql' if family == 'postgresql' else family}+{driver}"
    netloc_path = rest.split("?", 1)[0]
    sa_url = f"{sa_scheme}://{netloc_path}" + (f"?{query}" if query else "")
    if family in ("mysql", "mariadb") and "charset" not in dict(settings.driver_query):
        sa_url += ("&" if query else "?") + "charset=utf8mb4"
    return SQLConfig(family=family, driver=driver, url=sa_url, settings=settings, transport=transport)
