"""Moving conversations: ``export`` and ``import`` as JSON Lines, ``copy`` between two stores with verification.

The file format lives in :mod:`chatkeep.core.cli._jsonl`. Everything streams: sessions are listed a page at a
time and histories read with ``iter_messages``, so memory stays constant whatever the size of the store. A
damaged session stops ``export`` and ``copy`` with its name, or is named and skipped (``--skip-damaged``,
:mod:`chatkeep.core.cli._damaged`). Sessions ``EncryptedStore`` wrote move as they are stored (sealed): the
commands hold no keys, and need none to back them up or move them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, Any

from chatkeep.core._errors import (
    ChatkeepError,
    MessageFormatError,
    MessageTooLargeError,
    UnsupportedOperationError,
    redact_url,
)
from chatkeep.core._messages import Message, decode_records, encode_records, record_size
from chatkeep.core._session import AgentSession
from chatkeep.core.backend import HistoryStore, SessionInfo, SessionKey
from chatkeep.core.cli import _jsonl
from chatkeep.core.cli._app import store_url
from chatkeep.core.cli._damaged import DAMAGE, DamagedSessionError, DamagedSessions, list_page
from chatkeep.core.cli._inspect import open_existing_store, tenant_of
from chatkeep.core.cli._jsonl import NOTHING, ExportFormatError, Line, Tally, Trailer
from chatkeep.core.cli._lineage import carry_info, fork_in_target, parents_first
from chatkeep.core.cli._output import Progress, UsageError, emit_json, plural, printable, progress, say
from chatkeep.core.plugins import open_store

__all__ = ["ExportFormatError", "copy", "export", "import_", "session_checksum", "session_lines"]

#: Messages per append: big enough to amortize a round trip, small enough to keep memory flat.
APPEND_BATCH = 500
#: Sessions per list_sessions page while walking a tenant.
PAGE = 100
#: What copy says whenever it did not finish: the rerun is the way to finish it.
RESUME = "run the same copy again to finish it: it resumes where it stopped (what is copied is not copied again)"


# -- export --------------------------------------------------------------------------------------


async def _listed(store: HistoryStore, tenant: str, damage: DamagedSessions) -> AsyncIterator[SessionInfo]:
    """Every session of a tenant, a page at a time, newest first (damaged entries that name none go to ``damage``)."""
    cursor: str | None = None
    while True:
        page = await list_page(store, tenant, damage, limit=PAGE, cursor=cursor)
        for info in page.items:
            yield info
        cursor = page.next_cursor
        if cursor is None:
            return


async def _sessions_of(store: HistoryStore, tenant: str, damage: DamagedSessions) -> AsyncIterator[SessionKey]:
    async for info in _listed(store, tenant, damage):
        yield SessionKey(tenant, info.session_id)


async def _one(entry: SessionInfo | SessionKey) -> AsyncIterator[SessionInfo | SessionKey]:
    yield entry


async def session_lines(store: HistoryStore, key: SessionKey, info: str | None) -> AsyncIterator[tuple[str, str]]:
    """The export lines of one session, in the file's order, each with its kind: ``session``, ``info``, ``message``.

    ``info`` is the session's info line (:func:`~chatkeep.core.cli._jsonl.info_line`), or ``None``. The messages
    are read with ``iter_messages``, so memory stays flat whatever the history's length.

    Raises:
        SessionFormatError, MessageFormatError: the session is damaged (lines may have been yielded before).
    """
    stored = await store.load_session(key)
    if stored is not None:
        owner = json.dumps(stored.owner, ensure_ascii=False)
        document = json.dumps(stored.session.to_dict(), ensure_ascii=False, separators=(",", ":"))
        yield "session", f'{_jsonl.prefix("session", key)}"owner":{owner},"document":{document}}}\n'
    if info is not None:
        yield "info", info
    prefix = _jsonl.prefix("message", key)
    async for message in store.iter_messages(key, batch=1000):
        yield "message", f'{prefix}"record":{message.to_record()}}}\n'


def export(args: argparse.Namespace) -> int:
    """Write one session (``--session``) or every session of the tenant as JSON Lines, to ``--output`` or stdout.

    The last line is the trailer with the counts. A damaged session stops the export (no file is left), or with
    ``--skip-damaged`` is marked in the file and named on stderr, and the exit status is 3.
    """
    output: Path | None = args.output
    damage = DamagedSessions(args, "export", after="No output file was written")
    if output is None:
        damage.after = "What was written to stdout ends without the trailer, so import refuses it"
        summary = asyncio.run(_export(args, sys.stdout, damage))
    else:
        # The file is written beside its name and renamed when complete, so a failed export leaves no truncated file.
        partial = output.with_name(output.name + ".partial")
        try:
            with open(partial, "w", encoding="utf-8", newline="\n") as out:
                summary = asyncio.run(_export(args, out, damage))
            os.replace(partial, output)
        finally:
            partial.unlink(missing_ok=True)
    summary["output"] = str(output) if output else None
    summary["skipped"] = damage.skipped
    counted = f"{plural(summary['sessions'], 'session')} ({plural(summary['messages'], 'message')})"
    text = f"exported {counted} of tenant {summary['tenant']!r}"
    _summarize(args, summary, "\n".join(filter(None, [text, damage.summary()])), output)
    return damage.exit_status()


async def _export(args: argparse.Namespace, out: IO[str], damage: DamagedSessions) -> dict[str, Any]:
    url, tenant = store_url(args), tenant_of(args)
    sessions = messages = documents = 0
    runs = lines = 0  # what the trailer counts: sessions with lines in the file, message lines (damaged ones too)
    marked = 0  # damaged lines (an entry that names no session is named on stderr only: it has no line)
    async with open_existing_store(url) as store:
        store.sealed_passthrough = True  # encrypted sessions are exported sealed, as stored
        total = None
        one: SessionInfo | SessionKey | None = None
        if args.session:
            key = SessionKey(tenant, args.session)
            try:
                one = await store.session_info(key)  # read by key: its info line (title, tags, fork parent)
            except DAMAGE:
                one = key  # it exists: the export below meets the damage and reports it
            if one is None:
                raise UsageError(f"no session {args.session!r} in tenant {tenant!r} of {redact_url(url)}")
            total = one.message_count if isinstance(one, SessionInfo) else None
        with progress("export", total=total) as bar:
            keys = _listed(store, tenant, damage) if one is None else _one(one)
            async for listed in keys:
                key = listed if isinstance(listed, SessionKey) else SessionKey(tenant, listed.session_id)
                info = None if isinstance(listed, SessionKey) else _jsonl.info_line(key, listed)
                document_lines = info_lines = message_lines = 0
                try:
                    async for kind, line in session_lines(store, key, info):
                        out.write(line)
                        if kind == "message":
                            message_lines += 1
                            bar.advance()
                        elif kind == "session":
                            document_lines = 1
                        else:
                            info_lines = 1
                except DAMAGE as exc:
                    written = document_lines + info_lines + message_lines
                    damage.found(key, exc, note=f" ({written} of its lines written before)" if written else "")
                    out.write(_jsonl.damaged(key, exc))  # import leaves out the lines of this session
                    marked += 1
                else:
                    sessions += 1
                    messages += message_lines
                    documents += document_lines
                runs += 1 if document_lines + info_lines + message_lines else 0
                lines += message_lines
        out.write(_jsonl.trailer(runs, lines, marked))
        out.flush()
    return {"tenant": tenant, "sessions": sessions, "messages": messages, "session_documents": documents}


def _summarize(args: argparse.Namespace, summary: dict[str, Any], text: str, output: Path | None) -> None:
    """The closing report: on stdout, unless stdout carries the data (then stderr)."""
    err = output is None
    if args.json:
        print(json.dumps(summary, ensure_ascii=False), file=sys.stderr if err else sys.stdout, flush=True)
    else:
        say(text, err=err)


# -- import --------------------------------------------------------------------------------------


def _decode(batch: list[Line], name: str) -> list[Message]:
    """Decode a batch of message lines at once; name the first bad line when one fails."""
    records = [line.record or "" for line in batch]
    try:
        return decode_records(records)
    except MessageFormatError:
        for line in batch:
            try:
                decode_records([line.record or ""])
            except MessageFormatError as exc:
                raise ExportFormatError(f"line {line.number} of {name}: {exc}. {NOTHING}") from None
        raise


def _check_sizes(batch: list[Line], name: str, limit: int) -> None:
    """Refuse the batch when a record is over the target's ``max_message_bytes``, naming the first such line."""
    messages = _decode(batch, name)
    try:
        encode_records(messages, max_bytes=limit)  # the store's own size rule, as its append applies it
    except MessageTooLargeError:
        for line, message in zip(batch, messages, strict=True):
            size = record_size(message.to_record())
            if size > limit:
                raise MessageTooLargeError(
                    f"line {line.number} of {name}: the message record is {size:,} bytes, over the target store's "
                    f"max_message_bytes of {limit:,}. Nothing was imported: add max_message_bytes={size} (or more) "
                    "to the query of the --store URL to raise the limit, or leave that message out, and rerun "
                    "the import"
                ) from None
        raise


