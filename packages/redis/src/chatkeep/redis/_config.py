"""Parsing ``redis://``, ``rediss://``, ``unix://`` and ``redis+cluster://`` URLs and the store's options."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Any
from urllib.parse import urlencode, urlsplit

from pydantic import Field, model_validator
from typing_extensions import Self

from chatkeep.core import StoreConfigurationError
from chatkeep.core.backend import (
    DriverOptions,
    NonNegativeInt,
    PositiveInt,
    Seconds,
    TTLStoreSettings,
    converted,
    redact_url,
)
from chatkeep.redis._transport import TRANSPORTS, TransportName

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_PREFIX",
    "DEFAULT_SOCKET_TIMEOUT",
    "DEFAULT_WAIT_TIMEOUT_MS",
    "RedisConfig",
    "RedisSettings",
    "RedisURLError",
    "parse_url",
]

DEFAULT_PREFIX = "chatkeep"
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_SOCKET_TIMEOUT = 10.0
DEFAULT_WAIT_TIMEOUT_MS = 1000

_SCHEMES = ("redis", "rediss", "unix", "redis+cluster")


class RedisURLError(StoreConfigurationError):
    """A Redis store URL or one of its options is malformed."""


def check_prefix(prefix: object) -> str:
    """Validate a key prefix: non-empty text without ``{`` or ``}`` (they would change the cluster hash tag)."""
    if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
        raise ValueError("must be non-empty text without braces (braces would move keys to other cluster slots)")
    return prefix


def _transport_name(value: object) -> TransportName:
    for name in TRANSPORTS:
        if value == name:
            return name
    raise ValueError(f"must be one of {', '.join(TRANSPORTS)}")


@functools.lru_cache(maxsize=1)
def _redis_py_options() -> frozenset[str]:
    """The query options redis-py's connections and pools take (anything else would fail at the first command)."""
    from redis.asyncio import RedisCluster, connection

    names = set(connection.URL_QUERY_ARGUMENT_PARSERS)
    for target in (
        connection.AbstractConnection,
        connection.Connection,
        connection.SSLConnection,
        connection.UnixDomainSocketConnection,
        connection.ConnectionPool,
        RedisCluster,
    ):
        names |= {
            p.name
            for p in inspect.signature(target).parameters.values()
            if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD
        }
    # chatkeep sets these itself (its own options or fixed choices).
    return frozenset(names - {"host", "port", "path", "decode_responses", "socket_connect_timeout", "startup_nodes"})


#: Query parameters that are not chatkeep's options go to redis-py, which must take them (checked at open).
_REDIS_PY = DriverOptions("redis-py", lambda name: name in _redis_py_options())


class RedisSettings(TTLStoreSettings):
    """The store's options (URL query or keywords); ``max_message_bytes`` and ``ttl`` come with the base.

    ``ttl`` is the seconds an idle session lives (``None``: forever); every write restarts it.
    """

    store_name = "Redis"
    store_error = RedisURLError
    option_hints = MappingProxyType(
        {"max_messages": "the storage cap is keep_last; max_messages is a history provider's load window"}
    )

    prefix: Annotated[str, converted(check_prefix)] = Field(
        DEFAULT_PREFIX, description="the first segment of every key; stores with other prefixes never meet"
    )
    keep_last: PositiveInt | None = Field(
        None, description="keep at most this many newest messages per session (trimmed in the same step as an append)"
    )
    socket_timeout: Seconds = Field(
        DEFAULT_SOCKET_TIMEOUT, description="seconds a command may wait for the server before the call fails"
    )
    connect_timeout: Seconds = Field(
        DEFAULT_CONNECT_TIMEOUT, description="seconds a connection attempt may take before the call fails"
    )
    wait_replicas: NonNegativeInt = Field(
        0, description="replicas that must confirm each write (Redis WAIT) before it returns; 0 does not wait"
    )
    wait_timeout_ms: PositiveInt = Field(
        DEFAULT_WAIT_TIMEOUT_MS,
        description="milliseconds a write waits for its replicas before raising ReplicationTimeoutError",
    )
    transport: Annotated[TransportName, converted(_transport_name)] | None = Field(
        None,
        description="the driver: resp (the store's own connection; standalone, needs hiredis) or redis-py; "
        "default the fastest that serves the URL",
    )

    @model_validator(mode="after")
    def _wait_ends_before_the_socket_times_out(self) -> Self:
        # Else the socket would time out first, and the write would fail as unreachable instead of naming the replicas.
        if self.wait_replicas and self.wait_timeout_ms >= self.socket_timeout * 1000:
            raise ValueError(
                f"are inconsistent: wait_timeout_ms={self.wait_timeout_ms} is not shorter than "
                f"socket_timeout={self.socket_timeout:g} s; lower wait_timeout_ms or raise socket_timeout"
            )
        return self


