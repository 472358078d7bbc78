"""The message-id index of one session: a hash table in a file, so an append checks an id with a read or two.

The file holds a 16-byte header, ``next_seq`` (the sequence number after the last record it covers) and
``used`` (an upper bound of the occupied slots), then a power-of-two number of 24-byte slots, probed linearly:
a 16-byte BLAKE2b digest of a message id and its record's sequence number plus one (0: an empty slot). An
entry is live while its record is stored (``first_seq <= seq < next_seq``); trimmed records leave dead entries,
and a popped record a tombstone (a seq no record reaches), which growing the table drops. The header is
written before the slots it announces, so a writer that dies midway leaves a header that disagrees with the
session's metadata, and the next writer rebuilds the index.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable, Sequence

from chatkeep_jsonfiles._files import read_at, replace_file, write_at

__all__ = ["IdIndex", "digest"]

_HEADER = struct.Struct("<QQ")
_SLOT = struct.Struct("<16sQ")
_MIN_SLOTS = 64
_TOMBSTONE = 2**63  # the seq of a popped record's entry: never below next_seq, so never live


def digest(message_id: str) -> bytes:
    """The fixed-width key of a message id (128 bits: two ids collide about as often as two random UUIDs)."""
    return hashlib.blake2b(message_id.encode(), digest_size=16).digest()


class IdIndex:
    """One session's index file, open for the writer that holds the session's exclusive lock."""

    def __init__(self, path: str, *, fsync: bool) -> None:
        self.path, self.fsync = path, fsync
        self._open()

    def _open(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR)
        self.slots = (os.fstat(self.fd).st_size - _HEADER.size) // _SLOT.size
        self.next_seq, self.used = _HEADER.unpack(read_at(self.fd, _HEADER.size, 0))

    @classmethod
    def open(
        cls, path: str, next_seq: int, stored: Callable[[], Sequence[tuple[bytes, int]]], *, fsync: bool
    ) -> IdIndex:
        """The index at ``path``, rebuilt from ``stored()`` (each stored record's key and seq) when it is stale.

        It is stale when it is missing, or when it covers other records than the metadata's ``next_seq`` says.
        """
        if os.path.exists(path):
            index = cls(path, fsync=fsync)
            if index.next_seq == next_seq:
                return index
            index.close()
        _write(path, stored(), next_seq, room=0, fsync=fsync)
        return cls(path, fsync=fsync)

    def seq(self, key: bytes) -> int | None:
        """The sequence number last recorded for ``key`` (live or dead), or ``None``."""
        return self._find(key)[1]

    def add(self, keys: Sequence[bytes], first_seq: int) -> None:
        """Record ``keys`` (none of them live) as the records ``next_seq``, ``next_seq + 1``... of the session."""
        if (self.used + len(keys)) * 2 > self.slots:  # grow at half full, so probes stay short
            table = read_at(self.fd, self.slots * _SLOT.size, _HEADER.size)
            live = [
                (key, seq - 1) for key, seq in _SLOT.iter_unpack(table) if seq and first_seq <= seq - 1 < self.next_seq
            ]
            _write(self.path, live, self.next_seq, room=len(keys), fsync=self.fsync)
            self.close()
            self._open()
        start = self.next_seq
        # Each key counts as a new slot (a dead key's slot is reused): an upper bound is enough to know when to grow.
        self.next_seq, self.used = start + len(keys), self.used + len(keys)
        write_at(self.fd, _HEADER.pack(self.next_seq, self.used), 0)
        if self.fsync:
            os.fsync(self.fd)  # the header reaches the disk before any slot it announces
        for n, key in enumerate(keys):
            write_at(self.fd, _SLOT.pack(key, start + n + 1), _offset(self._find(key)[0]))
        if self.fsync:
            os.fsync(self.fd)

    def remove_newest(self, key: bytes) -> None:
        """Forget ``key``, the id of the newest record (``next_seq - 1``), which a pop removes."""
        slot, seq = self._find(key)
        if seq != self.next_seq - 1:
            raise OSError("the id index disagrees with the records: it was changed outside chatkeep")
        self.next_seq -= 1
        write_at(self.fd, _HEADER.pack(self.next_seq, self.used), 0)
        if self.fsync:
            os.fsync(self.fd)  # the header first: dying before the slot leaves a stale index, which is rebuilt
        write_at(self.fd, _SLOT.pack(key, _TOMBSTONE + 1), _offset(slot))
        if self.fsync:
            os.fsync(self.fd)

    def _find(self, key: bytes) -> tuple[int, int | None]:
        """The slot holding ``key`` and its seq, or the empty slot where it would go and ``None``."""
        slot = _home(key, self.slots)
        while True:
            stored, seq = _SLOT.unpack(read_at(self.fd, _SLOT.size, _offset(slot)))
            if not seq or stored == key:
                return slot, seq - 1 if seq else None
            slot = (slot + 1) % self.slots

    def close(self) -> None:
        """Close the file."""
        os.close(self.fd)

    def __enter__(self) -> IdIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write(path: str, entries: Sequence[tuple[bytes, int]], next_seq: int, *, room: int, fsync: bool) -> None:
    """Write a new index of ``entries`` (key, seq) with room for ``room`` more, a quarter full at most."""
    slots = _MIN_SLOTS
    while slots < 4 * (len(entries) + room):
        slots *= 2
    table = bytearray(_HEADER.size + slots * _SLOT.size)
    _HEADER.pack_into(table, 0, next_seq, len(entries))
    for key, seq in entries:
        slot = _home(key, slots)
        while _SLOT.unpack_from(table, _offset(slot))[1]:
            slot = (slot + 1) % slots
        _SLOT.pack_into(table, _offset(slot), key, seq + 1)
    replace_file(path, bytes(table), fsync=fsync)


def _home(key: bytes, slots: int) -> int:
    return int.from_bytes(key[:8], "little") % slots


def _offset(slot: int) -> int:
    return _HEADER.size + slot * _SLOT.size
