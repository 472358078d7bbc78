"""The JSON-files store: a folder per tenant; per session, a JSON Lines file of records and a metadata file.

Names are SHA-256 hashes of length-prefixed UTF-8 ids, so no id can name a path; the ids themselves are kept
inside the metadata. In ``ROOT/H(tenant)/``, each session ``P = H(tenant, session_id)`` has:

* ``P.json``: the metadata (ids, times, count, sizes, the session document), replaced whole on every write;
* ``P.N.jsonl``: the message records, one per line; ``N`` grows when ``trim`` rewrites the file (a ``pop``
  only moves the committed end back);
* ``P.ids``: the message-id index (see ``_index.py``);
* ``P.lock``: the session's lock (``fcntl.flock``), shared by readers and held alone by a writer.

A fork copies nothing. Forking freezes the source's records file: its index becomes ``P.N.ids`` and the source goes
on in a new file, while the fork gets hard links to every frozen file it reads (``F.bX.jsonl``, ``F.bX.ids``),
listed in its metadata's ``frozen`` with the records and bytes it shows of each. A frozen file is never written
again, and the file system counts its links: deleting or trimming the source removes only its own names, so a
fork never changes, and the file goes with the last session that reads it.

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
    ForkInfo,
    Message,
    SessionFormatError,
    SessionInfo,
    SessionKey,
    SessionPage,
    SessionUsage,
    StoreUnavailableError,
)
from chatkeep.core.backend import (
    ABSENT,
    Absent,
    HistoryStore,
    StoredSession,
    conflict_error,
    damaged_session_error,
    decode_cursor,
    decode_records,
    decode_session_document,
    encode_cursor,
    finish_if_cancelled,
    fork_source_error,
    fork_target_exists_error,
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
    # Frozen records files read before the own one, oldest first: [name, first seq, end seq, start byte, end byte,
    # where the file started in this session's own positions (None: a fork's link)]. Never written again.
    frozen: list[list[Any]] = dataclasses.field(default_factory=list)
    forked_from: list[str] | None = None  # the source's session id and the message the fork took last

    @property
    def total(self) -> int:
        """The records the session shows: the frozen files' and its own."""
        return self.count + sum(int(end) - int(first) for _, first, end, *_ in self.frozen)

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
        return self.frozen(str(meta.log))

    def frozen(self, name: str, suffix: str = "jsonl") -> str:
        """A frozen records file (or, with ``suffix="ids"``, its id index) the session reads."""
        return f"{self.prefix}.{name}.{suffix}"

    def in_frozen(self, name: str, read: Callable[[int], _T]) -> _T:
        fd = os.open(self.frozen(name), os.O_RDONLY)
        try:
            return read(fd)
        finally:
            os.close(fd)

    def tagged(self, tag: str) -> str:
        """The session's entry in the index of ``tag``: an empty file in the tag's folder."""
        folder, name = os.path.split(self.prefix)
        return os.path.join(_tag_folder(folder, tag), name)

    def in_log(self, meta: _Meta, read: Callable[[int], _T]) -> _T:
        return self.in_frozen(str(meta.log), read)  # the own records file, named as a frozen one will be


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

    creates_if_absent = True  # _save_session handles expected_version=ABSENT

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

        A thread cannot be stopped, so a cancelled caller waits for it to finish (``finish_if_cancelled``): when
        ``CancelledError`` reaches the caller, the work has happened in full or not started, and the caller's
        next call sees which.
        """
        future = asyncio.get_running_loop().run_in_executor(None, functools.partial(work, *args, **kwargs))
        try:
            return await finish_if_cancelled(future)
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
                held = _in_frozen(paths, meta, keys)  # ids a fork took, or that were frozen by forking
                new = [n for n, id_key in enumerate(keys) if not _live(index.seq(id_key), meta) and id_key not in held]
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
            if meta is None or meta.total <= keep_last:
                return 0
            removed = meta.total - keep_last
            left, dropped = self._trim_frozen(paths, meta, removed)  # the oldest records are in the frozen files
            if left:
                kept = paths.in_log(meta, lambda fd: last_lines(fd, meta.size, keep_last)) if keep_last else []
                data = b"".join(line + b"\n" for line in kept)
                old_log = paths.log(meta)
                if meta.usage is not None:  # the trimmed records' usage goes with them (the file is rewritten anyway)
                    gone = paths.in_log(meta, lambda fd: lines_after(fd, 0, meta.size, left)[0])
                    meta.account(decode_records(gone), -1)
                meta.log, meta.base, meta.size = meta.log + 1, meta.base + meta.size - len(data), len(data)
                meta.count, meta.first_seq = keep_last, meta.first_seq + left
                replace_file(paths.log(meta), data, fsync=self.fsync)
            meta.touch()  # a trim that deletes is a write
            replace_file(paths.meta, meta.dump(), fsync=self.fsync)
            if left:
                os.remove(old_log)
            for name in dropped:  # the session's names of frozen files it no longer reads
                for suffix in ("jsonl", "ids"):
                    os.remove(paths.frozen(name, suffix))
            return removed

    def _trim_frozen(self, paths: _Paths, meta: _Meta, removed: int) -> tuple[int, list[str]]:
        """Drop up to ``removed`` of the oldest records, from the frozen files read first.

        Returns how many are left to drop (from the own file), and the frozen files no longer read.
        """
        dropped = []
        for part in list(meta.frozen):
            name, first, end, start, size, _ = part
            take = min(removed, end - first)
            if not take:
                break
            lines, part[3] = paths.in_frozen(name, functools.partial(lines_after, start=start, end=size, limit=take))
            part[1], removed = first + take, removed - take
            if meta.usage is not None:
                meta.account(decode_records(lines), -1)
            if part[1] == end:
                meta.frozen.remove(part)  # none of its records left: the session's links to it go (after the commit)
                dropped.append(name)
        return removed, dropped

    async def _pop(self, key: SessionKey) -> Message | None:
        record = await self._run(self._pop_now, key)
        return None if record is None else self._decode([record])[0]

    def _pop_now(self, key: SessionKey) -> bytes | None:
        paths = self._paths(key)
        if not os.path.exists(paths.meta):
            return None  # nothing to pop: no lock file is created just to find that out
        with locked(paths.lock, exclusive=True):
            meta = _Meta.read(paths.meta, key)
            if meta is None or not meta.total:
                return None
            if not meta.count:  # the newest record is in a frozen file: only what the session shows of it moves
                part = [part for part in meta.frozen if part[2] > part[1]][-1]
                record = paths.in_frozen(part[0], lambda fd: last_lines(fd, part[4], 1))[0]
                part[2], part[4] = part[2] - 1, part[4] - len(record) - 1
                meta.account(decode_records([record]), -1)
                meta.touch()
                replace_file(paths.meta, meta.dump(), fsync=self.fsync)
                return record
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
        self, key: SessionKey, session: AgentSession, expected_version: str | Absent | None, owner: str | None
    ) -> str:
        return await self._run(self._save_now, key, session_document(session), expected_version, owner)

    def _save_now(
        self, key: SessionKey, document: str, expected_version: str | Absent | None, owner: str | None
    ) -> str:
        paths = self._paths(key)
        with locked(paths.lock, exclusive=True):
            meta = _Meta.read(paths.meta, key)
            if owner is not None and meta is not None and meta.owner not in (None, owner):
                raise owner_error()
            current = None if meta is None else meta.version
            if expected_version is ABSENT and current is not None:  # messages alone are no document
                raise conflict_error(key.session_id, ABSENT, exists=True)
            if isinstance(expected_version, str) and current != expected_version:
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
            if meta is None or not meta.total:
                return []
            want = meta.total if last is None else min(last, meta.total)
            own = min(want, meta.count)  # the newest come from the own file, the rest from frozen ones, newest first
            lines = paths.in_log(meta, lambda fd: last_lines(fd, meta.size, own)) if own else []
            for name, first, end, _, size, _ in reversed(meta.frozen):
                if len(lines) == want:
                    break
                take = min(want - len(lines), end - first)
                lines = paths.in_frozen(name, functools.partial(last_lines, end=size, count=take)) + lines
            return lines

    # --8<-- [end:load]

    async def _iter_messages(self, key: SessionKey, batch: int) -> AsyncIterator[Message]:
        # (incarnation, file, position): a frozen file's name and a byte in it, or "" and a byte of the own records
        # counted since the session's first record ever (so that a trim or a freeze does not move it).
        position: tuple[str, str, int] | None = None
        while (page := await self._run(self._page, key, position, batch)) is not None:
            lines, position = page
            for message in self._decode(lines):
                yield message

    def _page(
        self, key: SessionKey, position: tuple[str, str, int] | None, batch: int
    ) -> tuple[list[bytes], tuple[str, str, int]] | None:
        """The ``batch`` records after ``position``; ``None`` at the end, or once the session was deleted."""
        paths = self._paths(key)
        with locked(paths.lock, exclusive=False) as exists:
            meta = _Meta.read(paths.meta, key) if exists else None
            if meta is None or (position is not None and position[0] != meta.incarnation):
                return None
            _, name, at = position or (meta.incarnation, "", -1)
            parts = meta.frozen  # a trim drops the oldest; a pop leaves an emptied one in place
            if name == "":  # own records frozen since (a fork) are read on in their frozen file
                name = next((p[0] for p in parts if p[5] is not None and p[5] <= at < p[5] + p[4]), "")
                at = at - next((p[5] for p in parts if p[0] == name), 0) if name else at
            if position is None or (name and name not in [part[0] for part in parts]):
                name, at = (parts[0][0], parts[0][3]) if parts else ("", meta.base)  # from the first record shown
            for n, (part, _, _, start, size, _) in enumerate(parts):
                if part == name:
                    if max(at, start) < size:
                        read = functools.partial(lines_after, start=max(at, start), end=size, limit=batch)
                        lines, end = paths.in_frozen(part, read)
                        return lines, (meta.incarnation, part, end)
                    name, at = (parts[n + 1][0], parts[n + 1][3]) if n + 1 < len(parts) else ("", meta.base)
            start = max(at - meta.base, 0)
            if start >= meta.size:
                return None
            lines, end = paths.in_log(meta, lambda fd: lines_after(fd, start, meta.size, batch))
            return lines, (meta.incarnation, "", meta.base + end)

    async def _usage(self, key: SessionKey) -> SessionUsage:
        """The usage the metadata file keeps (every write that adds or removes records keeps it exact)."""
        meta = await self._run(_Meta.read, self._paths(key).meta, key)
        return SessionUsage() if meta is None else meta.used

    async def _count(self, key: SessionKey) -> int:
        meta = await self._run(_Meta.read, self._paths(key).meta, key)
        return 0 if meta is None else meta.total

    async def _list_sessions(self, tenant: str, limit: int, cursor: str | None) -> SessionPage:
        return _page(await self._run(self._metas, self._folder(tenant)), limit, cursor)

    async def _session_info(self, key: SessionKey) -> SessionInfo | None:
        """The session's entry from its metadata file alone (``list_sessions`` reads every file of the tenant)."""
        meta = await self._run(_Meta.read, self._paths(key).meta, key)
        return None if meta is None else _info(meta)

    async def _list_tagged_sessions(self, tenant: str, tag: str, limit: int, cursor: str | None) -> SessionPage:
        """The sessions in the tag's folder (its index: only they are read), whose metadata still carries it."""
        return _page(await self._run(self._tagged_metas, self._folder(tenant), tag), limit, cursor)

    def _tagged_metas(self, folder: str, tag: str) -> list[_Meta]:
        found = (_Meta.read(os.path.join(folder, name) + ".json") for name in _names(_tag_folder(folder, tag)))
        return [meta for meta in found if meta is not None and tag in meta.tags]

    async def _fork(self, source: SessionKey, target: SessionKey, through: str | None) -> int:
        return await self._run(self._fork_now, source, target, through)

    def _fork_now(self, source: SessionKey, target: SessionKey, through: str | None) -> int:
        """Freeze the source's own records, then give the target links to the frozen files it reads, up to the cut."""
        paths, into = self._paths(source), self._paths(target)
        first, second = sorted((paths.lock, into.lock))  # one order for any two sessions: no deadlock
        with locked(first, exclusive=True), locked(second, exclusive=True):
            meta = _Meta.read(paths.meta, source)
            if meta is None or not meta.total:
                raise fork_source_error(source, through)
            if os.path.exists(into.meta):
                raise fork_target_exists_error(target)
            self._freeze(paths, meta)  # every record is in a frozen file from here on
            found = _in_frozen(paths, meta, [digest(through)]).get(digest(through)) if through is not None else None
            if through is not None and found is None:
                raise fork_source_error(source, through)
            n, seq = found or next((n, p[2] - 1) for n, p in reversed(list(enumerate(meta.frozen))) if p[2] > p[1])
            parts = [list(part) for part in meta.frozen[: n + 1]]
            name, _, end, _, size, _ = parts[-1]
            after = paths.in_frozen(name, lambda fd: last_lines(fd, size, end - seq - 1)) if end - seq - 1 else []
            parts[-1][2], parts[-1][4] = seq + 1, size - sum(len(line) + 1 for line in after)
            if through is None:
                through = self._decode(paths.in_frozen(name, lambda fd: last_lines(fd, parts[-1][4], 1)))[0].message_id
            fork = self._new(target)
            fork.first_seq, fork.forked_from = seq + 1, [source.session_id, through]
            fork.title, fork.tags, fork.metadata = meta.title, list(meta.tags), meta.metadata
            fork.usage = meta.usage
            if meta.usage is not None:  # the fork's usage is the source's but that of the records after the cut
                for later, _, _, start, end_byte, _ in meta.frozen[n + 1 :]:
                    read = functools.partial(lines_after, start=start, end=end_byte, limit=None)
                    after += paths.in_frozen(later, read)[0]
                fork.account(self._decode(after), -1)
            for part in parts:  # the fork's own names of the frozen files: hard links, counted by the file system
                link = f"b{uuid.uuid4().hex[:12]}"
                for suffix in ("jsonl", "ids"):
                    os.link(paths.frozen(part[0], suffix), into.frozen(link, suffix))
                part[0], part[5] = link, None
            fork.frozen = parts
            for tag in fork.tags:
                _tag(into, tag)
            replace_file(into.meta, fork.dump(), fsync=self.fsync)
            return fork.total

    def _freeze(self, paths: _Paths, meta: _Meta) -> None:
        """Make the own records file a frozen one (with its index), and go on in a new, empty one."""
        if not meta.count:
            return
        stored = functools.partial(self._stored_keys, paths, meta)
        with IdIndex.open(paths.ids, meta.next_seq, stored, fsync=self.fsync):
            pass  # up to date (rebuilt if it is stale) before it is frozen
        name = str(meta.log)
        os.replace(paths.ids, paths.frozen(name, "ids"))
        meta.frozen.append([name, meta.first_seq, meta.next_seq, 0, meta.size, meta.base])
        meta.log, meta.base, meta.first_seq = meta.log + 1, meta.base + meta.size, meta.next_seq
        meta.count = meta.size = 0
        replace_file(paths.meta, meta.dump(), fsync=self.fsync)  # not a write of the session: no touch

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
                    _tag(paths, tag)
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
    page = [_info(meta) for meta in rows[:limit]]
    return SessionPage(page, encode_cursor(*_newest(rows[limit - 1])) if len(rows) > limit else None)


