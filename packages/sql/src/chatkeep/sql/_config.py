"""Parsing SQL store URLs and options: which driver, which file or server, which chatkeep options."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

import platformdirs

from chatkeep.core import DEFAULT_MAX_MESSAGE_BYTES, MissingExtraError, StoreConfigurationError, redact_url

__all__ = ["SQLConfig", "SQLURLError", "default_sqlite_path", "parse_url"]

# chatkeep's own options (URL query or keywords); every other query parameter goes to the driver.
_INT_OPTIONS = ("max_message_bytes", "pool_size", "max_overflow", "pool_recycle")
_FLOAT_OPTIONS = ("busy_timeout", "connect_timeout")
_BOOL_OPTIONS = ("pool_pre_ping",)
_STR_OPTIONS = ("schema",)
OPTIONS = _INT_OPTIONS + _FLOAT_OPTIONS + _BOOL_OPTIONS + _STR_OPTIONS

# driver -> (module, pip package). Each family's first driver is its default, installed by the chatkeep-core
# extra named after the family; the others are opt-in, installed by the package's own name.
_DRIVERS: dict[str, tuple[str, str]] = {
    "pysqlite": ("sqlite3", ""),  # the standard library's
    "aiosqlite": ("aiosqlite", "aiosqlite"),
    "asyncpg": ("asyncpg", "asyncpg"),
    "psycopg": ("psycopg", "psycopg[binary]"),
    "psycopg_async": ("psycopg", "psycopg[binary]"),
    "asyncmy": ("asyncmy", "asyncmy"),
    "aiomysql": ("aiomysql", "aiomysql"),
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


@dataclass(frozen=True)
class SQLConfig:
    """What a SQL store URL and its options select.

    Attributes:
        family: ``sqlite``, ``postgresql``, ``mysql`` or ``mariadb``.
        driver: the SQLAlchemy driver name (``pysqlite`` means the built-in sync ``sqlite3`` in worker threads).
        url: the SQLAlchemy URL to connect with (chatkeep's options removed), or ``None`` for ``pysqlite``.
        sqlite_path: the database file, for SQLite.
        schema: the PostgreSQL schema holding chatkeep's tables (``None``: the connection's default).
        max_message_bytes: the largest message record accepted, in UTF-8 bytes.
        busy_timeout: seconds a SQLite writer waits for the file's write lock.
        connect_timeout: seconds to wait for a server connection.
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
    connect_timeout: float = 10.0
    pool_size: int = 5
    max_overflow: int = 10
    pool_recycle: int = 1800
    pool_pre_ping: bool = False
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
        command = f'pip install "{package}"'
    return MissingExtraError(
        f"{redact_url(url)} needs the {driver} driver, which is not installed; install it with: {command}"
    )


def _option(name: str, value: Any, url: str) -> Any:
    if name in _STR_OPTIONS:
        if not isinstance(value, str) or not value:
            raise SQLURLError(f"the SQL store option {name} must be a non-empty name, got {value!r}")
        return value
    if name in _BOOL_OPTIONS:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("1", "true", "yes", "on"):
            return True
        if str(value).lower() in ("0", "false", "no", "off"):
            return False
        raise SQLURLError(f"the SQL store option {name}={value!r} must be true or false")
    try:
        number = int(value) if name in _INT_OPTIONS else float(value)
    except (TypeError, ValueError):
        kind = "a whole number" if name in _INT_OPTIONS else "a number of seconds"
        raise SQLURLError(f"the SQL store option {name}={value!r} in {redact_url(url)} must be {kind}") from None
    if isinstance(value, bool) or number < (0 if name in ("max_overflow", "pool_recycle") else 1e-9):
        raise SQLURLError(f"the SQL store option {name} must be positive, got {value!r}")
    return number


def parse_url(url: str, **options: Any) -> SQLConfig:
    """Read a SQL store URL: ``sqlite://``, ``sqlite:///path``, ``postgresql[+driver]://...``, ``mysql[+driver]://...``.

    Keyword options override the query's chatkeep options; ``None`` means "not given". Query parameters
    that are not chatkeep options are passed to the driver.

    Raises:
        SQLURLError: the URL or an option is malformed.
        MissingExtraError: the URL's driver is not installed (the message names the package).
        TypeError: an unknown keyword option.
    """
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TypeError(f"SQL stores take no option {', '.join(unknown)}; the options are {', '.join(OPTIONS)}")
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
    chosen: dict[str, Any] = {}
    passthrough: list[tuple[str, str]] = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in OPTIONS:
            chosen[name] = _option(name, value, url)
        else:
            passthrough.append((name, value))
    chosen.update({name: _option(name, value, url) for name, value in options.items() if value is not None})
    query = urlencode(passthrough)

    if family == "sqlite":
        driver = driver or "pysqlite"
        if driver not in ("pysqlite", "aiosqlite"):
            raise SQLURLError(f"{redact_url(url)!r}: SQLite stores use sqlite:// (built-in) or sqlite+aiosqlite://")
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
        if _module_missing(driver):
            raise _missing(url, family, driver)
        sa_url = None if driver == "pysqlite" else f"sqlite+aiosqlite:///{path}" + (f"?{query}" if query else "")
        return SQLConfig(family="sqlite", driver=driver, url=sa_url, sqlite_path=path, **chosen)

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
    if family != "postgresql" and "schema" in chosen:
        raise SQLURLError("the schema option is for PostgreSQL; on MySQL and MariaDB, name the database in the URL")
    sa_scheme = f"{'postgresql' if family == 'postgresql' else family}+{driver}"
    netloc_path = rest.split("?", 1)[0]
    sa_url = f"{sa_scheme}://{netloc_path}" + (f"?{query}" if query else "")
    if family in ("mysql", "mariadb") and "charset=" not in query:
        sa_url += ("&" if query else "?") + "charset=utf8mb4"
    return SQLConfig(family=family, driver=driver, url=sa_url, **chosen)
