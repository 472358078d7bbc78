"""Moving conversations: ``export`` and ``import`` as JSON Lines, ``copy`` between two stores with verification.

The JSON Lines format (one JSON object per line, UTF-8, documented in docs/cli.md)::

    {"type":"session","tenant":T,"session_id":S,"owner":O,"document":{...AgentSession.to_dict()...}}
    {"type":"message","tenant":T,"session_id":S,"record":{"v":1,...the message's stored record...}}

A session's document line (when it has one) comes before its message lines, and its messages follow in the
store's order. Everything streams: sessions are listed a page at a time and histories read with
``iter_messages``, so memory stays constant whatever the size of the store. Sessions ``EncryptedStore`` wrote move
as they are stored (sealed): the commands hold no keys, and need none to back them up or move them.
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
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from chatkeep.core._errors import ChatkeepError, MessageFormatError, MessageTooLargeError, redact_url
from chatkeep.core._messages import Message, decode_records, encode_records, record_size
from chatkeep.core._session import AgentSession
from chatkeep.core.backend import HistoryStore, SessionKey
from chatkeep.core.cli._app import store_url
from chatkeep.core.cli._inspect import open_existing_store, tenant_of
from chatkeep.core.cli._output import Progress, UsageError, emit_json, plural, printable, progress, say
from chatkeep.core.plugins import open_store

__all__ = ["ExportFormatError", "copy", "export", "import_", "session_checksum"]

#: The longest line import accepts: a message record is at most a store's max_message_bytes (4 MB by default).
MAX_LINE_BYTES = 64 * 1024 * 1024
#: Messages per append: big enough to amortize a round trip, small enough to keep memory flat.
APPEND_BATCH = 500
#: Sessions per list_sessions page while walking a tenant.
PAGE = 100


_NOTHING = "Nothing was imported: fix the line (or export again) and rerun the import"


class ExportFormatError(ChatkeepError, ValueError):
    """A line of a JSON Lines file is not a chatkeep export line; nothing from that file was imported."""


# -- export --------------------------------------------------------------------------------------


async def _sessions_of(store: HistoryStore, tenant: str) -> AsyncIterator[SessionKey]:
    """Every session of a tenant, a page at a time, newest first."""
    cursor: str | None = None
    while True:
        page = await store.list_sessions(tenant, limit=PAGE, cursor=cursor)
        for info in page.items:
            yield SessionKey(tenant, info.session_id)
        cursor = page.next_cursor
        if cursor is None:
            return


def _prefix(kind: str, key: SessionKey) -> str:
    tenant, session = json.dumps(key.tenant, ensure_ascii=False), json.dumps(key.session_id, ensure_ascii=False)
    return f'{{"type":"{kind}","tenant":{tenant},"session_id":{session},'


async def _one(key: SessionKey) -> AsyncIterator[SessionKey]:
    yield key


def export(args: argparse.Namespace) -> int:
    """Write one session (``--session``) or every session of the tenant as JSON Lines, to ``--output`` or stdout."""
    output: Path | None = args.output
    if output is None:
        summary = asyncio.run(_export(args, sys.stdout))
    else:
        # The file is written beside its name and renamed when complete, so a failed export leaves no truncated file.
        partial = output.with_name(output.name + ".partial")
        try:
            with open(partial, "w", encoding="utf-8", newline="\n") as out:
                summary = asyncio.run(_export(args, out))
            os.replace(partial, output)
        finally:
            partial.unlink(missing_ok=True)
    summary["output"] = str(output) if output else None
    counted = f"{plural(summary['sessions'], 'session')} ({plural(summary['messages'], 'message')})"
    text = f"exported {counted} of tenant {summary['tenant']!r}"
    _summarize(args, summary, text, output)
    return 0


async def _export(args: argparse.Namespace, out: IO[str]) -> dict[str, Any]:
    url, tenant = store_url(args), tenant_of(args)
    sessions = messages = documents = 0
    async with open_existing_store(url) as store:
        store.sealed_passthrough = True  # encrypted sessions are exported sealed, as stored
        total = None
        if args.session:
            key = SessionKey(tenant, args.session)
            total = await store.count(key)
            if total == 0 and await store.load_session(key) is None:
                raise UsageError(f"no session {args.session!r} in tenant {tenant!r} of {redact_url(url)}")
        with progress("export", total=total) as bar:
            keys = _one(SessionKey(tenant, args.session)) if args.session else _sessions_of(store, tenant)
            async for key in keys:
                sessions += 1
                stored = await store.load_session(key)
                if stored is not None:
                    documents += 1
                    owner = json.dumps(stored.owner, ensure_ascii=False)
                    document = json.dumps(stored.session.to_dict(), ensure_ascii=False, separators=(",", ":"))
                    out.write(f'{_prefix("session", key)}"owner":{owner},"document":{document}}}\n')
                prefix = _prefix("message", key)
                async for message in store.iter_messages(key, batch=1000):
                    out.write(f'{prefix}"record":{message.to_record()}}}\n')
                    messages += 1
                    bar.advance()
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


@dataclass(frozen=True, slots=True)
class _Line:
    number: int
    key: SessionKey
    record: str | None = None  # a message line's record
    document: dict[str, Any] | None = None  # a session line's document
    owner: str | None = None


def _lines(stream: IO[bytes], name: str) -> Iterator[tuple[int, bytes]]:
    """The numbered, non-blank lines of a stream, refusing any line longer than ``MAX_LINE_BYTES``."""
    number = 0
    while True:
        line = stream.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_LINE_BYTES:
            raise ExportFormatError(f"line {number} of {name} is longer than {MAX_LINE_BYTES:,} bytes")
        if line.strip():
            yield number, line


def _parse(number: int, raw: bytes, name: str, tenant: str | None) -> _Line:
    """Check one line's shape (not yet its record: records are decoded in batches)."""

    def bad(why: str) -> ExportFormatError:
        return ExportFormatError(f"line {number} of {name}: {why}. {_NOTHING}")

    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad(f"not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise bad("not a JSON object")
    kind = data.get("type")
    try:
        key = SessionKey(tenant or data.get("tenant"), data.get("session_id"))  # type: ignore[arg-type]
    except ChatkeepError as exc:
        raise bad(str(exc)) from None
    if kind == "message":
        record = data.get("record")
        if not isinstance(record, dict):
            raise bad('a message line needs a "record" object')
        return _Line(number, key, record=json.dumps(record, ensure_ascii=False))
    if kind == "session":
        document, owner = data.get("document"), data.get("owner")
        if not isinstance(document, dict) or not (owner is None or isinstance(owner, str)):
            raise bad('a session line needs a "document" object and an "owner" string or null')
        document = {**document, "tenant": key.tenant}
        try:
            AgentSession.from_dict(document, tenant=key.tenant)
        except ChatkeepError as exc:
            raise bad(f"the session document is malformed ({exc})") from None
        return _Line(number, key, document=document, owner=owner)
    raise bad(f'"type" must be "message" or "session", got {kind!r}')


def _decode(batch: list[_Line], name: str) -> list[Message]:
    """Decode a batch of message lines at once; name the first bad line when one fails."""
    records = [line.record or "" for line in batch]
    try:
        return decode_records(records)
    except MessageFormatError:
        for line in batch:
            try:
                decode_records([line.record or ""])
            except MessageFormatError as exc:
                raise ExportFormatError(f"line {line.number} of {name}: {exc}. {_NOTHING}") from None
        raise


def _check_sizes(batch: list[_Line], name: str, limit: int) -> None:
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
) -> int:
    """The first pass: every line parsed, every record decoded and sized against ``limit``, a batch at a time.

    Returns the number of message lines.
    """
    batch: list[_Line] = []
    messages = 0
    for number, raw in _lines(stream, name):
        if spool is not None:
            spool.write(raw if raw.endswith(b"\n") else raw + b"\n")
        line = _parse(number, raw, name, tenant)
        if line.record is not None:
            batch.append(line)
            messages += 1
            if len(batch) >= APPEND_BATCH:
                _check_sizes(batch, name, limit)
                batch.clear()
        bar.advance()
    _check_sizes(batch, name, limit)
    return messages