def _validate(
    stream: IO[bytes], name: str, tenant: str | None, spool: IO[bytes] | None, bar: Progress, limit: int
) -> Tally:
    """The first pass: every line parsed, every record decoded and sized against ``limit``, a batch at a time,
    and the lines counted against the trailers."""
    batch: list[Line] = []
    tally = Tally(name)
    read_any = False
    for number, raw in _jsonl.lines(stream, name):
        read_any = True
        if spool is not None:
            spool.write(raw if raw.endswith(b"\n") else raw + b"\n")
        line = _jsonl.parse(number, raw, name, tenant)
        tally.add(line)
        if isinstance(line, Line) and line.record is not None:
            batch.append(line)
            if len(batch) >= APPEND_BATCH:
                _check_sizes(batch, name, limit)
                batch.clear()
        bar.advance()
    _check_sizes(batch, name, limit)
    tally.finish(read_any)
    return tally


def _incomplete(name: str, problem: str) -> ExportFormatError:
    return ExportFormatError(
        f"{name} is not a complete export: {problem}. Nothing was imported. Export again, or, to import what the "
        "file holds anyway (an export from an earlier chatkeep, or the part of a cut file you want), rerun the "
        "import with --allow-partial"
    )


async def _import(
    url: str, source: IO[bytes], name: str, tenant: str | None, spool: IO[bytes] | None, allow_partial: bool
) -> tuple[dict[str, int], Tally]:
    """Validate ``source`` against the target store (spooling it when it cannot be read twice), then write it."""
    async with open_store(url) as store:
        with progress("validate") as bar:
            tally = _validate(source, name, tenant, spool, bar, store.max_message_bytes)
        if tally.problem is not None and not allow_partial:
            raise _incomplete(name, tally.problem)
        stream = source if spool is None else spool
        stream.seek(0)
        # The second pass, over lines already validated: appends in batches, one key at a time, in file order.
        with progress("import", total=tally.messages) as bar:
            return await _write_lines(store, stream, name, tenant, bar, set(tally.damaged)), tally