def _info(meta: _Meta) -> SessionInfo:
    """The listing entry of a session (``list_sessions`` and ``session_info``)."""
    return SessionInfo(
        meta.session_id,
        meta.tenant,
        meta.total,
        meta.created_at,
        meta.updated_at,
        forked_from=None if meta.forked_from is None else ForkInfo(*meta.forked_from),
        usage=meta.used,
        title=meta.title,
        tags=frozenset(meta.tags),
        metadata=meta.metadata,
    )


def _tag_folder(tenant_folder: str, tag: str) -> str:
    """``ROOT/H(tenant)/tags/H(tag)``: one empty file per session carrying the tag."""
    return os.path.join(tenant_folder, "tags", _hash(tag))


def _tag(paths: _Paths, tag: str) -> None:
    """Add the session's entry to the tag's index."""
    os.makedirs(os.path.dirname(paths.tagged(tag)), exist_ok=True)
    with open(paths.tagged(tag), "wb"):
        pass


def _in_frozen(paths: _Paths, meta: _Meta, keys: Sequence[bytes]) -> dict[bytes, tuple[int, int]]:
    """Which of ``keys`` are ids of records the session shows from frozen files (found in their indexes): each one's
    file (its place in ``frozen``) and seq."""
    found: dict[bytes, tuple[int, int]] = {}
    for n, (name, first, end, *_) in enumerate(meta.frozen):
        index = IdIndex(paths.frozen(name, "ids"), fsync=False)
        try:
            for key in keys:
                seq = index.seq(key)
                if seq is not None and first <= seq < end:
                    found[key] = (n, seq)
        finally:
            index.close()
    return found


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