async def _import(
    url: str, source: IO[bytes], name: str, tenant: str | None, spool: IO[bytes] | None
) -> dict[str, int]:
    """Validate ``source`` against the target store (spooling it when it cannot be read twice), then write it."""
    async with open_store(url) as store:
        with progress("validate") as bar:
            total = _validate(source, name, tenant, spool, bar, store.max_message_bytes)
        stream = source if spool is None else spool
        stream.seek(0)
        # The second pass, over lines already validated: appends in batches, one key at a time, in file order.
        with progress("import", total=total) as bar:
            return await _write_lines(store, stream, name, tenant, bar)


async def _write_lines(
    store: HistoryStore, stream: IO[bytes], name: str, tenant: str | None, bar: Progress
) -> dict[str, int]:
    counts = {"sessions": 0, "messages": 0, "new_messages": 0, "session_documents": 0}
    batch: list[_Line] = []
    current: SessionKey | None = None

    async def flush() -> None:
        if batch:
            counts["new_messages"] += await store.append(batch[0].key, _decode(batch, name))
            counts["messages"] += len(batch)
            bar.advance(len(batch))
            batch.clear()

    for number, raw in _lines(stream, name):
        line = _parse(number, raw, name, tenant)
        if line.key != current:
            await flush()
            current = line.key
            counts["sessions"] += 1
        if line.document is not None:
            await flush()
            session = AgentSession.from_dict(line.document, tenant=line.key.tenant)
            await store.save_session(line.key, session, owner=line.owner)
            counts["session_documents"] += 1
        else:
            batch.append(line)
            if len(batch) >= APPEND_BATCH:
                await flush()
    await flush()
    return counts


