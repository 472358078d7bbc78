"""How the command talks: aligned tables and readable times for people, stable JSON for scripts, progress bars."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Protocol

__all__ = [
    "Progress",
    "UsageError",
    "emit_json",
    "iso",
    "plural",
    "printable",
    "printable_lines",
    "progress",
    "say",
    "table",
    "when",
]

# What a stored id or text could drive a terminal with: C0 and C1 controls (escape sequences, carriage returns,
# newlines that forge a line), DEL, the line and paragraph separators, and the marks that reorder text.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


class UsageError(Exception):
    """The command line itself is wrong (exit status 2), as opposed to the store or the data (status 1)."""


def printable(text: str) -> str:
    """``text`` with each control character written as its escape (``\\x1b``, ``\\n``, ``\\u202e``): safe on a terminal.

    Ids and message texts come from whoever wrote to the store; printed raw, an escape sequence in them would
    drive the reader's terminal, and a newline would forge a line of output.
    """
    return _UNSAFE.sub(lambda match: repr(match[0])[1:-1], text)


def printable_lines(text: str) -> str:
    """``text`` with each control character escaped but the newlines between its lines (see :func:`printable`)."""
    return "\n".join(printable(line) for line in text.split("\n"))


def say(text: str = "", *, err: bool = False) -> None:
    """Print lines for people, on stdout (or stderr), flushed so that it interleaves with a child's output.

    Control characters other than the newlines between lines are escaped (see :func:`printable`); an id or a
    text that may hold a newline must go through :func:`printable` before it is put in ``text``.
    """
    print(printable_lines(text), file=sys.stderr if err else sys.stdout, flush=True)


def emit_json(value: Any) -> None:
    """Print one JSON document on stdout: the ``--json`` output of a command."""
    print(json.dumps(value, ensure_ascii=False), flush=True)


def plural(n: int, word: str) -> str:
    """``1 session``, ``3 sessions``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def iso(moment: datetime) -> str:
    """A time as ``--json`` writes it: ISO 8601 in UTC."""
    return moment.astimezone(timezone.utc).isoformat()


def when(moment: datetime) -> str:
    """A time as people read it in tables: UTC to the second."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, right: Sequence[int] = ()) -> None:
    """Print rows under headers in aligned columns (``right``: the indexes of right-aligned, numeric, columns)."""
    cells = [[printable(str(cell)) for cell in row] for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths, strict=True))]
        return "  ".join(parts).rstrip()

    say(line(list(headers)))
    for row in cells:
        say(line(row))


class Progress(Protocol):
    """What a command reports progress to: ``advance`` by a number of messages, ``total`` once known."""

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more messages done."""

    def total(self, n: int | None) -> None:
        """Set (or clear) how many messages there are in all."""


class _Silent:
    def advance(self, n: int = 1) -> None:
        pass

    def total(self, n: int | None) -> None:
        pass


class _RichBar:
    def __init__(self, bar: Any, task: Any) -> None:
        self._bar, self._task = bar, task

    def advance(self, n: int = 1) -> None:
        self._bar.advance(self._task, n)

    def total(self, n: int | None) -> None:
        self._bar.update(self._task, total=n)


@contextmanager
def progress(description: str, *, total: int | None = None, enabled: bool = True) -> Iterator[Progress]:
    """A progress bar on stderr, shown only when stderr is a terminal and rich is installed (``chatkeep-core[cli]``).

    Scripts and pipes get no bar, and no escape codes in their logs.
    """
    if not (enabled and sys.stderr.isatty()):
        yield _Silent()
        return
    try:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError:  # the bar is a comfort, not a requirement: without the extra, work goes on silently
        yield _Silent()
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        yield _RichBar(bar, bar.add_task(description, total=total))