async def _write_lines(
    store: HistoryStore, stream: IO[bytes], name: str, tenant: str | None, bar: Progress, leave_out: set[SessionKey]
) -> dict[str, int]:
    counts = {"sessions": 0, "messages": 0, "new_messages": 0, "session_documents": 0, "info_not_kept": 0}
    batch: list[Line] = []
    current: SessionKey | None = None
    pending: list[Line] = []  # info lines, applied once their session's lines are written (it exists then)

    async def apply_info() -> None:
        for line in pending:
            assert line.info is not None
            try:
                await store.update_info(line.key, **line.info)
            except UnsupportedOperationError:
                counts["info_not_kept"] += 1  # the store keeps no titles or tags: the messages are imported
        pending.clear()

    async def flush() -> None:
        if batch:
            counts["new_messages"] += await store.append(batch[0].key, _decode(batch, name))
            counts["messages"] += len(batch)
            bar.advance(len(batch))
            batch.clear()

    for number, raw in _jsonl.lines(stream, name):
        line = _jsonl.parse(number, raw, name, tenant)
        if isinstance(line, Trailer) or line.key in leave_out:
            continue  # a damaged session's lines: only the part export read before it met the damage
        if line.key != current:
            await flush()
            await apply_info()
            current = line.key
            counts["sessions"] += 1
        if line.info is not None:
            pending.append(line)
        elif line.document is not None:
            await flush()
            session = AgentSession.from_dict(line.document, tenant=line.key.tenant)
            await store.save_session(line.key, session, owner=line.owner)
            counts["session_documents"] += 1
        else:
            batch.append(line)
            if len(batch) >= APPEND_BATCH:
                await flush()
    await flush()
    await apply_info()
    return counts


