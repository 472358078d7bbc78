"""Parsing ``redis://``, ``rediss://``, ``unix://`` and ``redis+cluster://`` URLs and the store's options."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from chatkeep.core import DEFAULT_MAX_MESSAGE_BYTES, StoreConfigurationError, redact_url

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_PREFIX",
    "DEFAULT_SOCKET_TIMEOUT",
    "RedisConfig",
    "RedisURLError",
    "parse_url",
]

DEFAULT_PREFIX = "chatkeep"
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_SOCKET_TIMEOUT = 10.0

_SCHEMES = ("redis", "rediss", "unix", "redis+cluster")
# chatkeep's own options; any other query option goes to redis-py (socket_keepalive, client_name, ssl_*...).
_OPTIONS = ("prefix", "ttl", "max_messages", "max_message_bytes", "socket_timeout", "connect_timeout")
_NUMBERS: dict[str, type] = {
    "ttl": float,
    "max_messages": int,
    "max_message_bytes": int,
    "socket_timeout": float,
    "connect_timeout": float,
}


class RedisURLError(StoreConfigurationError):
    """A Redis store URL or one of its options is malformed."""


@dataclass(frozen=True)
class RedisConfig:
    """What a Redis URL and its options select.

    Attributes:
        url: the URL handed to redis-py (chatkeep's own query options removed).
        cluster: connect with the Redis Cluster client (``redis+cluster://``).
        prefix: every key this store writes starts with ``PREFIX:``; stores with other prefixes never meet.
        ttl: seconds an idle session lives (``None``: forever); every write restarts it.
        max_messages: keep at most this many newest messages per session, trimmed in the same step as an append.
        max_message_bytes: the largest message record accepted, in UTF-8 bytes.
        socket_timeout: seconds a command may wait for the server before the call fails.
        connect_timeout: seconds a connection attempt may take before the call fails.
        startup_nodes: for a cluster, every ``(host, port)`` the URL names.
        given_url: the URL as the caller wrote it (shown, redacted, in messages).
    """

    url: str
    cluster: bool = False
    prefix: str = DEFAULT_PREFIX
    ttl: float | timedelta | None = None
    max_messages: int | None = None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    socket_timeout: float = DEFAULT_SOCKET_TIMEOUT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
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
        parts = urlsplit(self.url)
        if parts.scheme == "unix":
            return parts.path
        return f"{parts.hostname or 'localhost'}:{parts.port or 6379}"


def check_prefix(prefix: object) -> str:
    """Validate a key prefix: non-empty text without ``{`` or ``}`` (they would change the cluster hash tag)."""
    if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
        raise RedisURLError(
            f"the Redis store prefix must be non-empty text without braces, got {prefix!r}; "
            "braces would move keys to other cluster slots"
        )
    return prefix


def parse_url(url: str, **options: Any) -> RedisConfig:
    """Read a Redis URL, e.g. ``redis://[[user]:password@]host[:port][/db][?prefix=P&ttl=S&max_messages=N]``.

    ``redis+cluster://host:port[,host:port...]`` connects to a Redis Cluster, ``unix:///path/redis.sock?db=0``
    to a socket. Keyword options override the query; ``None`` means "not given".

    Raises:
        RedisURLError: the scheme is not a Redis one, or an option is malformed.
        TypeError: an unknown keyword option.
    """
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(
            f"Redis stores take no option {', '.join(unknown)}; the options are {', '.join(_OPTIONS)} "
            "(other redis-py settings go in the URL query)"
        )
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
    ours: dict[str, Any] = {}
    passed: list[tuple[str, str]] = []
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise RedisURLError(f"the query of {shown!r} is malformed; write ?name=value&name=value") from None
    for name, value in pairs:
        if name in _NUMBERS:
            ours[name] = _number(name, value)
        elif name == "prefix":
            ours[name] = value
        else:
            passed.append((name, value))
    ours.update({name: value for name, value in options.items() if value is not None})

    prefix = check_prefix(ours.get("prefix", DEFAULT_PREFIX))
    max_bytes = ours.get("max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise RedisURLError(
            f"the Redis store option max_message_bytes must be a positive whole number, got {max_bytes!r}"
        )
    max_messages = ours.get("max_messages")
    if max_messages is not None and (
        isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1
    ):
        raise RedisURLError(
            f"the Redis store option max_messages must be a positive whole number (or absent), got {max_messages!r}"
        )
    timeouts = {}
    for name, default in (("socket_timeout", DEFAULT_SOCKET_TIMEOUT), ("connect_timeout", DEFAULT_CONNECT_TIMEOUT)):
        value = ours.get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise RedisURLError(f"the Redis store option {name} must be a positive number of seconds, got {value!r}")
        timeouts[name] = float(value)

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
    query = urlencode(passed)
    driver_url = f"{scheme}://{netloc}{'' if cluster else parts.path}{'?' + query if query else ''}"
    return RedisConfig(
        url=driver_url,
        cluster=cluster,
        prefix=prefix,
        ttl=ours.get("ttl"),
        max_messages=max_messages,
        max_message_bytes=max_bytes,
        socket_timeout=timeouts["socket_timeout"],
        connect_timeout=timeouts["connect_timeout"],
        startup_nodes=nodes,
        given_url=url,
    )


def _host_port(item: str, shown: str) -> tuple[str, int]:
    host, _, port = item.strip().rpartition(":")
    if not host:
        host, port = port, "6379"
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isdigit() or not host:
        raise RedisURLError(f"{shown!r} names the cluster node {item!r}; write HOST:PORT with a number")
    return host, int(port)


def _number(name: str, text: str) -> float | int:
    try:
        return _NUMBERS[name](text)  # type: ignore[no-any-return]
    except ValueError:
        kind = "a whole number" if _NUMBERS[name] is int else "a number of seconds"
        raise RedisURLError(f"the Redis store option {name}={text!r} must be {kind}") from None
