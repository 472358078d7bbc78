"""A session's metadata blob: what it holds, and how an append, a trim, a pop or a tail read changes it.

The metadata is the session's index and its commit point. Segments hold the records; the metadata says
which generation and segments are live, the sequence numbers (``count = next - first``), and a window over
the newest records: each one's id fingerprint, UUIDv7 timestamp and end offset. The window makes
``load(last=k)`` one ranged read of exactly those bytes and lets an append check its ids without reading
the history. Ids that left the window are summarised by the newest UUIDv7 timestamp among them (and whether
any was not a UUIDv7), so an append whose ids cannot be among them (every fresh message) needs no history.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field, replace
from typing import Any

from chatkeep.blob._layout import NOT_UUID7, digest, encode_id, id_timestamp

__all__ = ["FORMAT", "Segment", "SessionMeta"]

FORMAT = 1
_ENTRY = 16  # 10-byte digest + 6-byte timestamp


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

    @property
    def cut(self) -> bool:
        return self.seen is not None

    def fields(self) -> list[int]:
        """The segment as the metadata's JSON holds it (``seen`` only once it is cut)."""
        head = [self.number, self.first_seq, self.blocks, self.length]
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
        )

    def listing(self) -> dict[str, str]:
        """Blob metadata for ``list_sessions`` and ``prune``, which read it from one listing of the folder."""
        return {
            "sid": encode_id(self.session_id),
            "count": str(self.count),
            "created": str(self.created),
            "updated": str(self.updated),
        }

    def copy(self) -> SessionMeta:
        return replace(
            self,
            segments=[replace(s) for s in self.segments],
            window=bytearray(self.window),
            ends=list(self.ends),
            _digests=None,
        )

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

    def trim(self, keep_last: int, first_offset: int) -> list[int]:
        """Forget all but the newest ``keep_last`` records (``first_offset``: where the new first one starts).

        Returns the numbers of the segments that hold no kept record any more (to delete).
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
        gone = [s.number for s in self.segments[:keep_from]]
        del self.segments[:keep_from]
        return gone
