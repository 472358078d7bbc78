"""The Redis history store: plain commands and Lua, on standalone Redis, Redis Cluster and Valkey.

Where each session's data lives (key names, hash tags, the tenant index) is in :mod:`chatkeep.redis._layout`.
"""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn

from chatkeep.core import (
    AgentSession,
    BackendHistoryProvider,
    ForkInfo,
    Message,
    ReplicationTimeoutError,
    SessionInfo,
    SessionKey,
    SessionPage,
    StoreConfigurationError,
    StoreUnavailableError,
)
from chatkeep.core.backend import (
    ABSENT,
    Absent,
    HistoryStore,
    PerLoop,
    SessionUsage,
    StoredSession,
    TelemetryTarget,
    conflict_error,
    decode_cursor,
    decode_records,
    decode_session_document,
    encode_cursor,
    fork_source_error,
    fork_target_exists_error,
    owner_error,
    redact_url,
    session_document,
    stamp_time,
    time_stamp,
    usage_of,
    write_stamp,
)
from chatkeep.redis import _layout, _replicas, _scripts
from chatkeep.redis._config import parse_url
from chatkeep.redis._scripts import Script
from chatkeep.redis._transport import ConnectTimeoutError, RedisTransport
from redis import exceptions as redis_errors

if TYPE_CHECKING:
    from chatkeep.redis._redispy import RedisClient

__all__ = ["RedisHistoryProvider", "RedisHistoryStore", "open_store"]

_SCAN_BATCH = 500
# How many tenants list_tenants checks at once.
_TENANT_PROBES = 16
_POP_RECEIPT_MS = 60_000  # longer than any retry of the command takes (see _scripts.POP)
# What the driver raises: its own errors (RedisClusterException is not a RedisError), sockets, timeouts.
_DRIVER_ERRORS = (redis_errors.RedisError, redis_errors.RedisClusterException, OSError, asyncio.TimeoutError)

# What a caller can do after a ReplicationTimeoutError, per write.
_RETRY_APPEND = (
    "Retrying the same append is safe: appends are idempotent by message_id, so it adds nothing twice and waits "
    "for the replicas again."
)
_RETRY_POP = (
    "Do not retry the pop: it would remove the next message. The message it removed is the error's popped attribute."
)
_RETRY_SAVE = (
    "The new version is stored: load the session (load_session) before saving it again, since a retry with the "
    "same expected_version raises ConcurrencyConflictError."
)
_RETRY_FORK = (
    "Do not retry the fork: the target exists now, so a retry raises ConcurrencyConflictError; load the target "
    "to use it."
)
#: The session hash's fields a listing reads (``_info_of`` decodes them); ``updated`` only stands in for a missing
#: index entry.
_INFO_FIELDS = ("created", "usage", "title", "meta", "src", "thru", "log", "segs", "updated")
_RETRY_INFO = "Retrying the same update_info is safe: it sets the same title, tags and metadata again."