def import_(args: argparse.Namespace) -> int:
    """Read JSON Lines from ``--input`` or stdin: validate every line first, then write. Rerunning is safe.

    Nothing is written until the whole input has been validated (its shape, its records, each record's size
    against the target's ``max_message_bytes``, and its counts against the trailer), so a bad line or a file cut
    short leaves the store as it was; ``--allow-partial`` imports a file without a trailer (or whose counts do not
    match) anyway. Standard input cannot be read twice, so it is spooled to a temporary file during validation.
    """
    url = store_url(args)
    tenant: str | None = args.tenant  # None: each line's own tenant
    path: Path | None = args.input
    name = str(path) if path else "stdin"
    with contextlib.ExitStack() as files:
        if path is None:
            spool: IO[bytes] = files.enter_context(tempfile.TemporaryFile())
            counts, tally = asyncio.run(_import(url, sys.stdin.buffer, name, tenant, spool, args.allow_partial))
        else:
            source = files.enter_context(open(path, "rb"))
            counts, tally = asyncio.run(_import(url, source, name, tenant, None, args.allow_partial))
    text = (
        f"imported {plural(counts['messages'], 'message')} ({counts['new_messages']} new) in "
        f"{plural(counts['sessions'], 'session')} and {plural(counts['session_documents'], 'session document')} "
        f"from {name}"
    )
    left_out = [
        {"tenant": key.tenant, "session_id": key.session_id, "error": why} for key, why in tally.damaged.items()
    ]
    info_not_kept = counts.pop("info_not_kept")
    if info_not_kept:
        counts["info_not_kept"] = info_not_kept
        say(
            f"note: the titles, tags and metadata of {plural(info_not_kept, 'session')} were not imported: the store "
            "does not keep them",
            err=True,
        )
    if args.json:
        emit_json({**counts, "complete": tally.problem is None, "damaged_in_export": left_out})
        return 0
    say(text)
    if tally.problem is not None:
        say(
            f"chatkeep: --allow-partial: {name} is not a complete export ({tally.problem}); the store may hold "
            "more than this file brought",
            err=True,
        )
    for skipped in left_out:
        say(
            f"chatkeep: left out session {printable(repr(skipped['session_id']))} of tenant "
            f"{printable(repr(skipped['tenant']))}: the export found it damaged ({skipped['error']})",
            err=True,
        )
    return 0


# -- copy ----------------------------------------------------------------------------------------


