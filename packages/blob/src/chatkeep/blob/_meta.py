"""A session's metadata blob: what it holds, and how an append, a trim, a pop or a tail read changes it.

The metadata is the session's index and its commit point. Segments hold the records; the metadata says
which generation and segments are live, the sequence numbers (``count = next - first``), and a window over
the newest records: each one's id fingerprint, UUIDv7 timestamp and end offset. The window makes
``load(last=k)`` one ranged read of exactly those bytes and lets an append check its ids without reading
the history. Ids that left the window are summarised by the newest UUIDv7 timestamp among them (and whether
any was not a UUIDv7), so an append whose ids cannot be among them (every fresh message) needs no history.

It also keeps what a session carries beside its messages: the usage of its records (every write that adds or
removes records changes it in the same metadata write), its title, tags and metadata, and the fork it came from.
A fork's metadata is its source's, cut after the message it was forked through: the same segments (naming the
data folder they live in) and the window up to the cut.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field, replace
from typing import Any

from chatkeep.blob._layout import NOT_UUID7, digest, encode_id, id_timestamp
from chatkeep.core import ForkInfo, SessionInfo, SessionUsage
from chatkeep.core.backend import stamp_time

__all__ = ["FORMAT", "READ_META", "Segment", "SessionMeta", "decode_info", "session_info"]

FORMAT = 1
_ENTRY = 16  # 10-byte digest + 6-byte timestamp
#: Azure takes 8 KiB of blob metadata per blob: info larger than this is read from the metadata blob instead.
_LISTING_BYTES = 7 * 1024
#: The listing's ``info`` when it did not fit there: read the metadata blob.
READ_META = "@"


@dataclass
class Segment:
    """One append blob of the session: its number, the sequence number of its first record, blocks and bytes.

    A pop *cuts* the segment holding the newest record: ``length`` moves back to where that record starts and
    ``seen`` keeps how many bytes the pop had taken in. A cut segment takes no more blocks, and its bytes past
    ``length`` are dead: the popped records, then (past ``seen``) blocks of writers who lost to the pop.
    """

    number: int
    first_seq: int
    blocks: int = 0
    length: int = 0
    seen: int | None = None  # set once the segment is cut
    folder: str | None = None  # the data folder (T/S/GEN) of the session it came from, for a fork's inherited one

    @property
    def cut(self) -> bool:
        return self.seen is not None

    def fields(self) -> list[Any]:
        """The segment as the metadata's JSON holds it (``seen`` only once it is cut, ``folder`` only inherited)."""
        head: list[Any] = [self.number, self.first_seq, self.blocks, self.length]
        if self.folder is not None:
            return [*head, self.seen, self.folder]
        return head if self.seen is None else [*head, self.seen]


