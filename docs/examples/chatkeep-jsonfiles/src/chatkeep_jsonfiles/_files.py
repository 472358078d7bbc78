"""File primitives: the per-session lock, whole-or-nothing file writes, and reading whole lines from either end.

Every function here blocks; the store runs them in a worker thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

__all__ = ["fsync_folder", "last_lines", "lines_after", "locked", "read_at", "replace_file", "write_at"]

CHUNK = 64 * 1024  # bytes per read while looking for line ends


@contextlib.contextmanager
def locked(path: str, *, exclusive: bool) -> Iterator[bool]:
    """Hold the lock file at ``path``, shared or exclusive; yields ``False`` when a reader finds none (no session).

    A writer creates the lock file, and its folder, when missing. A session's deleter removes the lock file
    while holding it, so whoever gets the lock of a removed file next tries again with the current one.
    """
    while True:
        try:
            fd = os.open(path, (os.O_RDWR | os.O_CREAT) if exclusive else os.O_RDONLY, 0o644)
        except FileNotFoundError:
            if not exclusive:
                yield False
                return
            os.makedirs(os.path.dirname(path), exist_ok=True)  # a new tenant, or one deleted meanwhile
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                current = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                yield True
                return
        finally:
            os.close(fd)  # closing the file releases the lock


def read_at(fd: int, size: int, offset: int) -> bytes:
    """Exactly ``size`` bytes at ``offset``; a file shorter than its metadata says is an error, not an empty read."""
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise OSError(f"{size - len(data)} bytes are missing at offset {offset}: the file was cut outside chatkeep")
    return data


def write_at(fd: int, data: bytes, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (continuing after a short write; a full disk raises)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def replace_file(path: str, data: bytes, *, fsync: bool) -> None:
    """Give ``path`` the content ``data`` whole or not at all: a temporary file renamed over it.

    Only the holder of the session's exclusive lock writes a session's files, so one temporary name is enough.
    """
    temporary = path + ".tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_at(fd, data, 0)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    if fsync:
        fsync_folder(os.path.dirname(path))  # the rename itself reaches the disk


def fsync_folder(path: str) -> None:
    """Flush a folder's entries (new, renamed or removed files) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lines_after(fd: int, start: int, end: int, limit: int | None) -> tuple[list[bytes], int]:
    """Up to ``limit`` whole lines (all for ``None``) from byte ``start`` to ``end``, and the offset after them."""
    if limit is None:
        return read_at(fd, end - start, start).split(b"\n")[:-1], end
    lines: list[bytes] = []
    pending, position = b"", start
    while len(lines) < limit and position < end:
        chunk = read_at(fd, min(CHUNK, end - position), position)
        position += len(chunk)
        *whole, pending = (pending + chunk).split(b"\n")
        lines += whole
    del lines[limit:]
    return lines, start + sum(len(line) + 1 for line in lines)


# --8<-- [start:last_lines]
def last_lines(fd: int, end: int, count: int) -> list[bytes]:
    """The last ``count`` (1 or more) whole lines before byte ``end``, reading backwards from ``end`` in chunks."""
    chunks: list[bytes] = []
    newlines, position = 0, end
    # ``end`` follows a newline, so ``count`` lines are whole once ``count + 1`` newlines are seen (or the file starts).
    while position > 0 and newlines <= count:
        size = min(CHUNK, position)
        position -= size
        chunks.append(read_at(fd, size, position))
        newlines += chunks[-1].count(b"\n")
    return b"".join(reversed(chunks)).split(b"\n")[-count - 1 : -1]


# --8<-- [end:last_lines]