async def session_checksum(store: HistoryStore, key: SessionKey) -> tuple[int, str]:
    """A session's message count and the sha256 of its records in order (each followed by a newline)."""
    digest, count = hashlib.sha256(), 0
    async for message in store.iter_messages(key, batch=1000):
        digest.update(message.to_record().encode("utf-8", "surrogatepass") + b"\n")
        count += 1
    return count, digest.hexdigest()


async def _append_copied(target: HistoryStore, key: SessionKey, batch: list[Message], bar: Progress) -> int:
    """Append one batch to the target (idempotent by message_id: a rerun skips what is there); returns how many new."""
    try:
        new = await target.append(key, batch)
    except MessageTooLargeError:
        limit = target.max_message_bytes
        for message in batch:
            size = record_size(message.to_record())
            if size > limit:
                raise MessageTooLargeError(
                    f"copy stopped at session {printable(key.tenant)}/{printable(key.session_id)}: "
                    f"message {message.message_id} is {size:,} bytes as stored, over the target's "
                    f"max_message_bytes of {limit:,}. The sessions before it are copied (this one in part). Add "
                    f"max_message_bytes={size} (or more) to the query of the --to URL and run the same copy "
                    "again: it resumes where it stopped"
                ) from None
        raise
    bar.advance(len(batch))
    return new


async def _copy_session(
    source: HistoryStore, target: HistoryStore, info: SessionInfo, bar: Progress, *, as_fork: bool = True
) -> dict[str, Any]:
    key = SessionKey(info.tenant, info.session_id)
    forked = as_fork and await fork_in_target(target, key, info)
    stored = await source.load_session(key)
    if stored is not None:
        await target.save_session(key, stored.session, owner=stored.owner)
    digest, count, new = hashlib.sha256(), 0, 0
    batch: list[Message] = []
    async for message in source.iter_messages(key, batch=1000):
        digest.update(message.to_record().encode("utf-8", "surrogatepass") + b"\n")
        count += 1
        batch.append(message)
        if len(batch) >= APPEND_BATCH:
            new += await _append_copied(target, key, batch, bar)
            batch = []
    if batch:
        new += await _append_copied(target, key, batch, bar)
    target_count, target_digest = await session_checksum(target, key)
    if forked and (target_count, target_digest) != (count, digest.hexdigest()):
        # The fork no longer is its parent's prefix plus its own messages (trimmed, or the parent changed): copy
        # it as an equal copy instead.
        await target.delete(key)
        return await _copy_session(source, target, info, bar, as_fork=False)
    note = await carry_info(target, key, info)
    return {
        "tenant": key.tenant,
        "session_id": key.session_id,
        "messages": count,
        "new_messages": new,
        "sha256": digest.hexdigest(),
        "target_messages": target_count,
        "target_sha256": target_digest,
        "verified": target_count == count and target_digest == digest.hexdigest(),
        "forked_from": info.forked_from.session_id if forked and info.forked_from else None,
        "note": note,
    }