@dataclass
class SessionMeta:
    """The JSON document in ``P/m/T/S`` (see the module's notes)."""

    tenant: str
    session_id: str
    generation: str
    created: int
    updated: int
    limit_blocks: int
    limit_bytes: int
    first: int = 0
    next: int = 0
    first_offset: int = 0
    segments: list[Segment] = field(default_factory=list)
    window: bytearray = field(default_factory=bytearray)  # _ENTRY bytes per record, oldest first
    ends: list[int] = field(default_factory=list)
    window_start: int = 0
    evicted_max: int = -1
    evicted_other: bool = False
    document: str | None = None
    version: str | None = None
    owner: str | None = None
    usage: SessionUsage = field(default_factory=SessionUsage)
    title: str | None = None
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    forked_from: tuple[str, str] | None = None  # the source's session id and the message it was forked through
    _digests: set[bytes] | None = field(default=None, repr=False, compare=False)

    # -- (de)serialization -----------------------------------------------------------------------

    def to_json(self) -> bytes:
        body: dict[str, Any] = {
            "v": FORMAT,
            "tenant": self.tenant,
            "session_id": self.session_id,
            "gen": self.generation,
            "created": self.created,
            "updated": self.updated,
            "limits": [self.limit_blocks, self.limit_bytes],
            "first": self.first,
            "next": self.next,
            "first_offset": self.first_offset,
            "segments": [s.fields() for s in self.segments],
            "window": base64.b64encode(bytes(self.window)).decode("ascii"),
            "ends": self.ends,
            "window_start": self.window_start,
            "evicted": [self.evicted_max, self.evicted_other],
            "doc": self.document,
            "ver": self.version,
            "owner": self.owner,
            **self.info(),
        }
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")

    @classmethod
    def from_json(cls, raw: bytes) -> SessionMeta:
        body = json.loads(raw.decode("utf-8", "surrogatepass"))
        if body.get("v") != FORMAT:
            raise ValueError(f"session metadata format {body.get('v')!r} is not {FORMAT}")
        evicted_max, evicted_other = body["evicted"]
        return cls(
            tenant=body["tenant"],
            session_id=body["session_id"],
            generation=body["gen"],
            created=body["created"],
            updated=body["updated"],
            limit_blocks=body["limits"][0],
            limit_bytes=body["limits"][1],
            first=body["first"],
            next=body["next"],
            first_offset=body["first_offset"],
            segments=[Segment(*s) for s in body["segments"]],
            window=bytearray(base64.b64decode(body["window"])),
            ends=list(body["ends"]),
            window_start=body["window_start"],
            evicted_max=evicted_max,
            evicted_other=evicted_other,
            document=body["doc"],
            version=body["ver"],
            owner=body["owner"],
            **_info_fields(body),
        )

    def info(self) -> dict[str, Any]:
        """Usage, title, tags, metadata and fork parent, as the JSON (and the listing's ``info``) holds them."""
        body: dict[str, Any] = {}
        if self.usage:
            body["usage"] = self.usage.to_dict()
        if self.title is not None:
            body["title"] = self.title
        if self.tags:
            body["tags"] = self.tags
        if self.metadata:
            body["meta"] = self.metadata
        if self.forked_from is not None:
            body["fork"] = list(self.forked_from)
        return body

    def listing(self) -> dict[str, str]:
        """Blob metadata for ``list_sessions`` and ``prune``, which read it from one listing of the folder.

        ``info`` (usage, title, tags, metadata, fork parent) goes with it when it fits in what Azure takes;
        else it says :data:`READ_META`, and a listing reads the metadata blob of that session.
        """
        fields = {
            "sid": encode_id(self.session_id),
            "count": str(self.count),
            "created": str(self.created),
            "updated": str(self.updated),
        }
        info = self.info()
        if info:
            text = json.dumps(info, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
            inline = base64.urlsafe_b64encode(text).decode("ascii")
            fields["info"] = inline if len(inline) + len(fields["sid"]) <= _LISTING_BYTES else READ_META
        return fields

    def copy(self) -> SessionMeta:
        return replace(
            self,
            segments=[replace(s) for s in self.segments],
            window=bytearray(self.window),
            ends=list(self.ends),
            tags=list(self.tags),
            _digests=None,
        )

    def forked(self, seq: int, end: int, folder: str, session_id: str, generation: str, now: int) -> SessionMeta:
        """A fork of this session through record ``seq``, which ends at byte ``end`` of its segment.

        ``folder`` is this session's data folder: the fork lists this session's segments up to the cut (the
        last one cut at ``end``), each naming where it lives, and the window's entries up to the cut. Nothing
        is read or copied but this metadata; the usage is the caller's to set.
        """
        segments = [replace(s, folder=s.folder or folder) for s in self.segments[: self.segment_index(seq) + 1]]
        segments[-1].length = segments[-1].seen = end
        keep = max(seq - (self.next - self.window_size) + 1, 0)
        return SessionMeta(
            self.tenant,
            session_id,
            generation,
            now,
            now,
            self.limit_blocks,
            self.limit_bytes,
            first=self.first,
            next=seq + 1,
            first_offset=self.first_offset,
            segments=segments,
            window=self.window[: keep * _ENTRY],
            ends=self.ends[:keep],
            window_start=self.window_start if keep else 0,
            evicted_max=self.evicted_max,
            evicted_other=self.evicted_other,
            title=self.title,
            tags=list(self.tags),
            metadata=json.loads(json.dumps(self.metadata)),
        )

    def references(self) -> dict[str, int]:
        """The data folders of other sessions this one holds segments of, each with the highest segment number."""
        found: dict[str, int] = {}
        for segment in self.segments:
            if segment.folder is not None:
                found[segment.folder] = max(found.get(segment.folder, -1), segment.number)
        return found

    def own_from(self) -> int:
        """The lowest segment number this session holds (or may hold, once appended) in its own data folder."""
        own = [s.number for s in self.segments if s.folder is None]
        if own:
            return min(own)
        return self.segments[-1].number + 1 if self.segments else 0

    def seq_of(self, message_id: str) -> int | None:
        """The sequence number of ``message_id`` when it is in the window (``None``: not there)."""
        wanted = digest(message_id)
        for n in range(len(self.window) // _ENTRY - 1, -1, -1):
            if self.window[n * _ENTRY : n * _ENTRY + 10] == wanted:
                return self.next - self.window_size + n
        return None

    # -- reading ---------------------------------------------------------------------------------

    @property
    def count(self) -> int:
        return self.next - self.first

    @property
    def window_size(self) -> int:
        return len(self.ends)

    def has_id(self, message_id: str) -> bool:
        """Whether ``message_id`` is one of the window's records."""
        if self._digests is None:
            self._digests = {bytes(self.window[n : n + 10]) for n in range(0, len(self.window), _ENTRY)}
        return digest(message_id) in self._digests

    def may_be_older(self, message_id: str) -> bool:
        """Whether ``message_id`` (not in the window) could be a record older than the window (then look)."""
        stamp = id_timestamp(message_id)
        return self.evicted_other if stamp == NOT_UUID7 else stamp <= self.evicted_max

    def segment_index(self, seq: int) -> int:
        """The index in :attr:`segments` of the segment holding record ``seq``."""
        index = 0
        for n, segment in enumerate(self.segments):
            if segment.first_seq <= seq:
                index = n
        return index

    def is_full(self, segment: Segment) -> bool:
        return segment.cut or segment.blocks >= self.limit_blocks or segment.length >= self.limit_bytes

    def start_of(self, seq: int) -> int | None:
        """The byte offset where record ``seq`` starts in its segment, when the window or ``first`` tells."""
        if seq == self.first:
            return self.first_offset
        i = seq - (self.next - self.window_size)
        if i < 0 or seq >= self.next:
            return None
        if i == 0:
            return self.window_start
        if self.segment_index(seq - 1) != self.segment_index(seq):
            return 0
        return self.ends[i - 1]

    def known(self, number: int) -> tuple[int, int]:
        """The blocks and bytes of segment ``number`` as this metadata knows them (``(0, 0)``: not in it)."""
        for segment in self.segments:
            if segment.number == number:
                return segment.blocks, segment.length
        return 0, 0

    def cut_at(self, number: int) -> int | None:
        """Where segment ``number``'s live bytes end when a pop cut it (``None``: not cut, or not in it)."""
        for segment in self.segments:
            if segment.number == number:
                return segment.length if segment.cut else None
        return None

    def covers(self, number: int, end: int) -> bool:
        """Whether this metadata already includes the bytes up to ``end`` of segment ``number``.

        Of a cut segment, it includes what the pop had taken in (some of it popped since).
        """
        if not self.segments or number > self.segments[-1].number:
            return False
        for n, segment in enumerate(self.segments):
            if segment.number == number:
                if segment.seen is not None:
                    return end <= segment.seen
                return n < len(self.segments) - 1 or segment.length >= end
        return number < self.segments[0].number  # trimmed away since

    def lost(self, number: int, end: int) -> bool:
        """Whether a block ending at ``end`` of segment ``number`` landed past a pop's cut, unseen: it is dead."""
        for segment in self.segments:
            if segment.number == number:
                return segment.seen is not None and end > segment.seen
        return False

    # -- changing --------------------------------------------------------------------------------

    def add(self, number: int, blocks: int | None, block_start: int, records: list[tuple[str, int]]) -> None:
        """Take in one block at ``block_start`` of segment ``number``: its records as ``(message_id, end)``."""
        if not self.segments or self.segments[-1].number != number:
            self.segments.append(Segment(number, self.next))
        segment = self.segments[-1]
        if self.count == 0:
            self.first_offset = block_start
        for message_id, end in records:
            if self.window_size == 0:
                self.window_start = block_start
            entry = digest(message_id) + id_timestamp(message_id).to_bytes(6, "big")
            self.window += entry
            self.ends.append(end)
            if self._digests is not None:
                self._digests.add(entry[:10])
            self.next += 1
        segment.blocks = segment.blocks + 1 if blocks is None else blocks
        segment.length = max(segment.length, records[-1][1] if records else block_start + 18)

    def keep_window(self, size: int) -> None:
        """Drop the oldest window entries beyond ``size``, remembering what the dropped ids could be."""
        drop = self.window_size - size
        if drop <= 0:
            return
        oldest = self.next - self.window_size
        for n in range(drop):
            stamp = int.from_bytes(self.window[n * _ENTRY + 10 : (n + 1) * _ENTRY], "big")
            if stamp == NOT_UUID7:
                self.evicted_other = True
            else:
                self.evicted_max = max(self.evicted_max, stamp)
        new_oldest = oldest + drop
        same = self.segment_index(new_oldest - 1) == self.segment_index(new_oldest)
        self.window_start = self.ends[drop - 1] if same else 0
        del self.window[: drop * _ENTRY]
        del self.ends[:drop]
        self._digests = None

    def pop(self, start: int) -> None:
        """Forget the newest record, which starts at byte ``start`` of its segment: cut that segment there.

        The segments after it hold no record (a pop emptied them) and are cut empty; none is removed, so their
        numbers are never used again and no dead byte can come back as a new segment.
        """
        index = self.segment_index(self.next - 1)
        for n, segment in enumerate(self.segments[index:]):
            if segment.seen is None:
                segment.seen = segment.length
            segment.length = start if n == 0 else 0
        self.next -= 1
        if self.window_size:  # the newest record is the window's last entry
            del self.window[-_ENTRY:]
            self.ends.pop()
            self._digests = None

    def trim(self, keep_last: int, first_offset: int) -> list[Segment]:
        """Forget all but the newest ``keep_last`` records (``first_offset``: where the new first one starts).

        Returns the segments that hold no kept record any more (to delete, or to stop referring to).
        """
        new_first = max(self.first, self.next - keep_last)
        in_window = self.next - self.window_size
        if new_first > in_window:
            drop = new_first - in_window
            self.window_start = self.start_of(new_first) or 0
            del self.window[: drop * _ENTRY]
            del self.ends[:drop]
            self._digests = None
        self.first = new_first
        self.first_offset = first_offset
        keep_from = self.segment_index(new_first) if self.count else len(self.segments) - 1
        gone = self.segments[:keep_from]
        del self.segments[:keep_from]
        return gone


def _info_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The :class:`SessionMeta` fields of what :meth:`SessionMeta.info` wrote (absent: the defaults)."""
    fork = body.get("fork")
    return {
        "usage": SessionUsage.from_dict(body["usage"]) if body.get("usage") else SessionUsage(),
        "title": body.get("title"),
        "tags": list(body.get("tags") or ()),
        "metadata": dict(body.get("meta") or {}),
        "forked_from": None if fork is None else (str(fork[0]), str(fork[1])),
    }


def decode_info(listed: str | None) -> dict[str, Any] | None:
    """The info a listing's ``info`` field holds (``{}``: none), or ``None`` when it must be read from the blob."""
    if listed is None:
        return {}
    if listed == READ_META:
        return None
    body: dict[str, Any] = json.loads(base64.urlsafe_b64decode(listed).decode("utf-8", "surrogatepass"))
    return body


def session_info(
    tenant: str, session_id: str, count: int, created: int, updated: int, info: dict[str, Any]
) -> SessionInfo:
    """The :class:`SessionInfo` of a listed session, from its listing fields and its info."""
    fields = _info_fields(info)
    fork = fields["forked_from"]
    return SessionInfo(
        session_id,
        tenant,
        count,
        stamp_time(created),
        stamp_time(max(updated, created)),
        forked_from=None if fork is None else ForkInfo(*fork),
        usage=fields["usage"],
        title=fields["title"],
        tags=frozenset(fields["tags"]),
        metadata=fields["metadata"],
    )