@dataclass(frozen=True)
class RedisConfig:
    """What a Redis URL and its options select.

    Attributes:
        url: the URL handed to redis-py (chatkeep's own query options removed).
        settings: the store's options (:class:`RedisSettings`).
        transport: the driver that carries the commands: ``settings.transport`` when given, else the fastest that
            serves the URL: ``resp`` (the store's own connection, standalone servers, hiredis) or ``redis-py``
            (every URL); see :mod:`chatkeep.redis._transport`.
        cluster: connect with the Redis Cluster client (``redis+cluster://``).
        startup_nodes: for a cluster, every ``(host, port)`` the URL names.
        given_url: the URL as the caller wrote it (shown, redacted, in messages).
    """

    url: str
    settings: RedisSettings
    transport: TransportName
    cluster: bool = False
    startup_nodes: tuple[tuple[str, int], ...] = field(default=())
    given_url: str = ""

    @property
    def shown_url(self) -> str:
        """The URL as given, with its password hidden, for messages and logs."""
        return redact_url(self.given_url or self.url)

    @property
    def address(self) -> str:
        """Where the server is (``host:port``, the socket path, or the cluster's startup nodes), for messages."""
        if self.startup_nodes:
            return ", ".join(f"{host}:{port}" for host, port in self.startup_nodes)
        host, port = self.endpoint
        return host if port is None else f"{host}:{port}"

    @property
    def endpoint(self) -> tuple[str, int | None]:
        """The server's host and port (a cluster's first startup node), or a Unix socket's path and ``None``."""
        if self.startup_nodes:
            return self.startup_nodes[0]
        parts = urlsplit(self.url)
        if parts.scheme == "unix":
            return parts.path, None
        return parts.hostname or "localhost", parts.port or 6379


def parse_url(url: str, *, handed_in: bool = False, **options: Any) -> RedisConfig:
    """Read a Redis URL, e.g. ``redis://[[user]:password@]host[:port][/db][?prefix=P&ttl=S&keep_last=N&wait_replicas=1]``.

    ``redis+cluster://host:port[,host:port...]`` connects to a Redis Cluster, ``unix:///path/redis.sock?db=0``
    to a socket. Keyword options override the query; ``None`` means "not given". ``handed_in``: the store runs
    on a redis-py client handed to it, so its transport is ``redis-py``.

    Raises:
        RedisURLError: the scheme is not a Redis one, or an option is unknown (neither chatkeep's nor
            redis-py's) or malformed.
    """
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise RedisURLError(f"{shown!r} is not a valid Redis URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES or not url[len(parts.scheme) :].startswith("://"):
        raise RedisURLError(
            f"{shown!r} is not a Redis URL; write redis://HOST:PORT/DB, rediss://..., unix:///PATH or "
            "redis+cluster://HOST:PORT[,HOST:PORT...]"
        )
    if parts.fragment:
        raise RedisURLError(f"{shown!r} has a fragment (#...); remove it")
    settings = RedisSettings.parse(parts.query, options, url=url, driver=_REDIS_PY)
    nodes: tuple[tuple[str, int], ...] = ()
    cluster = scheme == "redis+cluster"
    netloc = parts.netloc
    if cluster:
        userinfo, _, hosts = netloc.rpartition("@")
        nodes = tuple(_host_port(item, shown) for item in hosts.split(",") if item)
        if not nodes:
            raise RedisURLError(f"{shown!r} names no cluster node; write redis+cluster://HOST:PORT[,HOST:PORT...]")
        if parts.path.strip("/") not in ("", "0"):
            raise RedisURLError(f"{shown!r} selects database {parts.path.strip('/')!r}; a Redis Cluster has only db 0")
        netloc = (userinfo + "@" if userinfo else "") + f"{nodes[0][0]}:{nodes[0][1]}"
        scheme = "redis"
    elif scheme != "unix":
        try:
            parts.port  # noqa: B018 - urlsplit checks the port only when asked
        except ValueError:
            raise RedisURLError(f"{shown!r} has an invalid port; write HOST:PORT with a number") from None
        db = parts.path.strip("/")
        if db and not db.isdigit():
            raise RedisURLError(f"{shown!r} selects database {db!r}; the path must be a database number like /0")
    # Built by hand: urlunsplit drops the "//" of unix:///path.
    query = urlencode(settings.driver_query)
    driver_url = f"{scheme}://{netloc}{'' if cluster else parts.path}{'?' + query if query else ''}"
    return RedisConfig(
        url=driver_url,
        settings=settings,
        transport=_choose_transport(settings.transport, driver_url, cluster=cluster, handed_in=handed_in, shown=shown),
        cluster=cluster,
        startup_nodes=nodes,
        given_url=url,
    )


def _choose_transport(
    asked: TransportName | None, driver_url: str, *, cluster: bool, handed_in: bool, shown: str
) -> TransportName:
    """The transport asked for, or the fastest that serves the URL (``resp`` where it can, else ``redis-py``)."""
    if asked == "redis-py" or (asked is None and (cluster or handed_in)):
        return "redis-py"
    from chatkeep.redis._resp import resp_target

    try:
        if cluster:
            raise ValueError("it speaks to a standalone server, not a Redis Cluster")
        if handed_in:
            raise ValueError("the store runs on the redis-py client handed to it")
        resp_target(driver_url)
    except ValueError as exc:
        if asked is None:
            return "redis-py"
        raise RedisURLError(
            f"the Redis store option transport=resp cannot serve {shown!r}: {exc}; use transport=redis-py, "
            "or leave the option out for the fastest transport that serves the URL"
        ) from None
    return "resp"


def _host_port(item: str, shown: str) -> tuple[str, int]:
    host, _, port = item.strip().rpartition(":")
    if not host:
        host, port = port, "6379"
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isdigit() or not host:
        raise RedisURLError(f"{shown!r} names the cluster node {item!r}; write HOST:PORT with a number")
    return host, int(port)