async def copy(args: argparse.Namespace) -> int:
    """Copy every session of the given tenants from one store to another, then verify each by count and sha256.

    Tenants are named (``--tenant``, repeatable), or ``--all-tenants`` takes what the source's ``list_tenants``
    names when the copy starts (a tenant created later is copied by the next run). An
    interrupted copy is resumed by running it again: appends are idempotent by message id, and every way the
    copy can stop says so. A message over the target's ``max_message_bytes`` stops the copy there (a size check
    up front would read the whole source twice); the error says how to raise the limit, and the rerun resumes.
    A damaged source session stops the copy (the sessions before it are copied), or with ``--skip-damaged`` is
    named and left out, and the exit status is 3.
    """
    if args.source == args.target:
        raise UsageError("--from and --to name the same store; copy needs two different stores")
    if not args.all_tenants and not args.tenants:
        raise UsageError("say which tenants to copy: --tenant TENANT (repeat for several), or --all-tenants")
    if args.all_tenants:
        args = await _with_every_tenant(args)
    shown_from, shown_to = redact_url(args.source), redact_url(args.target)
    report: dict[str, Any] = {"from": shown_from, "to": shown_to, "tenants": list(args.tenants)}
    sessions = messages = new = 0
    mismatches: list[dict[str, Any]] = []
    damage = DamagedSessions(
        args, "copy", after="The sessions before it are copied and verified, and a rerun resumes where it stopped"
    )
    notes: set[str] = set()

    async def copy_one(info: SessionInfo) -> None:
        nonlocal sessions, messages, new
        try:
            result = await _copy_session(source, target, info, bar)
        except DAMAGE as exc:
            # Only the source's records are decoded as damaged (the target's are written by us).
            part = " (the target may hold the part read before it)" * isinstance(exc, MessageFormatError)
            damage.found(SessionKey(info.tenant, info.session_id), exc, note=part)
            return
        sessions += 1
        messages += result["messages"]
        new += result["new_messages"]
        if not result["verified"]:
            mismatches.append(result)
        if result["note"]:
            notes.add(result["note"])

    try:
        async with open_existing_store(args.source) as source, open_store(args.target) as target:
            source.sealed_passthrough = target.sealed_passthrough = True  # encrypted sessions move sealed, as stored
            with progress("copy") as bar:
                for tenant in args.tenants:
                    forks: list[SessionInfo] = []  # copied after the rest, parents first, so that they stay forks
                    async for listed in _listed(source, tenant, damage):
                        if listed.forked_from is None:
                            await copy_one(listed)
                        else:
                            forks.append(listed)
                    for fork in parents_first(forks):
                        await copy_one(fork)
    except (ChatkeepError, OSError, KeyboardInterrupt, asyncio.CancelledError) as exc:
        if not isinstance(exc, DamagedSessionError) and "run the same copy again" not in str(exc):
            say(f"chatkeep: copy stopped after {plural(sessions, 'session')}; {RESUME}", err=True)
        raise
    report.update(sessions=sessions, messages=messages, new_messages=new, mismatches=mismatches)
    report["skipped"] = damage.skipped
    report["ok"] = not mismatches and not damage.skipped
    report["notes"] = sorted(notes)
    if args.json:
        emit_json(report)
    else:
        tenants = _tenants_copied(args)
        say(f"copied {plural(sessions, 'session')} ({plural(messages, 'message')}, {new} new) of {tenants}")
        say(f"  from {shown_from}")
        say(f"  to   {shown_to}")
        for bad in mismatches:
            say(
                f"MISMATCH {printable(bad['tenant'])}/{printable(bad['session_id'])}: "
                f"source {bad['messages']} messages sha256 {bad['sha256'][:12]}, "
                f"target {bad['target_messages']} messages sha256 {bad['target_sha256'][:12]}"
            )
        if mismatches:
            say("the target holds other messages for these sessions; delete them there and copy again")
        elif damage.skipped:
            say(f"verified the sessions copied; {damage.summary()}")
        else:
            say("verified: every session has the same message count and sha256 in both stores")
        for note in sorted(notes):
            say(f"note: {note}", err=True)
    return damage.exit_status(0 if not mismatches else 1)


async def _with_every_tenant(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` naming every tenant of the ``--from`` store as ``--tenant`` would (``--all-tenants``)."""
    if args.tenants:
        raise UsageError("give --tenant or --all-tenants, not both")
    async with open_existing_store(args.source) as source:
        tenants = await source.list_tenants()
    return argparse.Namespace(**{**vars(args), "tenants": tenants})


def _tenants_copied(args: argparse.Namespace) -> str:
    """What the copy covered, for its report: ``tenant 'a', 'b'`` or ``every tenant (2: 'a', 'b')``."""
    named = ", ".join(repr(t) for t in args.tenants)
    return f"every tenant ({len(args.tenants)}: {named})" if args.all_tenants else f"tenant {named}"
