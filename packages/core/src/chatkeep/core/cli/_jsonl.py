"""The export file: chatkeep's JSON Lines format, written by ``export`` and read by ``import``.

One JSON object per line, UTF-8 (docs/cli.md describes it for other tools)::

    {"type":"session","tenant":T,"session_id":S,"owner":O,"document":{...AgentSession.to_dict()...}}
    {"type":"info","tenant":T,"session_id":S,"title":T|null,"tags":[...],"metadata":{...},"forked_from":{...}|null}
    {"type":"message","tenant":T,"session_id":S,"record":{"v":1,...the message's stored record...}}
    {"type":"damaged","tenant":T,"session_id":S,"error":"..."}
    {"type":"end","format":"chatkeep-export","version":1,"sessions":N,"messages":M,"damaged":D}

A session's document line and info line (title, tags, metadata and the fork it came from, when it has any) come
before its message lines, in the store's order. A ``damaged`` line says that
the session was found damaged while it was exported (``--skip-damaged``): ``import`` leaves out every line of
that session. The ``end`` line (the trailer) closes the file with the counts of the lines before it, so a file
cut short, even at a line boundary, is told from a complete one. Files joined with ``cat`` hold one trailer per
export, each counting the lines since the previous one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from chatkeep.core._errors import ChatkeepError
from chatkeep.core._session import AgentSession
from chatkeep.core.backend import SessionInfo, SessionKey, check_metadata, check_tags, check_title

__all__ = [
    "FORMAT",
    "MAX_LINE_BYTES",
    "NOTHING",
    "VERSION",
    "ExportFormatError",
    "Line",
    "Tally",
    "Trailer",
    "damaged",
    "info_line",
    "lines",
    "parse",
    "prefix",
    "trailer",
]

FORMAT = "chatkeep-export"
VERSION = 1
#: The longest line import accepts: a message record is at most a store's max_message_bytes (4 MB by default).
MAX_LINE_BYTES = 64 * 1024 * 1024

NOTHING = "Nothing was imported: fix the line (or export again) and rerun the import"


class ExportFormatError(ChatkeepError, ValueError):
    """A line of a JSON Lines file is not a chatkeep export line, or the file is incomplete; nothing was imported."""


def prefix(kind: str, key: SessionKey) -> str:
    """The start of a line of ``kind`` for ``key``, up to its last field (written as it is, for speed)."""
    tenant, session = json.dumps(key.tenant, ensure_ascii=False), json.dumps(key.session_id, ensure_ascii=False)
    return f'{{"type":"{kind}","tenant":{tenant},"session_id":{session},'


def damaged(key: SessionKey, error: BaseException) -> str:
    """The line saying that ``key`` was damaged and skipped: import leaves the session out."""
    return f'{prefix("damaged", key)}"error":{json.dumps(str(error), ensure_ascii=False)}}}\n'


def trailer(sessions: int, messages: int, damaged: int) -> str:
    """The line that closes an export, with the counts of the lines before it."""
    body = {"type": "end", "format": FORMAT, "version": VERSION, "sessions": sessions, "messages": messages}
    return json.dumps({**body, "damaged": damaged}, separators=(",", ":")) + "\n"


@dataclass(frozen=True, slots=True)
class Line:
    """One session, message or damaged line."""

    number: int
    key: SessionKey
    record: str | None = None  # a message line's record
    document: dict[str, Any] | None = None  # a session line's document
    owner: str | None = None
    damaged: str | None = None  # a damaged line's error
    info: dict[str, Any] | None = None  # an info line's title, tags and metadata (checked)


@dataclass(frozen=True, slots=True)
class Trailer:
    """The ``end`` line: what the lines before it (since the previous trailer) hold."""

    number: int
    sessions: int
    messages: int
    damaged: int


def lines(stream: IO[bytes], name: str) -> Iterator[tuple[int, bytes]]:
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


def parse(number: int, raw: bytes, name: str, tenant: str | None) -> Line | Trailer:
    """Check one line's shape (not yet its record: records are decoded in batches)."""

    def bad(why: str) -> ExportFormatError:
        return ExportFormatError(f"line {number} of {name}: {why}. {NOTHING}")

    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad(f"not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise bad("not a JSON object")
    kind = data.get("type")
    if kind == "end":
        counts = [data.get(name) for name in ("sessions", "messages", "damaged")]
        if data.get("format") != FORMAT or not all(isinstance(n, int) and n >= 0 for n in counts):
            raise bad(f'an end line needs "format": "{FORMAT}" and whole "sessions", "messages" and "damaged" counts')
        if data.get("version") != VERSION:
            raise bad(f"the export format version is {data.get('version')!r}; this chatkeep reads version {VERSION}")
        return Trailer(number, *counts)  # type: ignore[arg-type]
    try:
        key = SessionKey(tenant or data.get("tenant"), data.get("session_id"))  # type: ignore[arg-type]
    except ChatkeepError as exc:
        raise bad(str(exc)) from None
    if kind == "message":
        record = data.get("record")
        if not isinstance(record, dict):
            raise bad('a message line needs a "record" object')
        return Line(number, key, record=json.dumps(record, ensure_ascii=False))
    if kind == "session":
        document, owner = data.get("document"), data.get("owner")
        if not isinstance(document, dict) or not (owner is None or isinstance(owner, str)):
            raise bad('a session line needs a "document" object and an "owner" string or null')
        document = {**document, "tenant": key.tenant}
        try:
            AgentSession.from_dict(document, tenant=key.tenant)
        except ChatkeepError as exc:
            raise bad(f"the session document is malformed ({exc})") from None
        return Line(number, key, document=document, owner=owner)
    if kind == "damaged":
        return Line(number, key, damaged=str(data.get("error", "")))
    if kind == "info":
        title = data.get("title")
        try:
            info = {
                "title": "" if title is None else check_title(title),
                "tags": check_tags(data.get("tags", [])),
                "metadata": check_metadata(data.get("metadata", {})),
            }
        except ChatkeepError as exc:
            raise bad(f"the session's info is malformed ({exc})") from None
        return Line(number, key, info=info)
    raise bad(f'"type" must be "message", "session", "info", "damaged" or "end", got {kind!r}')


def info_line(key: SessionKey, info: SessionInfo) -> str | None:
    """The info line of a session (title, tags, metadata, fork parent), or ``None`` when it has none."""
    if not (info.title or info.tags or info.metadata or info.forked_from):
        return None
    forked = info.forked_from
    body = {
        "title": info.title,
        "tags": sorted(info.tags),
        "metadata": info.metadata,
        "forked_from": None if forked is None else {"session_id": forked.session_id, "through": forked.through},
    }
    return prefix("info", key) + json.dumps(body, ensure_ascii=False, separators=(",", ":"))[1:] + "\n"


@dataclass
class Tally:
    """What import's first pass counts, checked against each trailer; ``damaged``: the sessions to leave out."""

    name: str
    sessions: int = 0
    messages: int = 0
    marks: int = 0
    damaged: dict[SessionKey, str] = field(default_factory=dict)
    problem: str | None = None  # why the file is incomplete (None: complete)
    _current: SessionKey | None = None
    _since: list[int] = field(default_factory=lambda: [0, 0, 0])  # sessions, messages, damaged since the trailer
    _closed: bool = False  # the last line read was a trailer

    def add(self, line: Line | Trailer) -> None:
        """Count one line; at a trailer, compare (the first mismatch is kept in :attr:`problem`)."""
        if isinstance(line, Trailer):
            found = tuple(self._since)
            expected = (line.sessions, line.messages, line.damaged)
            if found != expected and self.problem is None:
                self.problem = (
                    f"the trailer at line {line.number} counts {line.sessions} sessions, {line.messages} messages and "
                    f"{line.damaged} damaged sessions, but the lines before it hold {found[0]}, {found[1]} and "
                    f"{found[2]}: lines are missing (the file was cut or edited)"
                )
            self._since, self._current, self._closed = [0, 0, 0], None, True
            return
        self._closed = False
        if line.damaged is not None:
            self.damaged[line.key] = line.damaged
            self._since[2] += 1
            self.marks += 1
            return
        if line.key != self._current:
            self._current = line.key
            self._since[0] += 1
            self.sessions += 1
        if line.record is not None:
            self._since[1] += 1
            self.messages += 1

    def finish(self, read_any: bool) -> None:
        """At the end of the file: a file whose last line is not a trailer is incomplete."""
        if self.problem is None and read_any and not self._closed:
            self.problem = (
                "it does not end with the trailer line export writes last: it was cut short, or written by an "
                "earlier chatkeep, whose exports had no trailer"
            )
        elif self.problem is None and not read_any:
            self.problem = "it is empty: it holds no export, not even the trailer line"
