"""The JSON-files store: a folder per tenant; per session, a JSON Lines file of records and a metadata file.

Names are SHA-256 hashes of length-prefixed UTF-8 ids, so no id can name a path; the ids themselves are kept
inside the metadata. In ``ROOT/H(tenant)/``, each session ``P = H(tenant, session_id)`` has:

* ``P.json``: the metadata (ids, times, count, sizes, the session document), replaced whole on every write;
* ``P.N.jsonl``: the message records, one per line; ``N`` grows when ``trim`` rewrites the file (a ``pop``
  only moves the committed end back);
* ``P.ids``: the message-id index (see ``_index.py``);
* ``P.lock``: the session's lock (``fcntl.flock``), shared by readers and held alone by a writer.

The metadata also holds the session's usage, title, tags and metadata. ``ROOT/H(tenant)/tags/H(tag)/`` is the
index of a tag: an empty file named ``P`` (without the folder) per session carrying it, which
``list_sessions(tag=...)`` reads instead of every session of the tenant.

A write counts once the metadata file is renamed into place: the records file counts only up to the
metadata's ``size``, so a torn or uncommitted tail left by a writer that died is never read, and the next
append cuts it off. The blocking file work runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import glob
import json
import os
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from chatkeep.core import (
    AgentSession,
    BackendHistoryProvider,
    ChatkeepError,
    Message,
    SessionFormatError,
    SessionInfo,
    SessionKey,
    SessionPage,
    SessionUsage,
    StoreUnavailableError,
)
from chatkeep.core.backend import (
    HistoryStore,
    StoredSession,
    conflict_error,
    damaged_session_error,
    decode_cursor,
    decode_records,
    decode_session_document,
    encode_cursor,
    hashed_key,
    owner_error,
    session_document,
    stamp_time,
    time_stamp,
    usage_of,
    write_stamp,
)
from chatkeep_jsonfiles._config import parse_url
from chatkeep_jsonfiles._files import fsync_folder, last_lines, lines_after, locked, replace_file, write_at
from chatkeep_jsonfiles._index import IdIndex, digest

__all__ = ["JsonFilesHistoryProvider", "JsonFilesHistoryStore", "open_store"]

_T = TypeVar("_T")
_P = ParamSpec("_P")


def _hash(*ids: str) -> str:
    return hashed_key(*ids).hex()  # length-prefixed, so ("a:b", "c") and ("a", "b:c") differ


@dataclasses.dataclass
class _Meta:
    """A session's metadata file: what ``count``, ``list_sessions`` and ``load_session`` read, and the commit point."""

    tenant: str
    session_id: str
    incarnation: str  # new when the session is created (again): an iterator stops when its session is deleted
    created_at: datetime
    updated_at: datetime
    count: int = 0  # records stored
    first_seq: int = 0  # the sequence number of the first stored record (a trim advances it)
    size: int = 0  # the committed bytes of the records file
    base: int = 0  # bytes trims removed from the front, so an iterator's position survives a trim
    log: int = 0  # the records file's generation (N in P.N.jsonl)
    document: str | None = None
    version: str | None = None
    owner: str | None = None
    usage: dict[str, Any] | None = None  # SessionUsage.to_dict() of the stored records (None: none used)
    title: str | None = None
    tags: list[str] = dataclasses.field(default_factory=list)  # each also has a file in its tag's folder
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def used(self) -> SessionUsage:
        return SessionUsage() if self.usage is None else SessionUsage.from_dict(self.usage)

    def account(self, records: Sequence[Message], sign: int) -> None:
        """Add (``sign`` 1) or take off (-1) the usage ``records`` carry, in the write that stores or removes them."""
        change = usage_of(records)
        if change:
            total = self.used + change if sign > 0 else self.used - change
            self.usage = total.to_dict() if total else None

    @property
    def next_seq(self) -> int:
        return self.first_seq + self.count

    def touch(self) -> None:
        # Strictly later than the last write, so writes within one microsecond still order in list_sessions.
        self.updated_at = max(stamp_time(write_stamp()), self.updated_at + timedelta(microseconds=1))

    def dump(self) -> bytes:
        data = dataclasses.asdict(self) | {
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
        }
        return json.dumps(data, ensure_ascii=False, indent=2).encode()

    @classmethod
    def read(cls, path: str, key: SessionKey | None = None) -> _Meta | None:
        """The metadata in ``path`` (``None``: no such file); damaged, a ``SessionFormatError`` naming ``key``."""
        try:
            with open(path, "rb") as file:
                data = json.loads(file.read())
            return cls(**data | {name: datetime.fromisoformat(data[name]) for name in ("created_at", "updated_at")})
        except FileNotFoundError:
            return None
        except (ValueError, TypeError, KeyError) as exc:  # not JSON, or not this shape: a damaged file
            if key is not None:
                raise damaged_session_error(key, "metadata", exc) from exc
            raise SessionFormatError(
                f"the session metadata file {path} is damaged ({exc}); restore it, or delete it and the files "
                "beside it with the same name before the first dot (that session's data)"
            ) from exc


