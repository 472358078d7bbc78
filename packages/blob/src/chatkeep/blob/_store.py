"""The Azure Blob Storage history store: append blobs for the records, one ETag-guarded metadata blob per session.

Where each blob lives and how segments are framed is in :mod:`chatkeep.blob._layout`; what the metadata
holds in :mod:`chatkeep.blob._meta`. How an append works:

1. Take the session's metadata (this store's cached copy, or one GET) and check the ids against its window.
2. Append one block (the whole batch) to the open segment with the append-position condition set to the
   length the metadata knows. It lands whole or not at all; if another writer's block came first, the
   condition fails: read the blocks beyond (they are other appends, maybe cancelled ones), take them in,
   check the ids again and retry at the new end.
3. Write the metadata with If-Match. If another writer changed it, read it again: if it already covers
   this block (a writer behind took it in), the append is done; else take in the new blocks and retry.

Every block in a live segment is a whole append, so readers read up to the segment's true end (a ranged
read with no end) and see blocks whose writer died before step 3, as the next writer will.

A fork copies nothing: its metadata lists the source's segments up to the cut (see :mod:`chatkeep.blob._meta`),
and a reference blob in each data folder it reads from keeps those segments when their session deletes or trims
them (:meth:`BlobHistoryStore._sweep`). The order that makes this safe without a transaction: a fork writes its
references, then checks that its source still holds what it took; whoever deletes segments first changes
the metadata (its own, or stops holding a reference), then reads who still holds them, then lists the
references, and deletes only what nobody holds or refers to.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import io
import json
import random
import re
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple, TypeVar
from urllib.parse import urlsplit

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.storage.blob.aio import ContainerClient

from chatkeep.blob import _layout
from chatkeep.blob._client import BlobClient, driver_errors, error_code
from chatkeep.blob._config import BlobURLError, parse_url
from chatkeep.blob._meta import SessionMeta, decode_info, session_info
from chatkeep.core import (
    AgentSession,
    BackendHistoryProvider,
    InvalidArgumentError,
    Message,
    SessionFormatError,
    SessionInfo,
    SessionKey,
    SessionPage,
    SessionUsage,
)
from chatkeep.core.backend import (
    ABSENT,
    Absent,
    HistoryStore,
    PerLoop,
    StoredSession,
    TelemetryTarget,
    conflict_error,
    damaged_listing_error,
    damaged_session_error,
    decode_cursor,
    decode_records,
    decode_session_document,
    encode_cursor,
    finish_if_cancelled,
    fork_source_error,
    fork_target_exists_error,
    owner_error,
    session_document,
    time_stamp,
    usage_of,
    write_stamp,
)

__all__ = ["MAX_APPEND_BYTES", "BlobHistoryProvider", "BlobHistoryStore", "open_store"]

#: One append is one Append Block request, which Azure takes up to 100 MiB.
MAX_APPEND_BYTES = 100 * 1024 * 1024
_CACHE_SIZE = 256
_DELETE_CONCURRENCY = 16
_RACE_PAUSE = 0.002  # seconds: the first pause after a lost race is up to twice this
_T = TypeVar("_T")


def _touch(view: SessionMeta) -> None:
    """Count a write (append, trim that deletes, pop, save_session): it moves ``updated``, which orders and prunes."""
    view.updated = max(write_stamp(), view.created)


def _position_failed(exc: HttpResponseError) -> bool:
    return exc.status_code == 412 and error_code(exc) == "AppendPositionConditionNotMet"


#: What a damaged metadata blob raises while it is parsed (not JSON, not UTF-8, a field missing or of a wrong type).
_META_DAMAGE = (ValueError, KeyError, TypeError, IndexError, RecursionError)


def _message_id(record: bytes) -> str:
    """The id of a stored record, read to check an append's ids against what landed.

    Raises:
        MessageFormatError: the record is damaged (the base names its session).
    """
    try:
        message_id = json.loads(record)["message_id"]
        if isinstance(message_id, str):
            return message_id
    except _META_DAMAGE:
        pass
    return decode_records([record])[0].message_id  # raises MessageFormatError saying what is wrong with it


_ID_FIELD = re.compile(rb'"session_id"\s*:\s*("(?:[^"\\]|\\.)*")')


def _named_id(raw: bytes) -> str | None:
    """The session id a damaged metadata blob still holds (its JSON starts with the tenant and the id), if any."""
    found = _ID_FIELD.search(raw)
    if found is None:
        return None
    try:
        session_id = json.loads(found[1].decode("utf-8", "surrogatepass"))
    except ValueError:
        return None
    return session_id if isinstance(session_id, str) and session_id else None


class _Row(NamedTuple):
    """A metadata blob as a listing found it: its listing fields, name, ETag and info (``None``: read the blob)."""

    updated: int
    session_id: str
    messages: int
    created: int
    name: str
    etag: str
    info: dict[str, Any] | None


def _newest_first(rows: Iterable[_Row]) -> list[_Row]:
    return sorted(rows, key=lambda row: (row.updated, row.session_id), reverse=True)


def _usage_in(records: Sequence[bytes]) -> SessionUsage:
    """The usage of stored records (only those that can hold a usage content are decoded)."""
    return usage_of(decode_records([record for record in records if b'"usage"' in record]))


class _Gone(Exception):
    """A blob the metadata named is gone (the session was deleted or trimmed meanwhile): read the metadata again."""


class BlobHistoryStore(HistoryStore):
    """A :class:`~chatkeep.core.HistoryStore` on Azure Blob Storage (``azblob://CONTAINER[/PREFIX]``).

    Each session is a metadata blob (index, counters, session document; ETag-guarded) and append blobs of
    records that roll over every ``segment_blocks`` appends. An append is one Append Block with an
    append-position condition plus one conditional metadata write, whatever the history's length; it is
    idempotent by ``message_id`` and safe under concurrent writers in any number of processes.
    ``load(last=k)`` reads the metadata and exactly the k newest records' bytes (for k up to ``index_window``).

    Args:
        url: ``azblob://CONTAINER[/PREFIX][?account_url=URL&OPTION=VALUE...]`` (see :func:`open_store`).
        client: an existing ``azure.storage.blob.aio.ContainerClient``; the store uses it (the URL's container
            is ignored) and leaves it open when closed.
        connection_string: the account's connection string (default: ``AZURE_STORAGE_CONNECTION_STRING``).
        sas_token: a SAS token for ``account_url`` (default: ``AZURE_STORAGE_SAS_TOKEN``).
        credential: an Azure credential for ``account_url`` (default: ``DefaultAzureCredential``).
        **options: the URL's options as keywords: ``account_url``, ``prefix``, ``create_container``,
            ``segment_blocks``, ``segment_bytes``, ``index_window``, ``max_message_bytes``, ``connect_timeout``,
            ``read_timeout``, ``retries``, ``retry_backoff``.

    Raises:
        BlobURLError: the URL or an option is malformed, or no account is configured.
    """

    creates_if_absent = True

    def __init__(
        self,
        url: str | None = None,
        *,
        client: ContainerClient | None = None,
        connection_string: str | None = None,
        sas_token: str | None = None,
        credential: Any = None,
        **options: Any,
    ) -> None:
        if url is None and client is not None:
            url = f"azblob://{client.container_name}"
        if url is None:
            raise BlobURLError("an Azure Blob store needs a URL: azblob://CONTAINER[/PREFIX][?account_url=...]")
        config = parse_url(
            url,
            connection_string=connection_string,
            sas_token=sas_token,
            credential=credential,
            account_required=client is None,
            **options,
        )
        super().__init__(max_message_bytes=config.settings.max_message_bytes)
        self.config = config
        self.layout = _layout.Layout(config.settings.prefix)
        self._handed_in = client
        # The SDK's clients (aiohttp sessions) belong to one event loop: one per loop, unless a client is handed in.
        self._clients: PerLoop[BlobClient] = PerLoop(
            lambda: BlobClient(config), close=BlobClient.aclose, abandon=BlobClient.abandon
        )
        self.serves_any_loop = client is None
        self._cache: collections.OrderedDict[SessionKey, tuple[SessionMeta, str]] = collections.OrderedDict()
        self._cache_lock = threading.Lock()
        self._messages_read = 0
        #: Bytes of segment data this store has downloaded (the benchmark's and the docs' cost check).
        self.bytes_read = 0

    # -- plumbing --------------------------------------------------------------------------------

    @property
    def messages_read(self) -> int:
        """How many message records this store has downloaded (the conformance kit's read probe)."""
        return self._messages_read

    def describe(self) -> dict[str, Any]:
        """What this store is, for logs and the CLI (no secrets)."""
        return {
            "type": type(self).__name__,
            "url": self.config.shown_url,
            "container": self.config.container,
            "account": self.config.credentials.shown,
            "prefix": self.config.settings.prefix,
        }

    def _telemetry_target(self) -> TelemetryTarget:
        """``blob``, at the account's blob endpoint (host and port; 443 for ``https``, 80 for ``http``)."""
        handed_in = self._handed_in
        endpoint = self.config.credentials.endpoint or (handed_in.url if handed_in is not None else None)
        if not endpoint:
            return TelemetryTarget("blob")
        parts = urlsplit(endpoint)
        return TelemetryTarget("blob", parts.hostname, parts.port or (80 if parts.scheme == "http" else 443))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.config.shown_url}{' closed' if self.closed else ''}>"

    def _container(self) -> ContainerClient:
        return self._handed_in if self._handed_in is not None else self._clients.get().container()

    def _one_loop_reason(self) -> str:
        return "it runs on the ContainerClient handed to it (client=), whose connections belong to one loop"

    async def _aclose(self) -> None:
        self._cache.clear()
        await self._clients.aclose()

    async def _ensure_container(self) -> None:
        if not self.config.settings.create_container:
            raise BlobURLError(
                f"the {self.config.where} does not exist; create it, or open the store with create_container=true"
            )
        with driver_errors(self.config), contextlib.suppress(ResourceExistsError):
            await self._container().create_container()

    async def _write(self, operation: Callable[[], Awaitable[_T]]) -> _T:
        """Run a write, creating the container when it is missing (first use, or deleted since), then again."""
        try:
            return await operation()
        except ResourceNotFoundError as exc:
            if error_code(exc) != "ContainerNotFound":
                raise
            await self._ensure_container()
            return await operation()

    def _remember(self, key: SessionKey, meta: SessionMeta, etag: str) -> None:
        with self._cache_lock:  # loops in other threads use the cache too
            self._cache[key] = (meta, etag)
            self._cache.move_to_end(key)
            while len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)

    # -- blobs -----------------------------------------------------------------------------------

    async def _read_meta(self, key: SessionKey) -> tuple[SessionMeta, str] | None:
        blob = self._container().get_blob_client(self.layout.meta(key.tenant, key.session_id))
        with driver_errors(self.config):
            try:
                downloader = await blob.download_blob()
                raw = await downloader.readall()
            except ResourceNotFoundError:
                return None
        try:
            meta = SessionMeta.from_json(raw)
        except _META_DAMAGE as exc:
            raise damaged_session_error(key, "metadata", exc) from exc
        etag = str(downloader.properties.etag)
        self._remember(key, meta, etag)
        return meta, etag

    async def _put_meta(self, key: SessionKey, meta: SessionMeta, etag: str | None) -> str | None:
        """Write the metadata if it is still ``etag`` (``None``: if there is none); the new ETag, or ``None``."""
        blob = self._container().get_blob_client(self.layout.meta(key.tenant, key.session_id))
        condition: dict[str, Any] = (
            {"match_condition": MatchConditions.IfMissing}
            if etag is None
            else {"etag": etag, "match_condition": MatchConditions.IfNotModified}
        )
        body = meta.to_json()

        async def put() -> dict[str, Any]:
            upload = blob.upload_blob(
                io.BytesIO(body), length=len(body), overwrite=True, metadata=meta.listing(), **condition
            )
            return await finish_if_cancelled(upload)

        with driver_errors(self.config):
            try:
                result = await self._write(put)
            except (ResourceModifiedError, ResourceExistsError, ResourceNotFoundError):
                self._cache.pop(key, None)
                return None
        new_etag = str(result["etag"])
        self._remember(key, meta, new_etag)
        return new_etag

    def _segment(self, key: SessionKey, meta: SessionMeta, number: int) -> Any:
        """Segment ``number`` of the session: in the data folder it came from (a fork's inherited one), or its own."""
        for segment in meta.segments:
            if segment.number == number and segment.folder is not None:
                return self._container().get_blob_client(self.layout.in_folder(segment.folder, number))
        name = self.layout.segment(key.tenant, key.session_id, meta.generation, number)
        return self._container().get_blob_client(name)

    async def _download(self, blob: Any, offset: int, length: int | None) -> bytes:
        """Bytes of a segment from ``offset`` (to the end when ``length`` is ``None``).

        Blocks are counted from the headers in the data, never from the response's block-count header:
        Azurite can send a count that includes a block appended after the bytes it sends were taken.
        """
        if length == 0:
            return b""  # a segment a pop cut empty: nothing to ask for
        with driver_errors(self.config):
            try:
                downloader = await blob.download_blob(offset=offset, length=length)
                data = await downloader.readall()
            except ResourceNotFoundError as exc:
                raise _Gone from exc
            except HttpResponseError as exc:
                if exc.status_code == 416:  # Azure: nothing at or after offset (Azurite answers with no bytes)
                    return b""
                raise
        self.bytes_read += len(data)
        return bytes(data)

    def _records(self, data: bytes, start: int) -> list[tuple[str | None, bytes, int]]:
        parsed = list(_layout.lines(data, start))
        self._messages_read += sum(1 for token, _, _ in parsed if token is None)
        return parsed

    async def _delete_blobs(self, names: Sequence[str]) -> int:
        """Delete blobs (missing ones are fine); how many were there."""
        container, gate = self._container(), asyncio.Semaphore(_DELETE_CONCURRENCY)

        async def delete(name: str) -> int:
            async with gate:
                try:
                    await container.delete_blob(name)
                    return 1
                except ResourceNotFoundError:
                    return 0

        with driver_errors(self.config):
            return sum(await asyncio.gather(*(delete(name) for name in names)))

    async def _names(self, prefix: str) -> list[str]:
        with driver_errors(self.config):
            try:
                return [blob.name async for blob in self._container().list_blobs(name_starts_with=prefix)]
            except ResourceNotFoundError:
                return []

    # -- catching up with blocks the metadata does not cover yet ---------------------------------

    async def _catch_up(
        self, key: SessionKey, view: SessionMeta, token: str | None = None, taken: set[str] | None = None
    ) -> tuple[int, int] | None:
        """Take in the blocks past ``view``'s end (appends not yet in the metadata); where ``token``'s block ends.

        The ids of the records taken in are added to ``taken`` when given.
        """
        mine: tuple[int, int] | None = None
        while True:
            last = view.segments[-1] if view.segments else None
            if last is None or view.is_full(last):
                number, start = (0 if last is None else last.number + 1), 0
            else:
                number, start = last.number, last.length
            try:
                data = await self._download(self._segment(key, view, number), start, None)
            except _Gone:
                return mine  # the next segment does not exist (yet)
            if not data:
                return mine
            found = self._take_in(view, number, start, data, taken)
            if token in found:
                mine = (number, found[token])
            view.keep_window(self.config.settings.index_window)
            if not view.is_full(view.segments[-1]):
                return mine

    def _take_in(
        self, view: SessionMeta, number: int, start: int, data: bytes, taken: set[str] | None = None
    ) -> dict[str, int]:
        """Add the blocks in ``data`` (segment bytes from ``start``) to ``view``; each block's token -> its end."""
        ends: dict[str, int] = {}
        block: list[tuple[str, int]] = []
        records: list[bytes] = []
        block_start, token = start, None
        for line_token, record, end in self._records(data, start):
            if line_token is not None:
                if block:
                    view.add(number, None, block_start, block)
                    ends[token or ""] = block[-1][1]
                block, block_start, token = [], end - _layout.HEADER_BYTES, line_token
            else:
                block.append((_message_id(record), end))
                records.append(record)
                if taken is not None:
                    taken.add(block[-1][0])
        if block:
            view.add(number, None, block_start, block)
            ends[token or ""] = block[-1][1]
        view.usage += _usage_in(records)  # appends that landed before their metadata write: their usage too
        return ends

    async def _stored_among(self, key: SessionKey, view: SessionMeta, wanted: set[str]) -> set[str]:
        """Which of ``wanted`` are records older than the window (read from the history: the rare path)."""
        found: set[str] = set()
        oldest_in_window = view.next - view.window_size
        for record in await self._read_from(key, view, view.first, stop=oldest_in_window):
            message_id = _message_id(record)
            if message_id in wanted:
                found.add(message_id)
        return found

    # -- messages --------------------------------------------------------------------------------

    async def _append(self, key: SessionKey, messages: Sequence[Message], records: Sequence[str]) -> int:
        lines = [record.encode("utf-8", "surrogatepass") for record in records]
        if sum(len(line) + 1 for line in lines) + _layout.HEADER_BYTES > MAX_APPEND_BYTES:
            raise InvalidArgumentError(
                f"an append to Azure Blob Storage is one block of at most {MAX_APPEND_BYTES // 2**20} MiB; "
                "split this batch into smaller appends"
            )
        token = _layout.new_token()
        cached = self._cache.get(key)
        while True:
            etag: str | None
            if cached is not None:
                meta, etag = cached
                verified = False
            else:
                found = await self._read_meta(key)
                verified = True
                if found is None:
                    now = write_stamp()
                    meta = SessionMeta(
                        key.tenant,
                        key.session_id,
                        _layout.new_token(),
                        now,
                        now,
                        self.config.settings.segment_blocks,
                        self.config.settings.segment_bytes,
                    )
                    etag = None
                else:
                    meta, etag = found
            view = meta.copy()
            try:
                landed = await self._land(key, view, messages, lines, token)
            except _Gone:
                cached = None
                continue
            if landed is None:
                if verified:
                    return 0
                cached = None  # "already stored" from a cached copy: make sure with the stored metadata
                continue
            number, end, added = landed
            if await self._commit(key, view, etag, number, end):
                return added
            cached = None  # the session was deleted (and maybe re-created) meanwhile: append to what is there now

    async def _land(
        self, key: SessionKey, view: SessionMeta, messages: Sequence[Message], lines: list[bytes], token: str
    ) -> tuple[int, int, int] | None:
        """Append the batch's new records as one block; where the block ends and how many records it has.

        ``view`` takes the block in, with the new messages' usage.
        """
        ids = [message.message_id for message in messages]
        new = [n for n, message_id in enumerate(ids) if not view.has_id(message_id)]
        older = {ids[n] for n in new if view.may_be_older(ids[n])}
        if older:
            stored = await self._stored_among(key, view, older)
            new = [n for n in new if ids[n] not in stored]
        lost = 0
        while True:
            if not new:
                return None
            last = view.segments[-1] if view.segments else None
            fresh_segment = last is None or view.is_full(last)
            number = (0 if last is None else last.number + 1) if fresh_segment else last.number  # type: ignore[union-attr]
            start = 0 if fresh_segment else last.length  # type: ignore[union-attr]
            blob = self._segment(key, view, number)
            if fresh_segment:
                await self._create_segment(blob)
            block = _layout.frame(token, [lines[n] for n in new])
            with driver_errors(self.config):
                try:  # a cancelled append waits for its request's answer: it must not land after a reader looked
                    result = await finish_if_cancelled(
                        blob.append_block(io.BytesIO(block), length=len(block), appendpos_condition=start)
                    )
                except ResourceNotFoundError as exc:
                    raise _Gone from exc
                except HttpResponseError as exc:
                    if not _position_failed(exc):
                        raise
                    result = None
            if result is None:
                # Another append came first (or this one did, and its reply was lost): take the blocks in.
                # Only what the catch-up reads is new since the ids were checked: check against that alone
                # (older records may leave the window meanwhile, but were checked already).
                taken: set[str] = set()
                mine = await self._catch_up(key, view, token, taken)
                if mine is not None:
                    return mine[0], mine[1], len(new)
                new = [n for n in new if ids[n] not in taken]
                # Many writers on one session: a random pause after each lost race keeps them from
                # colliding round after round (each collision costs a request).
                lost += 1
                await asyncio.sleep(random.uniform(0, min(_RACE_PAUSE * 2**lost, 0.1)))
                continue
            ends, position = [], start + _layout.HEADER_BYTES
            for n in new:
                position += len(lines[n]) + 1
                ends.append((ids[n], position))
            view.add(number, None, start, ends)
            view.usage += usage_of(messages[n] for n in new)
            view.keep_window(self.config.settings.index_window)
            return number, position, len(new)

    async def _create_segment(self, blob: Any) -> None:
        async def create() -> None:
            await blob.create_append_blob(match_condition=MatchConditions.IfMissing)

        # Another writer may have made it: fine.
        with driver_errors(self.config), contextlib.suppress(ResourceExistsError, ResourceModifiedError):
            await self._write(create)

    async def _commit(self, key: SessionKey, view: SessionMeta, etag: str | None, number: int, end: int) -> bool:
        """Write the metadata covering the landed block; ``False`` if its generation is gone (append again)."""
        while True:
            _touch(view)
            if await self._put_meta(key, view, etag) is not None:
                return True
            found = await self._read_meta(key)
            if found is None or found[0].generation != view.generation:
                return False
            fresh, etag = found
            if fresh.covers(number, end):
                return True  # a writer behind this one took the block in
            if fresh.lost(number, end):
                return False  # a pop cut the segment before it saw this block: append again
            view = fresh.copy()
            await self._catch_up(key, view)

    async def _read_from(self, key: SessionKey, meta: SessionMeta, seq: int, *, stop: int | None = None) -> list[bytes]:
        """The records from ``seq`` on (to the segments' true end, or before ``stop``), in order."""
        if not meta.segments:
            view = meta.copy()
            await self._catch_up(key, view)  # a first append that landed but is not in the metadata yet
            return [] if not view.segments else await self._read_from(key, view, seq, stop=stop)
        if stop is not None and stop <= seq:
            return []
        index = meta.segment_index(seq)
        exact = meta.start_of(seq)
        offset = exact if exact is not None else (meta.first_offset if index == meta.segment_index(meta.first) else 0)
        skip = 0 if exact is not None else seq - max(meta.segments[index].first_seq, meta.first)
        # A ``stop`` before the newest segment: the segments after the one holding ``stop - 1`` are not read.
        end = len(meta.segments) if stop is None or stop > meta.next else meta.segment_index(stop - 1) + 1
        segments = meta.segments[index:end]
        starts = [offset] + [0] * (len(segments) - 1)
        reads = await asyncio.gather(
            *(
                self._download(
                    self._segment(key, meta, segment.number),
                    first,
                    None if segment is meta.segments[-1] and not segment.cut else segment.length - first,
                )
                for segment, first in zip(segments, starts, strict=True)
            )
        )
        records: list[bytes] = []
        for data, first in zip(reads, starts, strict=True):
            records += [record for token, record, _ in self._records(data, first) if token is None]
        if stop is not None and segments[-1] is not meta.segments[-1]:
            return records[skip : skip + stop - seq]  # the segments read are complete: none is the open one
        last = segments[-1]
        tail = reads[-1]
        blocks = last.blocks + _layout.headers_after(tail, starts[-1], last.length)
        number, length, cut = last.number, starts[-1] + len(tail), last.cut
        # The open segment may have filled up (or been cut) after the metadata was written: later ones hold the rest.
        while cut or blocks >= meta.limit_blocks or length >= meta.limit_bytes:
            number, cut = number + 1, False
            try:
                tail = await self._download(self._segment(key, meta, number), 0, None)
            except _Gone:
                break
            records += [record for token, record, _ in self._records(tail, 0) if token is None]
            blocks, length = _layout.headers_after(tail, 0, 0), len(tail)
        records = records[skip:]
        if stop is not None:
            records = records[: max(stop - seq, 0)]
        return records

    async def _load(self, key: SessionKey, last: int | None) -> list[Message]:
        for _ in range(5):
            found = await self._read_meta(key)
            if found is None:
                return []
            meta = found[0]
            start = meta.first if last is None or last >= meta.count else meta.next - last
            try:
                records = await self._read_from(key, meta, start)
            except _Gone:
                continue  # trimmed or deleted while we read: read the metadata again
            return decode_records(records[-last:] if last is not None else records)
        return []

    async def _load_before(self, key: SessionKey, before: int, last: int | None) -> list[Message]:
        """The range ending before position ``before``: the metadata, then the segments holding the range.

        Cost: one metadata read (and a look for landed appends when ``before`` reaches the count), then one ranged
        download per segment the range overlaps, from the first record's offset when the metadata's window knows
        it; the segments after the range are not read. Only the range's records are decoded.
        """
        for _ in range(5):
            found = await self._read_meta(key)
            if found is None:
                return []
            meta = found[0]
            if before >= meta.count:
                meta = await self._caught_up(key) or meta
            stop = meta.first + min(before, meta.count)
            start = meta.first if last is None else max(meta.first, stop - last)
            if stop <= start:
                return []
            try:
                records = await self._read_from(key, meta, start, stop=stop)
            except _Gone:
                continue  # trimmed or deleted while we read: read the metadata again
            return decode_records(records)
        return []

    async def _iter_messages(self, key: SessionKey, batch: int) -> AsyncIterator[Message]:
        found = await self._read_meta(key)
        if found is None:
            return
        meta = found[0]
        if not meta.segments:
            view = meta.copy()
            await self._catch_up(key, view)
            meta = view
            if not meta.segments:
                return
        index = meta.segment_index(meta.first)
        number, offset = meta.segments[index].number, meta.first_offset
        span = (meta.ends[-1] - meta.window_start) if meta.window_size else 0
        average = span / meta.window_size if meta.window_size and span > 0 else 1024.0
        pending, blocks_seen = b"", 0
        while True:
            size = int(batch * average * 1.2) + 64
            cut = meta.cut_at(number)
            if cut is not None:
                size = max(min(size, cut - offset), 0)  # a cut segment's live bytes end at the cut
            try:
                data = await self._download(self._segment(key, meta, number), offset, size)
            except _Gone:
                return  # deleted (or trimmed away) while we read
            chunk = pending + data
            parsed = self._records(chunk, offset - len(pending))
            consumed = parsed[-1][2] - (offset - len(pending)) if parsed else 0
            pending = chunk[consumed:]
            offset += len(data)
            known_blocks, known_length = meta.known(number)
            blocks_seen = max(blocks_seen, known_blocks) + sum(
                1 for token, _, end in parsed if token is not None and end - _layout.HEADER_BYTES >= known_length
            )
            records = [record for token, record, _ in parsed if token is None]
            for message in decode_records(records):
                yield message
            if cut is not None:
                if offset >= cut or len(data) < size:
                    number, offset, pending, blocks_seen = number + 1, 0, b"", 0
            elif len(data) < size:
                if blocks_seen < meta.limit_blocks and offset < meta.limit_bytes:
                    return
                number, offset, pending, blocks_seen = number + 1, 0, b"", 0

    async def _count(self, key: SessionKey) -> int:
        view = await self._caught_up(key)
        return 0 if view is None else view.count

    async def _caught_up(self, key: SessionKey) -> SessionMeta | None:
        """The session's metadata with the appends landed before their metadata write taken in (``None``: none)."""
        found = await self._read_meta(key)
        if found is None:
            return None
        view = found[0].copy()
        try:
            await self._catch_up(key, view)
        except _Gone:
            return found[0]
        return view

    async def _delete(self, key: SessionKey) -> bool:
        self._cache.pop(key, None)
        try:
            found = await self._read_meta(key)
        except SessionFormatError:
            found = None  # damaged: deleting it is the way out (what it refers to stays, unreferenced)
        existed = await self._delete_blobs([self.layout.meta(key.tenant, key.session_id)])
        self._cache.pop(key, None)
        await self._forget(key.tenant, key.session_id, None if found is None else found[0])
        return existed > 0

    async def _forget(self, tenant: str, session_id: str, meta: SessionMeta | None) -> None:
        """After a session's metadata blob is deleted: its data (but what forks refer to), references and tags."""
        await self._sweep(self.layout.data(tenant, session_id), {})
        if meta is not None:
            await self._release(tenant, session_id, meta, meta.references())
            await self._delete_blobs([self.layout.tagged(tenant, tag, session_id) for tag in meta.tags])

    async def _trim(self, key: SessionKey, keep_last: int) -> int:
        while True:
            found = await self._read_meta(key)
            if found is None:
                return 0
            meta, etag = found
            view = meta.copy()
            try:
                await self._catch_up(key, view)
                removed = max(view.count - keep_last, 0)
                if not removed:
                    return 0
                new_first = view.next - keep_last
                offset = view.start_of(new_first)
                if offset is None:
                    offset = await self._offset_of(key, view, new_first)
                usage = await self._usage_between(key, view, new_first, view.next)
            except _Gone:
                continue
            referred = view.references()
            gone = view.trim(keep_last, offset)
            view.usage = usage
            _touch(view)
            if await self._put_meta(key, view, etag) is None:
                continue
            if any(segment.folder is None for segment in gone):
                own = self.layout.in_folder(self.layout.folder(key.tenant, key.session_id, view.generation))
                await self._sweep(own, {own: view.own_from()})
            left = view.references()
            await self._release(key.tenant, key.session_id, view, {f: n for f, n in referred.items() if f not in left})
            return removed

    async def _usage_between(self, key: SessionKey, view: SessionMeta, start: int, stop: int) -> SessionUsage:
        """The usage of records ``start`` to ``stop`` (excluded) of ``view``: what a trim keeps, or a fork takes.

        Read from the smaller side: those records, or the others (whose usage comes off the session's).
        """
        if not view.usage:
            return SessionUsage()
        if stop - start <= view.count - (stop - start):
            return _usage_in(await self._read_from(key, view, start, stop=stop))
        outside = await self._read_from(key, view, view.first, stop=start) if start > view.first else []
        if stop < view.next:
            outside += await self._read_from(key, view, stop, stop=view.next)
        return view.usage - _usage_in(outside)

    async def _pop(self, key: SessionKey) -> Message | None:
        """Cut the newest record off with one conditional metadata write (If-Match), as an append commits."""
        lost = 0
        while True:
            found = await self._read_meta(key)
            if found is None:
                return None
            meta, etag = found
            view = meta.copy()
            try:
                await self._catch_up(key, view)  # appends landed but not committed yet come first
                if not view.count:
                    return None
                newest = view.next - 1
                record = (await self._read_from(key, view, newest, stop=view.next))[0]
                start = view.start_of(newest)
                if start is None:  # earlier pops emptied the window
                    start = await self._offset_of(key, view, newest)
            except _Gone:
                continue
            view.pop(start)
            if view.usage:  # (a session written before usage was kept has none to take off)
                view.usage -= _usage_in([record])
            _touch(view)
            if await self._put_meta(key, view, etag) is not None:
                return decode_records([record])[0]
            lost += 1  # another writer came first: as after a lost append race, pause at random, then again
            await asyncio.sleep(random.uniform(0, min(_RACE_PAUSE * 2**lost, 0.1)))

    async def _offset_of(self, key: SessionKey, view: SessionMeta, seq: int, *, end: bool = False) -> int:
        """Where record ``seq`` starts (or ``end``s) in its segment, by reading the segment up to it (rare path)."""
        index = view.segment_index(seq)
        segment = view.segments[index]
        start = view.first_offset if index == view.segment_index(view.first) else 0
        current = max(segment.first_seq, view.first)
        data = await self._download(self._segment(key, view, segment.number), start, segment.length - start)
        position = start
        for token, _, stop in self._records(data, start):
            if token is None:
                if current == seq:
                    return stop if end else position
                current += 1
            position = stop
        return position

    # -- forks -----------------------------------------------------------------------------------

    async def _fork(self, source: SessionKey, target: SessionKey, through: str | None) -> int:
        """Write the target's metadata: the source's, cut after ``through`` (see the module's notes on references).

        Reads the source's metadata (and the blocks beyond it), and records only to name the newest message
        (``through=None``) or to find one older than the window, and for the usage after the cut when the source
        has usage: never the history.
        """
        while True:
            found = await self._read_meta(source)
            if found is None:
                raise fork_source_error(source, through)
            view = found[0].copy()
            try:
                await self._catch_up(source, view)
                seq = view.next - 1 if through is None else await self._seq_of(source, view, through)
                if seq is None or not view.count:
                    raise fork_source_error(source, through)
                through_id = through
                if through_id is None:
                    through_id = _message_id((await self._read_from(source, view, seq, stop=seq + 1))[0])
                cut = view.ends[seq - (view.next - view.window_size)] if seq >= view.next - view.window_size else None
                if cut is None:
                    cut = await self._offset_of(source, view, seq, end=True)
                usage = await self._usage_between(source, view, view.first, seq + 1)
            except _Gone:
                continue
            folder = self.layout.folder(source.tenant, source.session_id, view.generation)
            fork = view.forked(seq, cut, folder, target.session_id, _layout.new_token(), write_stamp())
            fork.usage, fork.forked_from = usage, (source.session_id, through_id)
            references = fork.references()
            holder = self._holder(target.tenant, target.session_id, fork)
            await self._refer(references, holder)
            again = await self._read_meta(source)
            if again is None or (again[0].generation, again[0].first) != (view.generation, view.first):
                # Deleted or trimmed since: what it took may be gone. Take back the references, and look again.
                await self._release(target.tenant, target.session_id, fork, references)
                continue
            await self._tag(target, fork.tags)
            if await self._put_meta(target, fork, None) is None:
                await self._release(target.tenant, target.session_id, fork, references)
                raise fork_target_exists_error(target)
            return fork.count

    async def _seq_of(self, key: SessionKey, view: SessionMeta, message_id: str) -> int | None:
        """The sequence number of ``message_id`` in the session (``None``: not there); older than the window, read."""
        seq = view.seq_of(message_id)
        if seq is not None or not view.may_be_older(message_id):
            return seq
        older = await self._read_from(key, view, view.first, stop=view.next - view.window_size)
        for n, record in enumerate(older):
            if _message_id(record) == message_id:
                return view.first + n
        return None

    def _holder(self, tenant: str, session_id: str, meta: SessionMeta) -> str:
        """How a session's references name it: its hash and generation (a new session at the key has its own)."""
        return f"{_layout.session_hash(tenant, session_id)}.{meta.generation}"

    async def _refer(self, references: dict[str, int], holder: str) -> None:
        """Write ``holder``'s references to the segments it takes of other sessions' data folders."""
        container = self._container()

        def put(name: str) -> Callable[[], Awaitable[Any]]:
            return lambda: container.upload_blob(name, b"", overwrite=True)

        names = [self.layout.ref(folder, high, holder) for folder, high in references.items()]
        with driver_errors(self.config):
            await asyncio.gather(*(self._write(put(name)) for name in names))

    async def _release(self, tenant: str, session_id: str, meta: SessionMeta, references: dict[str, int]) -> None:
        """Drop the session's references to ``references`` (its metadata no longer holds them), then sweep each."""
        holder = self._holder(tenant, session_id, meta)
        await self._delete_blobs([self.layout.ref(folder, high, holder) for folder, high in references.items()])
        for folder in references:
            try:
                owner = await self._meta_at(self.layout.meta_of_folder(folder))  # who holds them first, then refs
            except SessionFormatError:
                continue  # a damaged owner: keep all it may hold
            prefix = self.layout.in_folder(folder)
            if owner is None or owner.generation != folder.rsplit("/", 1)[-1]:
                await self._sweep(prefix, {})  # that session (this generation of it) is gone: only references keep
            else:
                await self._sweep(prefix, {prefix: owner.own_from()})

    async def _sweep(self, prefix: str, keep_from: dict[str, int]) -> None:
        """Delete the segments under ``prefix`` that nobody holds: below ``keep_from`` of their folder (any, for a
        folder not in it: its session is gone), and above the highest segment a reference in that folder keeps."""
        names = await self._names(prefix)
        referred: dict[str, int] = {}
        segments: list[tuple[str, str, int]] = []
        for name in names:
            folder, number, is_reference = _layout.parse_data_name(name)
            if is_reference:
                referred[folder] = max(referred.get(folder, -1), number)
            else:
                segments.append((name, folder, number))
        await self._delete_blobs(
            [
                name
                for name, folder, number in segments
                if number > referred.get(folder, -1) and (folder not in keep_from or number < keep_from[folder])
            ]
        )

    async def _usage(self, key: SessionKey) -> SessionUsage:
        """The usage the metadata keeps (with that of appends landed before their metadata write)."""
        view = await self._caught_up(key)
        return SessionUsage() if view is None else view.usage

    # -- titles and tags -------------------------------------------------------------------------

    async def _update_info(
        self, key: SessionKey, title: str | None, tags: frozenset[str] | None, metadata: dict[str, Any] | None
    ) -> bool:
        """Write the metadata with If-Match; a new tag's index entry is written before, an old one deleted after."""
        while True:
            found = await self._read_meta(key)
            if found is None:
                return False
            meta, etag = found
            view = meta.copy()
            dropped: dict[str, str] = {}
            if title is not None:
                view.title = title or None
            if metadata is not None:
                view.metadata = metadata
            if tags is not None:
                await self._tag(key, tags - set(view.tags))
                dropped = await self._entries(key, set(view.tags) - tags)
                view.tags = sorted(tags)
            _touch(view)
            if await self._put_meta(key, view, etag) is None:
                continue
            await self._untag(key, dropped)
            return True

    async def _tag(self, key: SessionKey, tags: Iterable[str]) -> None:
        """Write the session's entries in the indexes of ``tags`` (a new ETag each time: see :meth:`_untag`)."""
        container = self._container()

        def put(name: str) -> Callable[[], Awaitable[Any]]:
            return lambda: container.upload_blob(name, b"", overwrite=True)

        names = [self.layout.tagged(key.tenant, tag, key.session_id) for tag in tags]
        with driver_errors(self.config):
            await asyncio.gather(*(self._write(put(name)) for name in names))

    async def _entries(self, key: SessionKey, tags: Iterable[str]) -> dict[str, str]:
        """The ETags of the session's entries in the indexes of ``tags`` (those that exist)."""
        container = self._container()

        async def etag(tag: str) -> tuple[str, str | None]:
            name = self.layout.tagged(key.tenant, tag, key.session_id)
            try:
                return name, str((await container.get_blob_client(name).get_blob_properties()).etag)
            except ResourceNotFoundError:
                return name, None

        with driver_errors(self.config):
            found = await asyncio.gather(*(etag(tag) for tag in tags))
        return {name: value for name, value in found if value is not None}

    async def _untag(self, key: SessionKey, entries: dict[str, str]) -> None:
        """Delete index entries the metadata dropped, each only if unchanged: a writer that tagged it again since
        rewrote it (and its metadata carries the tag)."""
        container = self._container()

        async def delete(name: str, etag: str) -> None:
            with contextlib.suppress(ResourceModifiedError, ResourceNotFoundError):
                await container.delete_blob(name, etag=etag, match_condition=MatchConditions.IfNotModified)

        with driver_errors(self.config):
            await asyncio.gather(*(delete(name, etag) for name, etag in entries.items()))

    async def _list_tagged_sessions(self, tenant: str, tag: str, limit: int, cursor: str | None) -> SessionPage:
        """A page of the sessions in the tag's index: one listing of it, and the listing fields of each (a HEAD)."""
        names = await self._names(self.layout.tagged(tenant, tag))
        gate = asyncio.Semaphore(_DELETE_CONCURRENCY)

        async def row(entry: str) -> _Row | None:
            async with gate:
                found = await self._row_at(f"{self.layout.metas(tenant)}{entry.rsplit('/', 1)[-1]}")
            if found is None:
                return None  # deleted since (its entries go after its metadata)
            info = await self._info_of(found)
            return found._replace(info=info) if tag in info.get("tags", ()) else None  # entries of an old tag wait

        with driver_errors(self.config):
            rows = await asyncio.gather(*(row(entry) for entry in names))
        return await self._page(tenant, [r for r in rows if r is not None], limit, cursor)

    # -- sessions --------------------------------------------------------------------------------

    async def _listing(self, prefix: str, tenant: str | None = None, damaged: list[str] | None = None) -> list[_Row]:
        """The row of every metadata blob under ``prefix``.

        A metadata blob's listing fields are its blob metadata, so one listing reads them all. A blob without them
        (overwritten by a tool that dropped them, or damaged) is read when ``tenant`` is given: one whose content
        is damaged too is listed under the id it still names, so that reading it reports the damage, and one that
        no longer names its session is described in ``damaged`` (what it is, where, and how to remove it).
        """
        rows, unlisted = [], []
        with driver_errors(self.config):
            try:
                async for blob in self._container().list_blobs(name_starts_with=prefix, include=["metadata"]):
                    fields = {name.lower(): value for name, value in (blob.metadata or {}).items()}
                    if not {"sid", "count", "created", "updated"} <= set(fields):
                        unlisted.append(blob)
                        continue
                    rows.append(self._row(fields, str(blob.name), str(blob.etag)))
            except ResourceNotFoundError:
                return []
        if tenant is not None:
            for blob in unlisted:
                row = await self._unlisted_row(tenant, blob)
                if isinstance(row, str):
                    if damaged is not None:
                        damaged.append(row)
                elif row is not None:
                    rows.append(row)
        return rows

    @staticmethod
    def _row(fields: dict[str, str], name: str, etag: str) -> _Row:
        """The row of a metadata blob whose listing fields (blob metadata, keys in lower case) are ``fields``."""
        return _Row(
            int(fields["updated"]),
            _layout.decode_id(fields["sid"]),
            int(fields["count"]),
            int(fields["created"]),
            name,
            etag,
            decode_info(fields.get("info")),
        )

    async def _unlisted_row(self, tenant: str, blob: Any) -> _Row | str | None:
        """The listing row of a metadata blob that lacks its listing fields (``None``: it is gone, or not ours).

        A blob damaged so that it no longer says which session it is gives the text naming it instead.
        """
        try:
            raw = await self._download(self._container().get_blob_client(blob.name), 0, None)
        except _Gone:
            return None
        self.bytes_read -= len(raw)  # metadata, not segment data
        created = time_stamp(blob.creation_time or blob.last_modified)
        updated = time_stamp(blob.last_modified)
        try:
            meta = SessionMeta.from_json(raw)
        except _META_DAMAGE as exc:
            session_id = _named_id(raw)
            if session_id is None or self.layout.meta(tenant, session_id) != blob.name:
                return (
                    f"the metadata blob {blob.name} in {self.config.where} is damaged ({exc}); restore it, or "
                    f"delete it and the folder {self.layout.data_of_meta(str(blob.name))} (the session's "
                    "messages) with the Azure tools"
                )
            return _Row(updated, session_id, 0, created, str(blob.name), str(blob.etag), {})
        if meta.tenant != tenant or self.layout.meta(tenant, meta.session_id) != blob.name:
            return None
        info = meta.info()
        return _Row(meta.updated, meta.session_id, meta.count, meta.created, str(blob.name), str(blob.etag), info)

    async def _row_at(self, name: str, tenant: str | None = None) -> _Row | None:
        """The listing row of the metadata blob ``name``, from its properties (one HEAD); ``None``: no such blob.

        A blob without listing fields is read as a listing of ``tenant`` reads it when ``tenant`` is given (one so
        damaged that it names no session raises :class:`SessionFormatError` saying so); else it is ``None``.
        """
        try:
            properties = await self._container().get_blob_client(name).get_blob_properties()
        except ResourceNotFoundError:
            return None
        fields = {field.lower(): value for field, value in (properties.metadata or {}).items()}
        if {"sid", "count", "created", "updated"} <= set(fields):
            return self._row(fields, name, str(properties.etag))
        found = None if tenant is None else await self._unlisted_row(tenant, properties)
        if isinstance(found, str):
            raise SessionFormatError(found)
        return found

    async def _session_info(self, key: SessionKey) -> SessionInfo | None:
        """The session's listing entry, from its metadata blob's properties (one HEAD; its info, when too large for
        them, from the blob), decoded as ``list_sessions`` decodes its rows."""
        with driver_errors(self.config):
            row = await self._row_at(self.layout.meta(key.tenant, key.session_id), key.tenant)
            if row is None:
                return None
            info = await self._info_of(row)
        return session_info(key.tenant, row.session_id, row.messages, row.created, row.updated, info)

    async def _list_sessions(self, tenant: str, limit: int, cursor: str | None) -> SessionPage:
        """One page, newest first: one listing of the tenant's metadata folder, sorted here (see the docs)."""
        damaged: list[str] = []
        page = await self._page(tenant, await self._listing(self.layout.metas(tenant), tenant, damaged), limit, cursor)
        if damaged:  # named, with the others listed in the error: never a session passed over in silence
            raise damaged_listing_error(tenant, page, damaged)
        return page

    async def _page(self, tenant: str, rows: list[_Row], limit: int, cursor: str | None) -> SessionPage:
        """One page of ``rows`` newest first, after ``cursor`` (the keyset ``(updated, id)``)."""
        after = None if cursor is None else decode_cursor(cursor, int, str)
        rows = [row for row in _newest_first(rows) if after is None or (row.updated, row.session_id) < after]
        infos = await asyncio.gather(*(self._info_of(row) for row in rows[:limit]))
        items = [
            session_info(tenant, row.session_id, row.messages, row.created, row.updated, info)
            for row, info in zip(rows[:limit], infos, strict=True)
        ]
        last = rows[limit - 1] if len(rows) > limit else None
        return SessionPage(items, None if last is None else encode_cursor(last.updated, last.session_id))

    async def _info_of(self, row: _Row) -> dict[str, Any]:
        """A listed session's info: from the listing, or (too large for it) from its metadata blob."""
        if row.info is not None:
            return row.info
        meta = await self._meta_at(row.name)
        return {} if meta is None else meta.info()

    async def _meta_at(self, name: str) -> SessionMeta | None:
        """The metadata blob ``name`` (``None``: gone), without a key: for a listing, or a sweep of another session."""
        try:
            raw = await self._download(self._container().get_blob_client(name), 0, None)
        except _Gone:
            return None
        self.bytes_read -= len(raw)  # metadata, not segment data
        try:
            return SessionMeta.from_json(raw)
        except _META_DAMAGE as exc:
            raise SessionFormatError(
                f"the metadata blob {name} in {self.config.where} is damaged ({exc}); restore it, or delete it "
                f"and the folder {self.layout.data_of_meta(name)} (the session's messages) with the Azure tools"
            ) from exc

    async def _save_session(
        self, key: SessionKey, session: AgentSession, expected_version: str | Absent | None, owner: str | None
    ) -> str:
        # Every write is conditional on the metadata blob's ETag (or on its absence: If-None-Match), so of
        # concurrent ABSENT creators one writes and the others read its document on their next turn.
        document = session_document(session)
        version = uuid.uuid4().hex
        while True:
            found = await self._read_meta(key)
            if found is None:
                if isinstance(expected_version, str):
                    raise conflict_error(key.session_id, expected_version, exists=False)
                now = write_stamp()
                view = SessionMeta(
                    key.tenant,
                    key.session_id,
                    _layout.new_token(),
                    now,
                    now,
                    self.config.settings.segment_blocks,
                    self.config.settings.segment_bytes,
                )
                etag: str | None = None
            else:
                stored, etag = found
                if stored.version == version:
                    return version  # our own write, whose reply was lost and retried
                if owner is not None and stored.owner not in (None, owner):
                    raise owner_error()
                if expected_version is ABSENT and stored.version is not None:
                    raise conflict_error(key.session_id, ABSENT, exists=True)
                if isinstance(expected_version, str) and stored.version != expected_version:
                    raise conflict_error(key.session_id, expected_version, exists=stored.version is not None)
                view = stored.copy()
            view.document, view.version = document, version
            if owner is not None:
                view.owner = owner
            _touch(view)
            if await self._put_meta(key, view, etag) is not None:
                return version

    async def _load_session(self, key: SessionKey) -> StoredSession | None:
        found = await self._read_meta(key)
        if found is None or found[0].document is None or found[0].version is None:
            return None
        meta = found[0]
        return decode_session_document(key, meta.document or "", meta.version or "", meta.owner)

    # -- retention -------------------------------------------------------------------------------

    async def _prune(self, cutoff: datetime, tenant: str | None) -> int:
        """Delete sessions last updated before ``cutoff``: each metadata blob only if unchanged since listed."""
        before = time_stamp(cutoff)
        removed = 0
        container = self._container()
        for row in await self._listing(self.layout.metas(tenant)):
            if row.updated >= before:
                continue
            try:
                meta = await self._meta_at(row.name)  # what it refers to and its tags go with it
            except SessionFormatError:
                meta = None
            with driver_errors(self.config):
                try:
                    await container.delete_blob(row.name, etag=row.etag, match_condition=MatchConditions.IfNotModified)
                except (ResourceModifiedError, ResourceNotFoundError):
                    continue  # written (or deleted) since it was listed: not ours to remove
            removed += 1
            if meta is not None and self.layout.meta(meta.tenant, meta.session_id) == row.name:
                await self._forget(meta.tenant, meta.session_id, meta)
            else:
                await self._sweep(self.layout.data_of_meta(row.name), {})
        self._cache.clear()
        return removed

    async def _list_tenants(self) -> list[str]:
        """One listing of the metadata folders (one per tenant, named by its hash), then each one's tenant name.

        A folder exists while it holds a metadata blob; the tenant's name is inside its metadata blobs (the
        listing metadata has only the session id), so one of them is read per tenant.
        """
        with driver_errors(self.config):
            try:
                walk = self._container().walk_blobs(name_starts_with=self.layout.metas(), delimiter="/")
                folders = [str(item.name) async for item in walk if str(item.name).endswith("/")]
            except ResourceNotFoundError:
                return []
            found = [await self._tenant_in(folder) for folder in folders]
        return [tenant for tenant in found if tenant is not None]

    async def _tenant_in(self, folder: str) -> str | None:
        """The tenant named by the first readable metadata blob in ``folder`` (``None``: the folder emptied)."""
        container, damaged = self._container(), 0
        async for blob in container.list_blobs(name_starts_with=folder):
            try:
                raw = await (await container.get_blob_client(blob.name).download_blob()).readall()
            except ResourceNotFoundError:
                continue  # deleted since it was listed
            try:
                tenant = json.loads(raw.decode("utf-8", "surrogatepass"))["tenant"]
            except (ValueError, KeyError, TypeError):
                tenant = None
            if isinstance(tenant, str):
                return tenant
            damaged += 1  # another session of the tenant may name it
        if damaged:
            raise SessionFormatError(
                f"every session metadata blob under {folder} is damaged ({damaged}), so the tenant they belong to "
                "cannot be named; restore those blobs from a backup, or delete them (and their segments under "
                f"{self.layout.prefix}/d/ in the folder of the same name)"
            )
        return None

    async def _delete_tenant(self, tenant: str) -> int:
        metas = await self._names(self.layout.metas(tenant))
        removed = await self._delete_blobs(metas)
        await self._delete_blobs(await self._names(self.layout.data(tenant)))  # forks stay in their tenant: all go
        await self._delete_blobs(await self._names(self.layout.tagged(tenant)))
        self._cache.clear()
        return removed


def open_store(url: str, **options: Any) -> BlobHistoryStore:
    """Open a store from ``azblob://CONTAINER[/PREFIX][?account_url=URL&OPTION=VALUE...]``; connects on first use.

    The account comes from ``connection_string=`` or ``AZURE_STORAGE_CONNECTION_STRING``, or from
    ``account_url`` with ``sas_token=`` (or ``AZURE_STORAGE_SAS_TOKEN``), ``credential=`` or
    ``DefaultAzureCredential``; secrets never go in the URL. Keyword options override the query.

    Raises:
        BlobURLError: the URL is malformed, carries a secret, or an option is unknown or malformed.
    """
    return BlobHistoryStore(url, **options)


class BlobHistoryProvider(BackendHistoryProvider):
    """A history provider on Azure Blob Storage, taking the arguments every named provider takes.

    Example:
        ``BlobHistoryProvider("azblob://chatkeep", max_messages=20)`` keeps each session's history in the
        container ``chatkeep`` of the account in ``AZURE_STORAGE_CONNECTION_STRING`` and sends the model the
        20 newest messages.
    """

    store_class = BlobHistoryStore
    default_url = "azblob://chatkeep"