def import_(args: argparse.Namespace) -> int:
    """Read JSON Lines from ``--input`` or stdin: validate every line first, then write. Rerunning is safe.

    Nothing is written until the whole input has been validated (its shape, its records, and each record's size
    against the target's ``max_message_bytes``), so a bad line leaves the store as it was. Standard input cannot
    be read twice, so it is spooled to a temporary file during validation.
    """
    url = store_url(args)
    tenant: str | None = args.tenant  # None: each line's own tenant
    path: Path | None = args.input
    name = str(path) if path else "stdin"
    with contextlib.ExitStack() as files:
        if path is None:
            spool: IO[bytes] = files.enter_context(tempfile.TemporaryFile())
            counts = asyncio.run(_import(url, sys.stdin.buffer, name, tenant, spool))
        else:
            counts = asyncio.run(_import(url, files.enter_context(open(path, "rb")), name, tenant, None))
    text = (
        f"imported {plural(counts['messages'], 'message')} ({counts['new_messages']} new) in "
        f"{plural(counts['sessions'], 'session')} and {plural(counts['session_documents'], 'session document')} "
        f"from {name}"
    )
    if args.json:
        emit_json(counts)
    else:
        say(text)
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


async def _copy_session(source: HistoryStore, target: HistoryStore, key: SessionKey, bar: Progress) -> dict[str, Any]:
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
    return {
        "tenant": key.tenant,
        "session_id": key.session_id,
        "messages": count,
        "new_messages": new,
        "sha256": digest.hexdigest(),
        "target_messages": target_count,
        "target_sha256": target_digest,
        "verified": target_count == count and target_digest == digest.hexdigest(),
    }


async def copy(args: argparse.Namespace) -> int:
    """Copy every session of the given tenants from one store to another, then verify each by count and sha256.

    The store contract has no way to list tenants, so tenants are named (``--tenant``, repeatable). An
    interrupted copy is resumed by running it again: appends are idempotent by message id. A message over the
    target's ``max_message_bytes`` stops the copy there (a size check up front would read the whole source twice);
    the error says how to raise the limit, and the rerun resumes.
    """
    if args.source == args.target:
        raise UsageError("--from and --to name the same store; copy needs two different stores")
    shown_from, shown_to = redact_url(args.source), redact_url(args.target)
    report: dict[str, Any] = {"from": shown_from, "to": shown_to, "tenants": list(args.tenants)}
    sessions = messages = new = 0
    mismatches: list[dict[str, Any]] = []
    async with open_existing_store(args.source) as source, open_store(args.target) as target:
        source.sealed_passthrough = target.sealed_passthrough = True  # encrypted sessions move sealed, as stored
        with progress("copy") as bar:
            for tenant in args.tenants:
                async for key in _sessions_of(source, tenant):
                    result = await _copy_session(source, target, key, bar)
                    sessions += 1
                    messages += result["messages"]
                    new += result["new_messages"]
                    if not result["verified"]:
                        mismatches.append(result)
    report.update(sessions=sessions, messages=messages, new_messages=new, mismatches=mismatches)
    report["ok"] = not mismatches
    if args.json:
        emit_json(report)
    else:
        tenants = ", ".join(repr(t) for t in args.tenants)
        say(f"copied {plural(sessions, 'session')} ({plural(messages, 'message')}, {new} new) of tenant {tenants}")
        say(f"  from {shown_from}")
        say(f"  to   {shown_to}")
        for bad in mismatches:
            say(
                f"MISMATCH {printable(bad['tenant'])}/{printable(bad['session_id'])}: "
                f"source {bad['messages']} messages sha256 {bad['sha256'][:12]}, "
                f"target {bad['target_messages']} messages sha256 {bad['target_sha256'][:12]}"
            )
        if not mismatches:
            say("verified: every session has the same message count and sha256 in both stores")
        else:
            say("the target holds other messages for these sessions; delete them there and copy again")
    return 0 if report["ok"] else 1