class RedisHistoryStore(HistoryStore):
    """A :class:`~chatkeep.core.HistoryStore` on Redis, Redis Cluster or Valkey (plain commands and Lua only).

    Every append is one Lua script: idempotent by ``message_id`` (for messages still stored: the ids of
    trimmed or deleted messages are forgotten), contiguous under concurrent writers, refreshing the TTL and
    trimming to ``keep_last`` in the same atomic step. ``load(last=k)`` reads only the k newest records.

    Every command goes through one transport (:mod:`chatkeep.redis._transport`): ``resp``, the store's own
    pipelined asyncio connection (standalone ``redis://`` and ``unix://`` URLs, hiredis installed; the default
    there), or ``redis-py`` (every URL: TLS, redis-py's query options, Redis Cluster, a client handed in).

    Args:
        url: ``redis://``, ``rediss://``, ``unix://`` or ``redis+cluster://`` (see :func:`open_store`); ``None``
            means ``redis://localhost:6379/0``. Only its options count when ``client`` is given.
        client: an existing ``redis.asyncio.Redis`` or ``RedisCluster`` (with ``decode_responses=False``);
            the store uses it and leaves it open when closed.
        **options: the URL's options as keywords: ``prefix`` (the first segment of every key; stores on other
            prefixes never meet), ``ttl`` (seconds or a ``timedelta`` an idle session lives; each write restarts
            it), ``keep_last`` (keep at most this many newest messages per session, trimmed in the append
            itself), ``max_message_bytes``, ``socket_timeout`` and ``connect_timeout`` (seconds),
            ``wait_replicas`` (replicas that must have each write of ``append``, ``pop``, ``save_session``,
            ``fork`` and ``update_info`` before it returns,
            by Redis ``WAIT`` on the write's connection; default 0) and ``wait_timeout_ms`` (how long they may
            take, default 1000; then ``ReplicationTimeoutError``), ``transport`` (``resp`` or ``redis-py``;
            default the fastest that serves the URL).

    Raises:
        RedisURLError: the URL or an option is malformed, or an option is neither chatkeep's nor redis-py's.
    """

    creates_if_absent = True

    def __init__(self, url: str | None = None, *, client: RedisClient | None = None, **options: Any) -> None:
        config = parse_url(url or "redis://localhost:6379/0", handed_in=client is not None, **options)
        settings = config.settings
        super().__init__(max_message_bytes=settings.max_message_bytes)
        self.config = config
        self.prefix = settings.prefix
        self.ttl = settings.ttl
        self.keep_last = settings.keep_last
        self._ttl_ms = 0 if self.ttl is None else max(1, math.ceil(self.ttl * 1000))
        self._cap = self.keep_last or 0
        self._owns_client = client is None
        # A client handed in without a URL connects where it was made to: the default URL would name a guess.
        self._knows_server = url is not None or client is None
        # A client handed in is its owner's, on its one event loop; one the store makes is made per loop.
        self._link: RedisTransport | None = None
        self._links: PerLoop[RedisTransport] = PerLoop(self._new_link, close=_close_link, abandon=_abandon_link)
        self.serves_any_loop = client is None
        self._cluster = config.cluster
        if client is not None:
            from chatkeep.redis._redispy import RedisPyTransport, decodes_responses

            if decodes_responses(client):
                raise StoreConfigurationError(
                    "the Redis client decodes responses (decode_responses=True); chatkeep reads records as bytes, "
                    "so hand it a client made with decode_responses=False"
                )
            self._link = RedisPyTransport(config, client)
            self._cluster = self._link.cluster
        self._tenants_key = f"{self.prefix}:tenants"
        # With wait_replicas, every write of append, pop, save_session, fork and update_info is followed by this.
        self._wait = ("WAIT", settings.wait_replicas, settings.wait_timeout_ms) if settings.wait_replicas else None
        self._messages_read = 0
        self.bytes_read = 0

    # -- connection ------------------------------------------------------------------------------

    @property
    def transport(self) -> str:
        """The transport that carries the store's commands: ``resp`` or ``redis-py``."""
        return self.config.transport

    def _telemetry_target(self) -> TelemetryTarget:
        """``redis``, at the URL's server (a cluster's first startup node)."""
        if not self._knows_server:
            return TelemetryTarget("redis")
        return TelemetryTarget("redis", *self.config.endpoint)

    def _transport(self) -> RedisTransport:
        """The transport of the running event loop (a client handed in: the one transport on it)."""
        return self._link or self._links.get()

    def _new_link(self) -> RedisTransport:
        config = self.config
        if config.transport == "resp":
            from chatkeep.redis._resp import RespTransport, resp_target

            return RespTransport(
                resp_target(config.url),
                address=config.address,
                socket_timeout=config.settings.socket_timeout,
                connect_timeout=config.settings.connect_timeout,
            )
        from chatkeep.redis._redispy import RedisPyTransport

        return RedisPyTransport(config)

    def _one_loop_reason(self) -> str:
        return "it runs on the Redis client handed to it (client=), whose connections belong to one loop"

    async def _aclose(self) -> None:
        await self._links.aclose()
        link, self._link = self._link, None
        if link is not None:
            await link.aclose()  # a client handed in stays open

    def _unavailable(self, exc: BaseException) -> NoReturn:
        where = self.config.address if self._owns_client else "the Redis client handed to the store"
        unreachable = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError, asyncio.TimeoutError)
        if "CERTIFICATE_VERIFY_FAILED" in str(exc) or "SSL" in type(exc).__name__:
            hint = (
                "the TLS handshake failed: trust the server's CA with ?ssl_ca_certs=/path/ca.pem in the URL, "
                "and check that the certificate names the host you connect to"
            )
            what = f"cannot reach Redis at {where}"
        elif isinstance(exc, ConnectTimeoutError):
            hint = (
                f"no answer within connect_timeout={exc.seconds:g} s: check that the URL's host and port are the "
                "server's and that it is not stuck; on a slow network raise it, e.g. ?connect_timeout=15"
            )
            what = f"cannot reach Redis at {where}"
        elif isinstance(exc, redis_errors.TimeoutError):
            seconds = self.config.settings.socket_timeout
            hint = (
                f"no reply within socket_timeout={seconds:g} s: the server is stuck or overloaded (check its "
                "SLOWLOG and latency), or unreachable; for slower commands raise it, e.g. ?socket_timeout=30"
            )
            what = f"Redis at {where} did not answer"
        elif isinstance(exc, unreachable) or "reachable node" in str(exc):
            hint = "check that the server is running and reachable, and the URL's host, port and password"
            what = f"cannot reach Redis at {where}"
        else:
            hint = "the server refused the command; check its logs and that it runs Redis 6.2 or later (or Valkey)"
            what = f"Redis at {where} failed"
        detail = redact_url(str(exc)) or type(exc).__name__
        raise StoreUnavailableError(f"{what} ({self.config.shown_url}): {detail}; {hint}") from exc

    async def _call(self, *args: Any) -> Any:
        """One command's reply (a failure raises ``StoreUnavailableError``)."""
        try:
            return await self._transport().call(*args)
        except _DRIVER_ERRORS as exc:
            self._unavailable(exc)

    async def _pipeline(self, commands: Sequence[Sequence[Any]], *, key: str | None = None) -> list[Any]:
        """Commands in one write on one connection (on a cluster with ``key``, the primary owning it); replies in order.

        A server error reply raises ``StoreUnavailableError``, as a failure does.
        """
        try:
            replies = await self._transport().pipeline(commands, key=key)
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        except _DRIVER_ERRORS as exc:
            self._unavailable(exc)
        return replies

    async def _run_script(
        self, script: Script, keys: Sequence[str], args: Sequence[Any], wait: Sequence[Any] | None = None
    ) -> Any:
        """A script's reply, by ``EVALSHA``; by ``EVAL`` (which caches it) where the server does not know it.

        With ``wait`` (a ``WAIT`` command), it follows the script in one write on one connection, and the result
        is both replies.
        """
        link = self._transport()

        async def send(command: Sequence[Any]) -> Any:
            if wait is None:
                return await link.call(*command)
            replies = await link.pipeline((command, wait), key=keys[0])
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            return replies

        try:
            try:
                return await send(("EVALSHA", script.sha, len(keys), *keys, *args))
            except redis_errors.NoScriptError:
                # A restarted or flushed server, or another cluster node.
                return await send(("EVAL", script.source, len(keys), *keys, *args))
        except _DRIVER_ERRORS as exc:
            self._unavailable(exc)

    async def _script(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return await self._run_script(script, keys, args)

    async def _scripts(self, script: Script, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
        """Run a script for many keys in one pipeline (non-transactional: each call is atomic on its own)."""
        if not calls:
            return []
        try:
            commands = [("EVALSHA", script.sha, len(keys), *keys, *args) for keys, args in calls]
            results = await self._transport().pipeline(commands)
        except _DRIVER_ERRORS as exc:
            self._unavailable(exc)
        for n, result in enumerate(results):
            if isinstance(result, redis_errors.NoScriptError):
                results[n] = await self._script(script, *calls[n])  # by EVAL, once per node that lacks it
            elif isinstance(result, Exception):
                self._unavailable(result)
        return results

    async def _write_script(
        self, script: Script, keys: Sequence[str], args: Sequence[Any], *, earlier: Sequence[int] = ()
    ) -> tuple[Any, int | None]:
        """A script that writes, followed by ``WAIT`` on its connection with ``wait_replicas``.

        Returns:
            The script's reply, and how many replicas have this call's writes (the fewest of the script's and
            ``earlier``, the counts of the writes before it); ``None`` without ``wait_replicas``.
        """
        if self._wait is None:
            return await self._run_script(script, keys, args), None
        reply, acknowledged = await self._run_script(script, keys, args, self._wait)
        return reply, min([int(acknowledged), *earlier])

    def _check_replicas(self, acknowledged: int | None, *, what: str, retry: str) -> None:
        """Raise ``ReplicationTimeoutError`` when fewer than ``wait_replicas`` replicas have the call's writes."""
        if acknowledged is not None:
            settings = self.config.settings
            _replicas.check_replicas(
                acknowledged, settings.wait_replicas, settings.wait_timeout_ms,
                where=self.config.address, what=what, retry=retry,
            )  # fmt: skip

    async def _touch_indexes(
        self, tenant: str, session_id: str, index: str, now: int, tags: frozenset[str] | None = None
    ) -> list[int]:
        """Update the tenants' index, and the tenant's index and tag indexes (before the session: see the layout).

        With ``tags``, the session's tags are replaced by them (``update_info``).

        Returns:
            With ``wait_replicas``, how many replicas have each update (checked with the session's write).
        """
        tenant_keys = (index, _layout.tags_map(self.prefix, tenant))
        args: tuple[Any, ...]
        if tags is None:
            script, args = _scripts.TOUCH_TENANT, (now, session_id)
        else:
            script, args = _scripts.SET_TAGS, (now, session_id, json.dumps(sorted(tags), ensure_ascii=False))
        command = ("ZADD", self._tenants_key, "GT", now, tenant)
        if self._wait is None:
            writes = [self._call(*command), self._run_script(script, tenant_keys, args)]
        else:  # each on the node that owns it, waiting there for its replicas
            writes = [
                self._pipeline((command, self._wait), key=self._tenants_key),
                self._run_script(script, tenant_keys, args, self._wait),
            ]
        # Both finish before either failure is raised: no task is left behind with an error nobody reads.
        outcomes: list[Any] = await asyncio.gather(*writes, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return [] if self._wait is None else [int(acknowledged) for _, acknowledged in outcomes]

    # -- messages --------------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """What this store is, for logs and the CLI (no secrets)."""
        return {
            "type": type(self).__name__,
            "url": self.config.shown_url if self._owns_client else "(client handed in)",
            "cluster": self._cluster,
            "transport": self.transport,
            "prefix": self.prefix,
            "ttl": self.ttl,
            "keep_last": self.keep_last,
            "wait_replicas": self.config.settings.wait_replicas,
        }

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.config.shown_url} prefix={self.prefix!r}{' closed' if self.closed else ''}>"
        )

    @property
    def messages_read(self) -> int:
        """How many message records this store has read (the conformance kit's read probe)."""
        return self._messages_read

    def _keys(self, key: SessionKey) -> tuple[tuple[str, str, str, str], tuple[str, ...]]:
        """The session's keys (hash, messages, ids, usage), and the indexes its scripts update themselves.

        Standalone, a script that writes updates the tenant's index, the tenants' index and the tag indexes in
        the same step; on a cluster those live on other nodes, and the store updates them apart (none here).
        """
        h, m, i, index = _layout.session_keys(self.prefix, key.tenant, key.session_id)
        own = (h, m, i, _layout.usage_key(h))
        if self._cluster:
            return own, ()
        return own, (index, self._tenants_key, _layout.tags_map(self.prefix, key.tenant))

    async def _append(self, key: SessionKey, messages: Sequence[Message], records: Sequence[str]) -> int:
        """Append in one atomic script, skipping ids already stored; returns how many were new.

        The script adds each new message's usage (core's ``usage_of``, as JSON) to the session's in the same step.
        """
        own, indexes = self._keys(key)
        now = write_stamp()
        args = [now, self._ttl_ms, self._cap, len(records), key.tenant, key.session_id, int(self._wait is not None)]
        args += [message.message_id for message in messages]
        args += records
        args += [_usage_json(message) for message in messages]
        earlier: list[int] = []
        if self._cluster:
            index = _layout.tenant_index(self.prefix, key.tenant)
            earlier = await self._touch_indexes(key.tenant, key.session_id, index, now)
        keys = (*own, *indexes)
        checked: list[Any] = [""]
        while True:
            added, acknowledged = await self._write_script(_scripts.APPEND, keys, [*args, *checked], earlier=earlier)
            if not isinstance(added, list):
                break
            if added[0] == b"trim":  # keep_last cuts into messages a fork shares: a trim does it right
                added = int(added[1])
                await self._trim(key, self._cap)
                break
            # A fork: the ids it holds from earlier logs are checked there (those ranges never change).
            segments = _segments(added[1])
            checked = [added[1], *await self._held_ids(segments, [message.message_id for message in messages])]
            await self._keep_alive([segment.records for segment in segments])
        self._check_replicas(acknowledged, what="append", retry=_RETRY_APPEND)
        return int(added)

    async def _held_ids(self, segments: list[_Segment], ids: list[str]) -> list[str]:
        """Which of ``ids`` the segments hold (within their bounds): one ``ZMSCORE`` per segment."""
        if not segments or not ids:
            return []
        replies = await self._pipeline([("ZMSCORE", segment.ids, *ids) for segment in segments])
        held: set[str] = set()
        for segment, scores in zip(segments, replies, strict=True):
            held.update(i for i, score in zip(ids, scores, strict=True) if segment.holds(score))
        return sorted(held)

    async def _keep_alive(self, logs: Sequence[str | bytes]) -> None:
        """Make the logs a fork refers to (their records keys) live at least as long as the fork (a write of it
        restarts its TTL). The scripts lengthen those of the session's own slot; a write other than an append
        returns the others (``far``: see ``_scripts``).
        """
        if not logs:
            return
        keys = [k for log in logs for k in _layout.log_keys(log if isinstance(log, str) else log.decode())]
        if self._ttl_ms:
            await self._pipeline([("PEXPIRE", k, self._ttl_ms, "GT") for k in keys])
        else:
            await self._pipeline([("PERSIST", k) for k in keys])

    async def _read_segments(self, segments: Sequence[_Segment], last: int | None) -> list[bytes]:
        """The records of ``segments`` in order (with ``last``, only that many of the newest)."""
        spans: list[tuple[_Segment, int, int]] = []
        want = math.inf if last is None else last
        for segment in reversed(segments):
            if want <= 0:
                break
            low = segment.low if last is None else max(segment.low, segment.high - int(want) + 1)
            spans.append((segment, low, segment.high))
            want -= segment.high - low + 1
        if not spans:
            return []
        spans.reverse()
        replies = await self._pipeline([("LRANGE", s.records, low - s.head, high - s.head) for s, low, high in spans])
        return [record for reply in replies for record in reply]

    def _decode(self, records: list[bytes]) -> list[Message]:
        self._messages_read += len(records)
        self.bytes_read += sum(map(len, records))
        return decode_records(records)

    async def _load(self, key: SessionKey, last: int | None) -> list[Message]:
        """The history in append order; with ``last=k`` only the k newest (one ``LRANGE`` of k records).

        The ``LRANGE`` goes with a look at the hash in one round trip: when the session is a fork or its log is
        shared (renamed), the ``VIEW`` script reads its own log and the segments give the rest, newest first.
        """
        own, _ = self._keys(key)
        h, m = own[0], own[1]
        records, (log, segs) = await self._pipeline(
            (("LRANGE", m, 0 if last is None else -last, -1), ("HMGET", h, "log", "segs")), key=h
        )
        if log is not None or segs is not None:
            reply = await self._script(_scripts.VIEW, own, (-1 if last is None else last,))
            segments, records = _segments(reply[0]), reply[2:]
            if last is None or len(records) < last:
                more = None if last is None else last - len(records)
                records = [*await self._read_segments(segments, more), *records]
        return self._decode(records) if records else []

    async def _load_before(self, key: SessionKey, before: int, last: int | None) -> list[Message]:
        """The range ending before position ``before``: the ``RANGE`` script, then the segments it overlaps.

        Cost: one script that clamps the range to the count and reads its records in the session's own log with one
        ``LRANGE`` (Redis walks a list from its nearer end: O(offset + range)); on a fork, one more round trip with
        an ``LRANGE`` per segment the range overlaps. Only the range's records are sent and decoded.
        """
        own, _ = self._keys(key)
        reply = await self._script(_scripts.RANGE, own, (before, -1 if last is None else last))
        start, stop, records = int(reply[1]), int(reply[2]), reply[3:]
        spans, position = [], 0
        for segment in _segments(reply[0]):
            low, high = max(start, position), min(stop, position + segment.size)
            if high > low:
                first = segment.low - segment.head - position
                spans.append(("LRANGE", segment.records, first + low, first + high - 1))
            position += segment.size
        if spans:
            records = [record for found in await self._pipeline(spans) for record in found] + records
        return self._decode(records) if records else []

    async def _iter_messages(self, key: SessionKey, batch: int) -> AsyncIterator[Message]:
        """Iterate over the history in append order, ``batch`` records per read (resuming by sequence number)."""
        own, _ = self._keys(key)
        seq, created, first = -1, b"", True
        while True:
            reply = await self._script(_scripts.PAGE, own, (seq, batch, created))
            if not reply[0]:
                return  # gone, or deleted and re-created while we read
            created, seq, records = reply[0], int(reply[1]), reply[3:]
            if first and reply[2]:  # a fork: the messages of its segments come first, then its own log's
                for segment in _segments(reply[2]):
                    for low in range(segment.low, segment.high + 1, batch):
                        high = min(low + batch - 1, segment.high)
                        page = await self._call("LRANGE", segment.records, low - segment.head, high - segment.head)
                        for message in self._decode(page):
                            yield message
                seq = -1
                first = False
                continue
            first = False
            if not records:
                return
            for message in self._decode(records):
                yield message

    async def _count(self, key: SessionKey) -> int:
        own, _ = self._keys(key)
        length, (log, segs) = await self._pipeline((("LLEN", own[1]), ("HMGET", own[0], "log", "segs")), key=own[0])
        if log is None and segs is None:
            return int(length)
        reply = await self._script(_scripts.VIEW, own, (0,))
        return int(reply[1]) + sum(segment.size for segment in _segments(reply[0]))

    async def _delete(self, key: SessionKey) -> bool:
        """Delete the session's messages, ids, usage, document and info; ``True`` if anything was there."""
        own, _ = self._keys(key)
        deleted = await self._script(_scripts.DELETE, own, ())
        if deleted is None:
            return False
        await self._release(deleted[1:])
        await self._script(_scripts.DROP_INDEX_ENTRY, self._tenant_keys(key.tenant), (key.session_id, int(deleted[0])))
        return True

    async def _release(self, logs: Sequence[bytes]) -> None:
        """Drop a session's holds on logs in other slots (its scripts drop those in its own): the last frees a log."""
        if logs:
            await self._scripts(_scripts.RELEASE, [(_layout.log_keys(log.decode()), ()) for log in logs])

    def _tenant_keys(self, tenant: str) -> tuple[str, str]:
        """The tenant's index and its tags (what ``DROP_INDEX_ENTRY`` takes to drop a session and its tags)."""
        return _layout.tenant_index(self.prefix, tenant), _layout.tags_map(self.prefix, tenant)

    async def _trim(self, key: SessionKey, keep_last: int) -> int:
        """Delete all but the ``keep_last`` newest messages (and forget their ids); returns how many.

        A trim that deletes is a write, as a pop is: it stamps the session, moves it in the indexes and
        restarts the TTL. One that deletes nothing changes nothing, so on a cluster the indexes are updated
        after the script, and only when it deleted (the session exists then, so it has its entry already).
        """
        own, indexes = self._keys(key)
        now = write_stamp()
        args = (keep_last, self._ttl_ms, now, key.tenant, key.session_id)
        planned: list[Any] = ["", ""]
        while (reply := await self._script(_scripts.TRIM, (*own, *indexes), (*args, *planned)))[0] == b"need":
            # It removes messages a fork holds from another session's log: their usage is read there.
            segments, over = _segments(reply[1]), int(reply[2])
            spans = [span for span in _oldest(segments, over) if not _same_slot(span[0].usage, own[0])]
            planned = [reply[1], over, *await self._usages(spans)]
        removed = int(reply[0])
        if removed:  # {how many, k, k logs of other slots to release, far...}
            released = 2 + int(reply[1])
            await self._release(reply[2:released])
            await self._keep_alive(reply[released:])
        if removed and self._cluster:
            index = _layout.tenant_index(self.prefix, key.tenant)
            await self._touch_indexes(key.tenant, key.session_id, index, now)
        return removed

    async def _pop(self, key: SessionKey) -> Message | None:
        """Remove the newest record and its id in one script (a retry of it returns the same record)."""
        own, indexes = self._keys(key)
        receipt = _layout.pop_receipt(own[0], uuid.uuid4().hex)
        now = write_stamp()
        args = (now, self._ttl_ms, _POP_RECEIPT_MS, key.tenant, key.session_id)
        earlier: list[int] = []
        if self._cluster:
            index = _layout.tenant_index(self.prefix, key.tenant)
            earlier = await self._touch_indexes(key.tenant, key.session_id, index, now)
        keys = (*own, receipt, *indexes)
        inherited: tuple[Any, ...] = ("", "", "", "")
        while True:
            record, acknowledged = await self._write_script(_scripts.POP, keys, (*args, *inherited), earlier=earlier)
            if isinstance(record, list) and record[0] == b"after":  # work in other slots: a log to release, or
                await self._release([log for log in record[2:3] if log])  # keep alive (a fork's, under a TTL)
                await self._keep_alive(record[3:])
                record = record[1]
            if not isinstance(record, list):
                break
            # The newest message is a fork's, in another session's log: read it (and its usage) there.
            _, records, usage, seq, head = record
            seq, head = int(seq), int(head)
            found, used = await self._pipeline(
                (("LINDEX", records, seq - head), ("ZRANGEBYSCORE", usage, seq, seq)), key=records
            )
            inherited = (records, seq, found or b"", _usage_part(used[0]) if used else "")
        popped = None if record is None else self._decode([record])[0]
        try:
            self._check_replicas(acknowledged, what="pop", retry=_RETRY_POP)
        except ReplicationTimeoutError as exc:
            exc.popped = popped  # removed on the primary: the caller still gets it
            raise
        return popped

    async def _usages(self, spans: Sequence[tuple[_Segment, int, int]]) -> list[str]:
        """The per-message usages kept for the given spans of segments (their logs' usage sets)."""
        if not spans:
            return []
        replies = await self._pipeline([("ZRANGEBYSCORE", s.usage, low, high) for s, low, high in spans])
        return [_usage_part(row) for reply in replies for row in reply]

    async def _fork(self, source: SessionKey, target: SessionKey, through: str | None) -> int:
        """Share the source's log up to the cut (``FORK_SOURCE``), then create the target on it (``FORK_TARGET``).

        Nothing is copied: the target's hash lists the segments of logs it holds, and each of those logs counts
        the target among its holders before the target exists (see ``_scripts``); a target that exists already
        gives its holds back. With ``wait_replicas``, every write of the fork waits for the replicas.
        """
        reply, acknowledged = await self._share(source, through)
        _, taken, cut, usage, title, metadata, through_id = reply
        segments = _segments(taken)
        try:
            await self._keep_alive([segment.records for segment in segments])
            tags = await self._call("HGET", _layout.tags_map(self.prefix, source.tenant), source.session_id)
            own, indexes = self._keys(target)
            now = write_stamp()
            args = (
                now, self._ttl_ms, target.tenant, target.session_id, taken, int(cut) + 1, usage, title, metadata,
                source.session_id, through_id,
            )  # fmt: skip
            created, ack = await self._write_script(_scripts.FORK_TARGET, (*own, *indexes), args)
        except Exception:
            await self._release([segment.records.encode() for segment in segments])
            raise
        acknowledged.extend(() if ack is None else (ack,))
        if not int(created):
            await self._release([segment.records.encode() for segment in segments])
            raise fork_target_exists_error(target)
        if self._cluster or tags is not None:  # a fork is a write of the target; it starts with the source's tags
            index = _layout.tenant_index(self.prefix, target.tenant)
            tag_set = None if tags is None else frozenset(json.loads(tags))
            acknowledged += await self._touch_indexes(target.tenant, target.session_id, index, now, tag_set)
        self._check_replicas(min(acknowledged, default=None), what="fork", retry=_RETRY_FORK)
        return sum(segment.size for segment in segments)

    async def _share(self, source: SessionKey, through: str | None) -> tuple[list[Any], list[int]]:
        """Run ``FORK_SOURCE`` until it shares the cut: its ``ok`` reply, and the replicas' counts of its writes.

        When the source holds logs of other slots, the target's holds on them are taken first (``ACQUIRE``), for
        the segments the script saw; when those changed meanwhile, they are given back and taken anew. When the
        cut is in a segment of the source (a fork of a fork, through an inherited message), the store finds the
        message and the usage after it in those logs, whose ranges never change, and runs the script again.
        """
        source_keys, _ = self._keys(source)
        found: list[Any] = ["", ""]
        wanted = through or ""
        holds: list[bytes] = []  # logs of other slots the target holds (records keys)
        held_for: Any = ""  # the segments they were taken for
        acknowledged: list[int] = []
        try:
            while True:
                reply, ack = await self._write_script(
                    _scripts.FORK_SOURCE, source_keys, (wanted, self._ttl_ms, held_for, *found)
                )
                outcome = reply[0]
                if outcome == b"ok":
                    acknowledged.extend(() if ack is None else (ack,))
                    break
                if outcome == b"empty" or outcome == b"missing":
                    raise fork_source_error(source, through)
                segments = _segments(reply[1])
                if outcome == b"acquire":
                    await self._release(holds)
                    foreign = [s.records.encode() for s in segments if not _same_slot(s.records, source_keys[0])]
                    # A log that cannot be held is gone with all its keys: there is nothing left to keep.
                    holds, acks = await self._acquire(foreign)
                    held_for = reply[1]
                    acknowledged.extend(acks)
                    continue
                if through is None:  # the newest message, in the last segment
                    last = segments[-1]
                    ids = await self._call("ZRANGEBYSCORE", last.ids, last.high, last.high)
                    if not ids:
                        raise fork_source_error(source, through)
                    wanted, seq = ids[0].decode(), last.high
                else:
                    scores = await self._pipeline([("ZSCORE", segment.ids, through) for segment in segments])
                    held = [
                        float(score) for segment, score in zip(segments, scores, strict=True) if segment.holds(score)
                    ]
                    if not held:
                        raise fork_source_error(source, through)
                    seq = int(held[0])
                after = [
                    (segment, max(segment.low, seq + 1), segment.high)
                    for segment in segments
                    if segment.high > seq and not _same_slot(segment.usage, source_keys[0])
                ]
                found = [reply[1], seq, *await self._usages(after)]
        except Exception:
            await self._release(holds)
            raise
        # Holds taken for segments after the cut: the target does not take those logs.
        taken = {segment.records.encode() for segment in _segments(reply[1])}
        await self._release([log for log in holds if log not in taken])
        return reply, acknowledged

    async def _acquire(self, logs: Sequence[bytes]) -> tuple[list[bytes], list[int]]:
        """Take a hold on each log (``ACQUIRE``, in its slot): the logs held, and the replicas' counts.

        A log that is gone (its last holder let go since its segments were read) is not held.
        """
        held: list[bytes] = []
        acknowledged: list[int] = []
        for log in logs:
            taken, ack = await self._write_script(_scripts.ACQUIRE, _layout.log_keys(log.decode()), ())
            acknowledged.extend(() if ack is None else (ack,))
            if int(taken):
                held.append(log)
        return held, acknowledged

    async def _usage(self, key: SessionKey) -> SessionUsage:
        """The usage the scripts keep in the session's hash (one field: the messages are not read)."""
        stored = await self._call("HGET", _layout.session_keys(self.prefix, key.tenant, key.session_id)[0], "usage")
        return SessionUsage() if stored is None else SessionUsage.from_dict(json.loads(stored))

    # -- sessions --------------------------------------------------------------------------------

    async def _update_info(
        self, key: SessionKey, title: str | None, tags: frozenset[str] | None, metadata: dict[str, Any] | None
    ) -> bool:
        """Set title and metadata in the session's hash, then its tags beside the tenant's index (see the layout).

        Only a session that exists changes (the script checks), so, as for ``trim``, its index entry is there
        already and the indexes are updated after it. With ``wait_replicas``, each write waits for the replicas.
        """
        own, _ = self._keys(key)
        now = write_stamp()
        args = (
            now,
            self._ttl_ms,
            "0" if title is None else "1",
            title or "",
            "0" if metadata is None else "1",
            json.dumps(metadata, ensure_ascii=False) if metadata else "",
        )
        updated, acknowledged = await self._write_script(_scripts.UPDATE_INFO, own, args)
        if not updated:
            return False
        await self._keep_alive(updated[1:])
        index = _layout.tenant_index(self.prefix, key.tenant)
        earlier = await self._touch_indexes(key.tenant, key.session_id, index, now, tags)
        if acknowledged is not None:
            self._check_replicas(min([acknowledged, *earlier]), what="update_info", retry=_RETRY_INFO)
        return True

    async def _list_sessions(self, tenant: str, limit: int, cursor: str | None) -> SessionPage:
        """One tenant's sessions, most recently updated first, from the tenant's index (never a keyspace scan)."""
        return await self._list_indexed(tenant, _layout.tenant_index(self.prefix, tenant), limit, cursor)

    async def _list_tagged_sessions(self, tenant: str, tag: str, limit: int, cursor: str | None) -> SessionPage:
        """The tenant's sessions tagged ``tag``, newest first, from the tag's index (scored as the tenant's)."""
        return await self._list_indexed(tenant, _layout.tag_index(self.prefix, tenant, tag), limit, cursor)

    async def _list_indexed(self, tenant: str, index: str, limit: int, cursor: str | None) -> SessionPage:
        """One page of the sessions of a tenant's index (all of them, or a tag's), newest first."""
        after = None if cursor is None else _after(cursor)
        top: Any = "+inf" if after is None else after[0]
        offset, want = 0, limit + 1
        live: list[tuple[SessionInfo, int]] = []
        stale_before = write_stamp() - _layout.INDEX_GRACE_US
        while len(live) < want:
            chunk = max(want - len(live), 16) * 2
            rows = await self._call("ZREVRANGEBYSCORE", index, top, "-inf", "WITHSCORES", "LIMIT", offset, chunk)
            if not rows:
                break
            entries = _layout.pairs(rows)
            offset += len(entries)
            if after is not None:
                # Ties on the score come in reverse byte order: skip those at or after the cursor's id.
                entries = [(member, score) for member, score in entries if score < after[0] or member < after[1]]
            live += await self._describe(tenant, entries, index, stale_before)
            if len(entries) < chunk:
                break
        items = [info for info, _ in live[:want]]
        if len(items) > limit:
            last_info, last_score = live[limit - 1]
            return SessionPage(items[:limit], encode_cursor(last_score, last_info.session_id))
        return SessionPage(items)

    async def _session_info(self, key: SessionKey) -> SessionInfo | None:
        """What a listing reads of the session, and its score in the tenant's index, in one round trip."""
        member = key.session_id.encode()
        index, tags_map = self._tenant_keys(key.tenant)
        commands = [
            *self._info_reads(key.tenant, key.session_id),
            ("HGET", tags_map, member),
            ("ZSCORE", index, member),
        ]
        fields, count, tags, score = await self._pipeline(commands)
        if fields[0] is None:  # no such session, or it expired
            return None
        # The index's score is what list_sessions reports (a write updates it first); the hash's stamp stands in
        # for an entry not written yet.
        stamp = int(float(score)) if score is not None else int(fields[-1] or fields[0])
        return await self._info_of(key.tenant, member, fields, count, tags, stamp)

    def _info_reads(self, tenant: str, session_id: str) -> list[tuple[str, ...]]:
        """The commands that read what a listing tells of a session (:meth:`_info_of` decodes their replies)."""
        h, m, _, _ = _layout.session_keys(self.prefix, tenant, session_id)
        return [("HMGET", h, *_INFO_FIELDS), ("LLEN", m)]

    async def _info_of(
        self, tenant: str, member: bytes, fields: Sequence[Any], count: int, tags: bytes | None, score: int
    ) -> SessionInfo:
        """The :class:`SessionInfo` of a session from the replies of :meth:`_info_reads`, its tags and index score."""
        created, usage, title, metadata, source, through, log, segs, _ = fields
        created_at = stamp_time(int(created))
        if log is not None or segs is not None:  # a fork, or a shared log: count its segments and own log
            count = await self._count(SessionKey(tenant, member.decode()))
        return SessionInfo(
            member.decode(),
            tenant,
            int(count),
            created_at,
            max(stamp_time(score), created_at),
            forked_from=None if source is None else ForkInfo(source.decode(), through.decode()),
            usage=SessionUsage() if usage is None else SessionUsage.from_dict(json.loads(usage)),
            title=None if title is None else title.decode(),
            tags=frozenset() if tags is None else frozenset(json.loads(tags)),
            metadata={} if metadata is None else json.loads(metadata),
        )

    async def _describe(
        self, tenant: str, entries: list[tuple[bytes, int]], index: str, stale_before: int
    ) -> list[tuple[SessionInfo, int]]:
        if not entries:
            return []
        tags_map = _layout.tags_map(self.prefix, tenant)
        commands: list[tuple[str | bytes, ...]] = []
        for member, _ in entries:
            commands += self._info_reads(tenant, member.decode())
        commands.append(("HMGET", tags_map, *(member for member, _ in entries)))
        replies = await self._pipeline(commands)
        found: list[tuple[SessionInfo, int]] = []
        dead: list[tuple[Sequence[str], Sequence[Any]]] = []
        for n, (member, score) in enumerate(entries):
            fields, count = replies[2 * n], replies[2 * n + 1]
            if fields[0] is None:  # expired or deleted: an old entry goes, a young one may be a write under way
                if score < stale_before:
                    dead.append(((index, tags_map), (member, int(score))))
                continue
            info = await self._info_of(tenant, member, fields, count, replies[-1][n], score)
            found.append((info, score))
        await self._scripts(_scripts.DROP_INDEX_ENTRY, dead)
        return found

    async def _save_session(
        self, key: SessionKey, session: AgentSession, expected_version: str | Absent | None, owner: str | None
    ) -> str:
        """Store a whole-session document (version and owner checked in the same script)."""
        document = session_document(session)
        version = uuid.uuid4().hex
        h, m, i, index = _layout.session_keys(self.prefix, key.tenant, key.session_id)
        now = write_stamp()
        earlier = await self._touch_indexes(key.tenant, key.session_id, index, now)
        (outcome, *far), acknowledged = await self._write_script(
            _scripts.SAVE_SESSION,
            (h, m, i, _layout.usage_key(h)),
            (
                document,
                version,
                expected_version if isinstance(expected_version, str) else "",
                "0" if expected_version is None else "2" if expected_version is ABSENT else "1",
                owner or "",
                "0" if owner is None else "1",
                now,
                self._ttl_ms,
            ),
            earlier=earlier,
        )
        if outcome == b"owner":
            raise owner_error()
        if outcome == b"conflict":
            exists = True if expected_version is ABSENT else None
            raise conflict_error(key.session_id, expected_version or "", exists=exists)
        await self._keep_alive(far)
        self._check_replicas(acknowledged, what="session document", retry=_RETRY_SAVE)
        return version

    async def _load_session(self, key: SessionKey) -> StoredSession | None:
        h = _layout.session_keys(self.prefix, key.tenant, key.session_id)[0]
        document, version, stored_owner = await self._call("HMGET", h, "doc", "ver", "owner")
        if document is None or version is None:
            return None
        owner = None if stored_owner is None else stored_owner.decode()
        return decode_session_document(key, document, version.decode(), owner)

    # -- retention -------------------------------------------------------------------------------

    async def _prune(self, cutoff_at: datetime, tenant: str | None) -> int:
        """Delete sessions last updated before ``cutoff_at``, found through the indexes; returns how many."""
        cutoff = time_stamp(cutoff_at)
        if tenant is not None:
            return await self._prune_tenant(tenant, cutoff)
        removed, offset = 0, 0
        while True:
            rows = await self._call("ZRANGE", self._tenants_key, offset, offset + _SCAN_BATCH - 1, "WITHSCORES")
            if not rows:
                return removed
            kept = 0
            for member, score in _layout.pairs(rows):
                name = member.decode()
                removed += await self._prune_tenant(name, cutoff)
                index = _layout.tenant_index(self.prefix, name)
                if int(await self._call("ZCARD", index)) == 0:
                    kept += 1 - int(await self._script(_scripts.DROP_INDEX_ENTRY, (self._tenants_key,), (name, score)))
                else:
                    kept += 1
            offset += kept

    async def _prune_tenant(self, tenant: str, cutoff: int) -> int:
        index = _layout.tenant_index(self.prefix, tenant)
        removed, offset = 0, 0
        while True:
            rows = await self._call(
                "ZRANGEBYSCORE", index, "-inf", f"({cutoff}", "WITHSCORES", "LIMIT", offset, _SCAN_BATCH
            )
            if not rows:
                return removed
            entries = _layout.pairs(rows)
            keys = [self._keys(SessionKey(tenant, member.decode()))[0] for member, _ in entries]
            outcomes = await self._scripts(_scripts.PRUNE, [(k, (cutoff,)) for k in keys])
            await self._release([log for out in outcomes if isinstance(out, list) for log in out[1:]])
            tenant_keys = self._tenant_keys(tenant)
            drops = [
                (tenant_keys, (member, score))
                for (member, score), out in zip(entries, outcomes, strict=True)
                if out != 0
            ]
            removed += sum(1 for out in outcomes if isinstance(out, list))
            dropped = await self._scripts(_scripts.DROP_INDEX_ENTRY, drops)
            offset += len(entries) - sum(int(d) for d in dropped)

    async def _list_tenants(self) -> list[str]:
        """The tenants of the tenants' index that still have a live session (never a keyspace scan).

        The index keeps a tenant whose sessions were deleted one by one or expired (only ``prune`` and
        ``delete_tenant`` drop entries), so each tenant's own index is asked for one live session, a batch of
        tenants at a time: one round trip per batch, plus about two per tenant, a few tenants at once.
        """
        found: list[str] = []
        offset = 0
        while True:
            rows = await self._call("ZRANGE", self._tenants_key, offset, offset + _SCAN_BATCH - 1)
            if not rows:
                return found
            names = [member.decode() for member in rows]
            for start in range(0, len(names), _TENANT_PROBES):  # a few at once: each may take a connection
                chunk = names[start : start + _TENANT_PROBES]
                pages = await asyncio.gather(*(self._list_sessions(n, 1, None) for n in chunk), return_exceptions=True)
                for name, page in zip(chunk, pages, strict=True):  # all finish before a failure is raised
                    if isinstance(page, BaseException):
                        raise page
                    if page.items:
                        found.append(name)
            offset += len(rows)

    async def _delete_tenant(self, tenant: str) -> int:
        """Delete every session of ``tenant`` (as listed in its index); returns how many existed."""
        index = _layout.tenant_index(self.prefix, tenant)
        started = write_stamp()
        removed, offset = 0, 0
        while True:
            rows = await self._call("ZRANGEBYSCORE", index, "-inf", started, "WITHSCORES", "LIMIT", offset, _SCAN_BATCH)
            if not rows:
                break
            entries = _layout.pairs(rows)
            keys = [self._keys(SessionKey(tenant, member.decode()))[0] for member, _ in entries]
            outcomes = await self._scripts(_scripts.DELETE, [(k, ()) for k in keys])
            removed += sum(1 for out in outcomes if out is not None)
            await self._release([log for out in outcomes if out is not None for log in out[1:]])
            tenant_keys = self._tenant_keys(tenant)
            dropped = await self._scripts(_scripts.DROP_INDEX_ENTRY, [(tenant_keys, entry) for entry in entries])
            offset += len(entries) - sum(int(d) for d in dropped)
        await self._script(_scripts.DROP_INDEX_ENTRY, (self._tenants_key,), (tenant, started))
        return removed


@dataclass(frozen=True, slots=True)
class _Segment:
    """Messages a session holds from an earlier log (see ``_scripts._LOG``): sequence numbers ``low..high``."""

    records: str
    ids: str
    usage: str
    head: int
    low: int
    high: int

    @property
    def size(self) -> int:
        return self.high - self.low + 1

    def holds(self, score: Any) -> bool:
        """Whether an id scored ``score`` in this log's ids (``None``: absent) is within the segment."""
        return score is not None and self.low <= float(score) <= self.high


def _segments(text: bytes | str) -> list[_Segment]:
    """The segments a hash's ``segs`` field lists (``''``: none)."""
    if not text:
        return []
    return [
        _Segment(str(r), str(i), str(u), int(head), int(low), int(high))
        for r, i, u, head, low, high in json.loads(text)
    ]


def _oldest(segments: Sequence[_Segment], count: int) -> list[tuple[_Segment, int, int]]:
    """The spans of the ``count`` oldest messages of ``segments`` (what a trim removes), outside the session."""
    spans = []
    for segment in segments:
        if count <= 0:
            break
        take = min(count, segment.size)
        spans.append((segment, segment.low, segment.low + take - 1))
        count -= take
    return spans


def _same_slot(key: str, hash_key: str) -> bool:
    """Whether ``key`` is one of the session's own (its hash is ``hash_key``): its scripts read those themselves."""
    return key.startswith(hash_key[:-1])


def _usage_part(row: bytes) -> str:
    """The usage JSON of a usage set's member (``seq:json``)."""
    return row.decode().split(":", 1)[1]


def _usage_json(message: Message) -> str:
    """What ``message`` adds to its session's usage, as the scripts take it (``''``: it carries none)."""
    used = usage_of((message,))
    return json.dumps(used.to_dict(), ensure_ascii=False) if used else ""


def _after(cursor: str) -> tuple[int, bytes]:
    """A ``list_sessions`` cursor's position: the last score and session id (UTF-8, as the index holds it)."""
    score, session_id = decode_cursor(cursor, int, str)
    return int(score), str(session_id).encode()


async def _close_link(link: RedisTransport) -> None:
    await link.aclose()


def _abandon_link(link: RedisTransport) -> None:
    link.abandon()


def open_store(url: str = "redis://localhost:6379/0", **options: Any) -> RedisHistoryStore:
    """Open a store from a Redis URL; no connection is made until the first call.

    ``redis://[[user]:password@]host[:port][/db][?prefix=P&ttl=SECONDS&keep_last=N&max_message_bytes=N]``,
    ``rediss://`` for TLS, ``unix:///path/redis.sock?db=0``, ``redis+cluster://host:port[,host:port...]``.
    Keyword options (``prefix``, ``ttl``, ``keep_last``, ``max_message_bytes``, ``socket_timeout``,
    ``connect_timeout``, ``wait_replicas``, ``wait_timeout_ms``) override the query; other query options
    must be redis-py's, and go to it.

    Raises:
        RedisURLError: the URL is malformed, or an option is unknown or malformed.
    """
    return RedisHistoryStore(url, **options)


class RedisHistoryProvider(BackendHistoryProvider):
    """A history provider on Redis, taking the arguments every named provider takes.

    Example:
        ``RedisHistoryProvider("redis://localhost:6379/0?ttl=86400&keep_last=1000", max_messages=20)``
        keeps each session a day after its last write, at most 1,000 messages per session (the store's
        ``keep_last``), and sends the model the 20 newest (the provider's load window, ``max_messages``).
    """

    store_class = RedisHistoryStore
    default_url = "redis://localhost:6379/0"
