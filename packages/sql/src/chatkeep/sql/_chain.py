"""Forks on SQL: a session's history as a chain of session rows, each holding the messages of one stretch.

A fork's row refers to its source's row (``base_ref``) and a cut (``base_cut``): its history is its source's
messages below the cut, then its own rows (all numbered from the cut on). A row others refer to (``forks`` > 0)
never loses a message: a pop or a trim of its session first moves the session onto a new row on top of it
(:func:`move`), and deleting it only hides it (:func:`drop`) until no row refers to it. ``first_seq`` is the
first sequence number a session shows (a trim of a fork raises it). Reading a fork walks its chain, newest
stretch first for ``load(last=k)``, so it reads only the rows it returns. On PostgreSQL the walk and the read
are one statement (:func:`read_window`, :func:`read_page`); elsewhere a statement walks the chain and one reads each
stretch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from chatkeep.sql._sql import CHAIN_END, Statements
from chatkeep.sql._transport import Connection

__all__ = [
    "HIDDEN_TENANT",
    "Segment",
    "after",
    "boundary",
    "chain",
    "drop",
    "find",
    "held",
    "move",
    "newest",
    "page",
    "read_all",
    "read_last",
    "read_page",
    "read_range",
    "read_window",
    "usages_through",
]

#: The tenant hash of a hidden row: the messages of a deleted or moved session that a fork still refers to.
HIDDEN_TENANT = bytes(32)

#: (row id, first sequence number, end sequence number): one stretch of a history, held by one row.
Segment = tuple[int, int, int]


def _hidden_key(ref: int) -> bytes:
    return hashlib.sha256(b"chatkeep hidden row " + str(ref).encode()).digest()


async def chain(
    conn: Connection, sql: Statements, *, key: bytes | None = None, ref: int | None = None
) -> list[Segment]:
    """The stretches of the history of the session ``key`` names (or of the row ``ref``), newest first."""
    if key is not None:
        rows = await conn.fetch(sql.chain_by_key, (key,))
    else:
        rows = await conn.fetch(sql.chain_by_id, (ref,))
    if not rows:
        return []
    first, end, found = int(rows[0][3]), CHAIN_END, []
    for row_id, base_ref, base_cut, _ in rows:
        low = max(first, 0 if base_ref is None else int(base_cut))
        if end > low:
            found.append((int(row_id), low, end))
        if base_ref is None:
            break
        end = min(end, int(base_cut))
    return found


async def read_window(conn: Connection, sql: Statements, key: bytes, last: int | None) -> list[str]:
    """The records of the history of the session ``key`` names (all, or the ``last`` newest), oldest first."""
    if sql.chain_all:  # PostgreSQL: one statement, one snapshot
        if last is None:
            return [row[0] for row in await conn.fetch(sql.chain_all, (key,))]
        return [row[0] for row in reversed(await conn.fetch(sql.chain_last, (key, last, last)))]
    segments = await chain(conn, sql, key=key)
    if last is None:
        return await read_all(conn, sql, segments)
    return await read_last(conn, sql, segments, last)


async def read_page(conn: Connection, sql: Statements, key: bytes, after_seq: int, batch: int) -> list[tuple[int, str]]:
    """Up to ``batch`` (sequence number, record) of the history of the session ``key`` names after ``after_seq``."""
    if sql.chain_page:  # PostgreSQL: one statement, one snapshot
        return [(int(seq), record) for seq, record in await conn.fetch(sql.chain_page, (key, after_seq, batch, batch))]
    return await page(conn, sql, await chain(conn, sql, key=key), after_seq, batch)


async def read_range(conn: Connection, sql: Statements, key: bytes, before: int, last: int | None) -> list[str]:
    """The records at positions ``before - last`` to ``before`` (clamped to the count) of the session ``key`` names.

    A session that is not a fork: its row's count and end (one indexed row), then one statement with an offset from
    the nearer end of its messages, bounded by that end so that an append landing meanwhile shifts nothing: it reads
    the range's rows, and the server steps over at most half the history (in seq order, on the primary key). A
    fork: each stretch of its chain is counted (index only), then only the stretches the range overlaps are read.
    """
    found = await conn.fetch(sql.range_head, (key,))
    if not found:
        return []
    ref, base_ref, count, next_seq = found[0]
    if base_ref is not None:
        return await _range_of_chain(conn, sql, await chain(conn, sql, key=key), before, last)
    stop = min(before, int(count))
    start = 0 if last is None else max(0, stop - last)
    if stop <= start:
        return []
    if start <= int(count) - stop:
        return [row[0] for row in await conn.fetch(sql.range_oldest, (ref, stop - start, start))]
    rows = await conn.fetch(sql.range_newest, (ref, next_seq, stop - start, int(count) - stop))
    return [row[0] for row in reversed(rows)]


async def _range_of_chain(
    conn: Connection, sql: Statements, segments: Sequence[Segment], before: int, last: int | None
) -> list[str]:
    """``read_range`` of a fork: the stretches' sizes, then the range's records from the stretches it overlaps."""
    stretches = list(reversed(segments))  # oldest first
    sizes = [int((await conn.fetch(sql.seg_count, segment))[0][0]) for segment in stretches]
    stop = min(before, sum(sizes))
    start = 0 if last is None else max(0, stop - last)
    records: list[str] = []
    position = 0
    for segment, size in zip(stretches, sizes, strict=True):
        low, high = max(start, position), min(stop, position + size)
        if high > low:
            records += [row[0] for row in await conn.fetch(sql.seg_range, (*segment, high - low, low - position))]
        position += size
    return records


async def read_all(conn: Connection, sql: Statements, segments: Sequence[Segment]) -> list[str]:
    """Every record of the history, oldest first."""
    records: list[str] = []
    for segment in reversed(segments):
        records += [row[0] for row in await conn.fetch(sql.seg_load, segment)]
    return records


async def read_last(conn: Connection, sql: Statements, segments: Sequence[Segment], last: int) -> list[str]:
    """The ``last`` newest records, oldest first, reading only those."""
    records: list[str] = []
    for segment in segments:
        wanted = last - len(records)
        if wanted <= 0:
            break
        records += [row[0] for row in await conn.fetch(sql.seg_last, (*segment, wanted))]
    return records[::-1]


async def page(
    conn: Connection, sql: Statements, segments: Sequence[Segment], after_seq: int, batch: int
) -> list[tuple[int, str]]:
    """Up to ``batch`` (sequence number, record) after ``after_seq``, oldest first."""
    rows: list[tuple[int, str]] = []
    for ref, low, end in reversed(segments):
        if end <= after_seq + 1 or len(rows) >= batch:
            continue
        found = await conn.fetch(sql.seg_page, (ref, max(low, after_seq + 1), end, batch - len(rows)))
        rows += [(int(seq), record) for seq, record in found]
    return rows


async def newest(conn: Connection, sql: Statements, segments: Sequence[Segment]) -> tuple[int, int, str, Any] | None:
    """The newest message: (row id, sequence number, record, its usage), or ``None`` without messages."""
    for segment in segments:
        found = await conn.fetch(sql.seg_newest, segment)
        if found:
            seq, record, used = found[0]
            return segment[0], int(seq), record, used
    return None


async def find(conn: Connection, sql: Statements, segments: Sequence[Segment], message: bytes) -> int | None:
    """The sequence number of the message whose id hashes to ``message``, or ``None``."""
    for segment in segments:
        found = await conn.fetch(sql.seg_find, (*segment, message))
        if found:
            return int(found[0][0])
    return None


async def held(conn: Connection, sql: Statements, segments: Sequence[Segment], hashes: Sequence[bytes]) -> set[bytes]:
    """Those of ``hashes`` the history holds."""
    found: set[bytes] = set()
    for segment in segments:
        rows = await conn.fetch(sql.seg_hashes(len(hashes)), (*segment, *hashes))
        found.update(bytes(row[0]) for row in rows)
    return found


async def after(conn: Connection, sql: Statements, segments: Sequence[Segment], cut: int) -> tuple[int, list[Any]]:
    """How many messages are numbered from ``cut`` on, and their stored usages (no record is read)."""
    count, usages = 0, []
    for ref, low, end in segments:
        if end <= cut:
            break
        stretch = (ref, max(low, cut), end)
        count += int((await conn.fetch(sql.seg_count, stretch))[0][0])
        usages += [row[0] for row in await conn.fetch(sql.seg_usages, stretch)]
    return count, usages


async def boundary(conn: Connection, sql: Statements, segments: Sequence[Segment], keep_last: int) -> int | None:
    """The sequence number of the newest message a trim to ``keep_last`` removes (``None``: it removes none)."""
    skipped = 0
    for segment in segments:
        found = await conn.fetch(sql.seg_offset, (*segment, keep_last - skipped))
        if found:
            return int(found[0][0])
        skipped += int((await conn.fetch(sql.seg_count, segment))[0][0])
    return None


async def usages_through(conn: Connection, sql: Statements, segments: Sequence[Segment], last: int) -> list[Any]:
    """The stored usages of the messages numbered up to ``last``."""
    usages = []
    for ref, low, end in segments:
        if low <= last:
            usages += [row[0] for row in await conn.fetch(sql.seg_usages, (ref, low, min(end, last + 1)))]
    return usages


async def move(conn: Connection, sql: Statements, ref: int, key: bytes, tenant: bytes) -> int:
    """Inside a transaction holding row ``ref``'s lock: move its session onto a new row on top of it; the new id.

    ``ref`` keeps its messages, hidden (forks refer to them); the session, its document (and its versions),
    usage, info and tag rows go to the new row, whose history continues ``ref``'s from its next number on.
    """
    await conn.execute(sql.hide, (_hidden_key(ref), HIDDEN_TENANT, ref))
    await conn.execute(sql.move_insert, (key, tenant, ref))
    moved = int((await conn.fetch(sql.row_by_key, (key,)))[0][0])
    await conn.execute(sql.add_forks, (1, ref))
    await conn.execute(sql.retag_move, (moved, ref))
    return moved


async def drop(conn: Connection, sql: Statements, ref: int) -> bool:
    """Inside a transaction: delete the session of row ``ref`` (locking it); ``False`` if the row is gone.

    A row forks refer to is hidden instead (its messages stay theirs); a deleted row's base that is hidden and
    no longer referred to goes too, and so on down the chain.
    """
    found = await conn.fetch(sql.base_state, (ref,))
    if not found:
        return False
    base_ref, forks, _ = found[0]
    if forks > 0:
        await conn.execute(sql.hide, (_hidden_key(ref), HIDDEN_TENANT, ref))
        await conn.execute(sql.untag, (ref,))
        return True
    await conn.execute(sql.delete_row, (ref,))
    while base_ref is not None:
        await conn.execute(sql.add_forks, (-1, base_ref))
        found = await conn.fetch(sql.base_state, (base_ref,))
        if not found:
            break
        next_base, left, tenant = found[0]
        if left > 0 or bytes(tenant) != HIDDEN_TENANT:
            break
        await conn.execute(sql.delete_row, (base_ref,))
        base_ref = next_base
    return True