@dataclasses.dataclass(frozen=True)
class _Paths:
    prefix: str  # ROOT/H(tenant)/H(tenant, session_id)

    @property
    def meta(self) -> str:
        return self.prefix + ".json"

    @property
    def ids(self) -> str:
        return self.prefix + ".ids"

    @property
    def lock(self) -> str:
        return self.prefix + ".lock"

    def log(self, meta: _Meta) -> str:
        return f"{self.prefix}.{meta.log}.jsonl"

    def tagged(self, tag: str) -> str:
        """The session's entry in the index of ``tag``: an empty file in the tag's folder."""
        folder, name = os.path.split(self.prefix)
        return os.path.join(_tag_folder(folder, tag), name)

    def in_log(self, meta: _Meta, read: Callable[[int], _T]) -> _T:
        fd = os.open(self.log(meta), os.O_RDONLY)
        try:
            return read(fd)
        finally:
            os.close(fd)


# --8<-- [start:store]
class JsonFilesHistoryStore(HistoryStore):
    """A :class:`~chatkeep.core.HistoryStore` in plain files: JSON Lines per session, safe for many processes.

    Args:
        url: ``jsonfiles:///ABSOLUTE/DIR`` or ``jsonfiles://RELATIVE/DIR``, with ``?fsync=false`` or
            ``?max_message_bytes=N``; the folder is created on the first write.
        **options: the URL's options as keywords: ``fsync`` (default true: every write reaches the disk before
            it is acknowledged), ``max_message_bytes``.

    Raises:
        JsonFilesURLError: the URL or an option is unknown or malformed.
    """

    def __init__(self, url: str, **options: Any) -> None:
        self.root, settings = parse_url(url, **options)
        super().__init__(max_message_bytes=settings.max_message_bytes)
        self.fsync = settings.fsync
        self._messages_read = 0
        self._read_lock = threading.Lock()  # the probe also counts records an index rebuild reads in a thread

    @property
    def messages_read(self) -> int:
        """How many message records this instance has decoded (the conformance kit's read probe)."""
        return self._messages_read

    # --8<-- [end:store]

    def describe(self) -> dict[str, Any]:
        """What this store is, for logs and the CLI."""
        return {"type": type(self).__name__, "root": self.root, "fsync": self.fsync}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} root={self.root!r}{' closed' if self.closed else ''}>"

    def _folder(self, tenant: str) -> str:
        return os.path.join(self.root, _hash(tenant))

    def _paths(self, key: SessionKey) -> _Paths:
        return _Paths(os.path.join(self._folder(key.tenant), _hash(key.tenant, key.session_id)))

    def _decode(self, records: Sequence[bytes]) -> list[Message]:
        with self._read_lock:
            self._messages_read += len(records)
        return decode_records(records)

    # --8<-- [start:run]
    async def _run(self, work: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Run blocking file work in a worker thread, like ``asyncio.to_thread``, and never abandon it.

        A thread cannot be stopped, so a cancelled caller waits for it to finish: when ``CancelledError``
        reaches the caller, the work has happened in full or not started, and the caller's next call sees which.
        """
        future = asyncio.get_running_loop().run_in_executor(None, functools.partial(work, *args, **kwargs))
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            while not future.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait([future])
            future.exception()  # the caller gets CancelledError; a failure of the work is not left unretrieved
            raise
        except ChatkeepError:
            raise  # SessionOwnershipError is a PermissionError, an OSError: it is the caller's answer, not a failure
        except OSError as exc:
            raise StoreUnavailableError(
                f"the JSON-files store in {self.root} failed ({type(exc).__name__}: {exc}); "
                "check that the folder exists, is writable and has space left"
            ) from exc

    # --8<-- [end:run]

    def _new(self, key: SessionKey) -> _Meta:
        """The metadata of a session about to be created; with ``fsync``, its tenant folder's entry is flushed."""
        if self.fsync:
            fsync_folder(self.root)
        now = stamp_time(write_stamp())
        return _Meta(key.tenant, key.session_id, uuid.uuid4().hex, now, now)

    # -- writes: under the session's exclusive lock, committed by replacing the metadata file -----------------

    # --8<-- [start:append]
    async def _append(self, key: SessionKey, messages: Sequence[Message], records: Sequence[str]) -> int:
        return await self._run(self._append_now, key, messages, records)

    def _append_now(self, key: SessionKey, messages: Sequence[Message], records: Sequence[str]) -> int:
        paths = self._paths(key)
        with locked(paths.lock, exclusive=True):
            meta = _Meta.read(paths.meta, key) or self._new(key)
            keys = [digest(message.message_id) for message in messages]
            stored = functools.partial(self._stored_keys, paths, meta)
            with IdIndex.open(paths.ids, meta.next_seq, stored, fsync=self.fsync) as index:
                new = [n for n, id_key in enumerate(keys) if not _live(index.seq(id_key), meta)]
                if not new:
                    return 0
                data = b"".join(records[n].encode() + b"\n" for n in new)
                fd = os.open(paths.log(meta), os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    if os.fstat(fd).st_size != meta.size:
                        os.ftruncate(fd, meta.size)  # a torn or uncommitted tail left by a writer that died
                    write_at(fd, data, meta.size)
                    if self.fsync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                index.add([keys[n] for n in new], meta.first_seq)
            meta.count, meta.size = meta.count + len(new), meta.size + len(data)
            meta.account([messages[n] for n in new], 1)
            meta.touch()
            replace_file(paths.meta, meta.dump(), fsync=self.fsync)
            return len(new)

    # --8<-- [end:append]

    def _stored_keys(self, paths: _Paths, meta: _Meta) -> list[tuple[bytes, int]]:
        """Each stored record's id key and seq, read from the records (to rebuild a missing or stale index)."""
        if not meta.count:
            return []
        lines = paths.in_log(meta, lambda fd: lines_after(fd, 0, meta.size, None)[0])
        return [(digest(message.message_id), meta.first_seq + n) for n, message in enumerate(self._decode(lines))]

    async def _trim(self, key: SessionKey, keep_last: int) -> int:
        return await self._run(self._trim_now, key, keep_last)

    def _trim_now(self, key: SessionKey, keep_last: int) -> int:
        paths = self._paths(key)
        if not os.path.exists(paths.meta):
            return 0  # nothing to trim: no lock file is created just to find that out
        with locked(paths.lock, exclusive=True):
            meta = _Meta.read(paths.meta, key)
            if meta is None or meta.count <= keep_last:
                return 0
            kept = paths.in_log(meta, lambda fd: last_lines(fd, meta.size, keep_last)) if keep_last else []
            data = b"".join(line + b"\n" for line in kept)
            old_log, removed = paths.log(meta), meta.count - keep_last
            if meta.usage is not None:  # the trimmed records' usage goes with them (the file is rewritten anyway)
                gone = paths.in_log(meta, lambda fd: lines_after(fd, 0, meta.size, removed)[0])
                meta.account(decode_records(gone), -1)
            meta.log, meta.base, meta.size = meta.log + 1, meta.base + meta.size - len(data), len(data)
            meta.count, meta.first_seq = keep_last, meta.first_seq + removed
            meta.touch()  # a trim that deletes is a write
            replace_file(paths.log(meta), data, fsync=self.fsync)
            replace_file(paths.meta, meta.dump(), fsync=self.fsync)
            os.remove(old_log)
            return removed

    async def _pop(self, key: SessionKey) -> Message | None:
        record = await self._run(self._pop_now, key)
        return None if record is None else self._decode([record])[0]

    def _pop_now(self, key: SessionKey) -> bytes | None:
        paths = self._paths(key)
        if not os.path.exists(paths.meta):
            return None  # nothing to pop: no lock file is created just to find that out
        with locked(paths.lock, exclusive=True):
            meta = _Meta.read(paths.meta, key)
            if meta is None or not meta.count:
                return None
            record = paths.in_log(meta, lambda fd: last_lines(fd, meta.size, 1))[0]
            stored = functools.partial(self._stored_keys, paths, meta)
            with IdIndex.open(paths.ids, meta.next_seq, stored, fsync=self.fsync) as index:
                index.remove_newest(digest(json.loads(record)["message_id"]))
            # The record's bytes stay past the committed size until the next append cuts them off.
            meta.count, meta.size = meta.count - 1, meta.size - len(record) - 1
            meta.account(decode_records([record]), -1)
            meta.touch()
            replace_file(paths.meta, meta.dump(), fsync=self.fsync)
            return record

    async def _delete(self, key: SessionKey) -> bool:
        return await self._run(self._delete_now, key)

    def _delete_now(self, key: SessionKey, older_than: datetime | None = None) -> bool:
        """Remove the session's files; with ``older_than``, only if it was not updated since then."""
        paths = self._paths(key)
        if not os.path.exists(paths.meta):
            return False
        with locked(paths.lock, exclusive=True):
            if older_than is not None:  # a plain delete needs no metadata: it is the way out of damaged metadata
                meta = _Meta.read(paths.meta, key)
                if meta is None or meta.updated_at >= older_than:
                    return False
            elif not os.path.exists(paths.meta):
                return False
            # Its tag entries go first (listing by tag checks the metadata, so a left-over entry shows nothing).
            with contextlib.suppress(SessionFormatError):
                meta = _Meta.read(paths.meta)
                for tag in meta.tags if meta is not None else ():
                    _untag(paths, tag)
            # The metadata goes first (the session is gone from then on), the lock file last.
            files = glob.glob(glob.escape(paths.prefix) + ".*")
            for path in sorted(files, key=lambda path: (path != paths.meta, path == paths.lock)):
                os.remove(path)
            folder = os.path.dirname(paths.prefix)
            if self.fsync:
                fsync_folder(folder)
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # the tenant's last session; a writer creating it meanwhile makes it again
            return True

    # --8<-- [start:save]
    async def _save_session(
        self, key: SessionKey, session: AgentSession, expected_version: str | None, owner: str | None
    ) -> str:
        return await self._run(self._save_now, key, session_document(session), expected_version, owner)

    def _save_now(self, key: SessionKey, document: str, expected_version: str | None, owner: str | None) -> str:
        paths = self._paths(key)
        with locked(paths.lock, exclusive=True):
            meta = _Meta.read(paths.meta, key)
            if owner is not None and meta is not None and meta.owner not in (None, owner):
                raise owner_error()
            current = None if meta is None else meta.version
            if expected_version is not None and current != expected_version:
                raise conflict_error(key.session_id, expected_version, exists=current is not None)
            meta = meta or self._new(key)
            meta.document, meta.version, meta.owner = document, uuid.uuid4().hex, owner or meta.owner
            meta.touch()
            replace_file(paths.meta, meta.dump(), fsync=self.fsync)
            return meta.version

    # --8<-- [end:save]

    # --8<-- [start:retention]
    # prune and delete_tenant come from the base: it lists the sessions and deletes them one by one. This closes
    # the race its default leaves: a session written since it was listed as idle is not deleted.
    async def _prune_session(self, key: SessionKey, cutoff: datetime) -> bool:
        return await self._run(self._delete_now, key, cutoff)

    async def _list_tenants(self) -> list[str]:
        return await self._run(self._tenants_now)

    def _tenants_now(self) -> list[str]:
        # Folders are named by a hash of the tenant: the tenant itself is in the metadata of its sessions.
        folders = (os.path.join(self.root, name) for name in _names(self.root))
        return [metas[0].tenant for metas in map(self._metas, folders) if metas]

    # --8<-- [end:retention]

    # -- reads: the metadata alone needs no lock (it is replaced whole); the records need the shared lock -------

    def _metas(self, folder: str) -> list[_Meta]:
        found = (_Meta.read(os.path.join(folder, name)) for name in _names(folder) if name.endswith(".json"))
        return [meta for meta in found if meta is not None]

    # --8<-- [start:load]
    async def _load(self, key: SessionKey, last: int | None) -> list[Message]:
        return self._decode(await self._run(self._load_now, key, last))

    def _load_now(self, key: SessionKey, last: int | None) -> list[bytes]:
        paths = self._paths(key)
        with locked(paths.lock, exclusive=False) as exists:
            meta = _Meta.read(paths.meta, key) if exists else None
            if meta is None or not meta.count:
                return []
            if last is None or last >= meta.count:
                return paths.in_log(meta, lambda fd: lines_after(fd, 0, meta.size, None)[0])
            return paths.in_log(meta, lambda fd: last_lines(fd, meta.size, last))

    # --8<-- [end:load]

    async def _iter_messages(self, key: SessionKey, batch: int) -> AsyncIterator[Message]:
        position: tuple[str, int] | None = None  # (incarnation, bytes since the session's first record ever)
        while (page := await self._run(self._page, key, position, batch)) is not None:
            lines, position = page
            for message in self._decode(lines):
                yield message

    def _page(
        self, key: SessionKey, position: tuple[str, int] | None, batch: int
    ) -> tuple[list[bytes], tuple[str, int]] | None:
        """The ``batch`` records after ``position``; ``None`` at the end, or once the session was deleted."""
        paths = self._paths(key)
        with locked(paths.lock, exclusive=False) as exists:
            meta = _Meta.read(paths.meta, key) if exists else None
            if meta is None or (position is not None and position[0] != meta.incarnation):
                return None
            start = 0 if position is None else max(position[1] - meta.base, 0)
            if start >= meta.size:
                return None
            lines, end = paths.in_log(meta, lambda fd: lines_after(fd, start, meta.size, batch))
            return lines, (meta.incarnation, meta.base + end)

    async def _usage(self, key: SessionKey) -> SessionUsage:
        """The usage the metadata file keeps (every write that adds or removes records keeps it exact)."""
        meta = await self._run(_Meta.read, self._paths(key).meta, key)
        return SessionUsage() if meta is None else meta.used

    async def _count(self, key: SessionKey) -> int:
        meta = await self._run(_Meta.read, self._paths(key).meta, key)
        return 0 if meta is None else meta.count

    async def _list_sessions(self, tenant: str, limit: int, cursor: str | None) -> SessionPage:
        return _page(await self._run(self._metas, self._folder(tenant)), limit, cursor)

    async def _list_tagged_sessions(self, tenant: str, tag: str, limit: int, cursor: str | None) -> SessionPage:
        """The sessions in the tag's folder (its index: only they are read), whose metadata still carries it."""
        return _page(await self._run(self._tagged_metas, self._folder(tenant), tag), limit, cursor)

    def _tagged_metas(self, folder: str, tag: str) -> list[_Meta]:
        found = (_Meta.read(os.path.join(folder, name) + ".json") for name in _names(_tag_folder(folder, tag)))
        return [meta for meta in found if meta is not None and tag in meta.tags]

    async def _update_info(
        self, key: SessionKey, title: str | None, tags: frozenset[str] | None, metadata: dict[str, Any] | None
    ) -> bool:
        return await self._run(self._update_info_now, key, title, tags, metadata)

    def _update_info_now(
        self, key: SessionKey, title: str | None, tags: frozenset[str] | None, metadata: dict[str, Any] | None
    ) -> bool:
        paths = self._paths(key)
        if not os.path.exists(paths.meta):
            return False  # no such session: no lock file is created just to find that out
        with locked(paths.lock, exclusive=True):
            meta = _Meta.read(paths.meta, key)
            if meta is None:
                return False
            old = set(meta.tags)
            if title is not None:
                meta.title = title or None
            if metadata is not None:
                meta.metadata = metadata
            if tags is not None:
                for tag in tags - old:  # new entries before the commit, old ones after: the metadata decides
                    os.makedirs(os.path.dirname(paths.tagged(tag)), exist_ok=True)
                    with open(paths.tagged(tag), "wb"):
                        pass
                meta.tags = sorted(tags)
            meta.touch()  # a write
            replace_file(paths.meta, meta.dump(), fsync=self.fsync)
            for tag in old - set(meta.tags):
                _untag(paths, tag)
            return True

    async def _load_session(self, key: SessionKey) -> StoredSession | None:
        meta = await self._run(_Meta.read, self._paths(key).meta, key)
        if meta is None or meta.document is None or meta.version is None:
            return None
        return decode_session_document(key, meta.document, meta.version, meta.owner)


def _page(metas: list[_Meta], limit: int, cursor: str | None) -> SessionPage:
    """One page of ``metas``, newest first, after ``cursor``."""
    after = None if cursor is None else decode_cursor(cursor, int, str)
    metas = sorted(metas, reverse=True, key=_newest)
    # Keyset pagination on (updated_at, session_id): stable while sessions are added between pages.
    rows = [meta for meta in metas if after is None or _newest(meta) < after][: limit + 1]
    page = [
        SessionInfo(
            m.session_id,
            m.tenant,
            m.count,
            m.created_at,
            m.updated_at,
            usage=m.used,
            title=m.title,
            tags=frozenset(m.tags),
            metadata=m.metadata,
        )
        for m in rows[:limit]
    ]
    return SessionPage(page, encode_cursor(*_newest(rows[limit - 1])) if len(rows) > limit else None)


def _tag_folder(tenant_folder: str, tag: str) -> str:
    """``ROOT/H(tenant)/tags/H(tag)``: one empty file per session carrying the tag."""
    return os.path.join(tenant_folder, "tags", _hash(tag))


def _untag(paths: _Paths, tag: str) -> None:
    """Remove the session's entry in the tag's index, and the tag's folder when it was the last."""
    entry = paths.tagged(tag)
    with contextlib.suppress(FileNotFoundError):
        os.remove(entry)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(entry))
        os.rmdir(os.path.dirname(os.path.dirname(entry)))


def _names(folder: str) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except FileNotFoundError:  # nothing was written there yet
        return []


def _live(seq: int | None, meta: _Meta) -> bool:
    return seq is not None and meta.first_seq <= seq < meta.next_seq  # entries of trimmed and popped records are dead


def _newest(meta: _Meta) -> tuple[int, str]:
    return time_stamp(meta.updated_at), meta.session_id


# --8<-- [start:provider]
def open_store(url: str, **options: Any) -> JsonFilesHistoryStore:
    """Open a store from ``jsonfiles:///path/to/dir[?fsync=false&max_message_bytes=N]`` (no I/O until first use).

    Raises:
        JsonFilesURLError: the URL or an option is unknown or malformed.
    """
    return JsonFilesHistoryStore(url, **options)


class JsonFilesHistoryProvider(BackendHistoryProvider):
    """A history provider keeping each session's messages in JSON Lines files.

    Takes the arguments every named provider takes: ``JsonFilesHistoryProvider("jsonfiles:///srv/chat")``
    (``None`` opens ``jsonfiles://chatkeep-history``, a folder in the current directory).
    """

    store_class = JsonFilesHistoryStore
    default_url = "jsonfiles://chatkeep-history"


# --8<-- [end:provider]
