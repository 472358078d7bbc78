"""How the commands show what a store keeps about a session beside its messages: title, tags, tokens, fork parent."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chatkeep.core.backend import SessionInfo

__all__ = ["info_columns", "info_fields"]

_TITLE_WIDTH = 40


def info_fields(info: SessionInfo) -> dict[str, Any]:
    """The JSON fields ``sessions list --json`` gives each session beside its counts and times."""
    return {
        "title": info.title,
        "tags": sorted(info.tags),
        "metadata": info.metadata,
        "usage": None if info.usage is None else info.usage.to_dict(),
        "forked_from": None
        if info.forked_from is None
        else {"session_id": info.forked_from.session_id, "through": info.forked_from.through},
    }


def info_columns(
    headers: Sequence[str], rows: Sequence[tuple[SessionInfo, Sequence[object]]]
) -> tuple[tuple[str, ...], list[tuple[object, ...]]]:
    """``headers`` and each row with the columns TITLE, TAGS, TOKENS and FORKED FROM added, those any row fills.

    A column no listed session has a value for is left out, so stores without titles, tags, usage or forks list
    as they always did.
    """
    values: dict[str, list[str]] = {
        "TITLE": [_title(info.title) for info, _ in rows],
        "TAGS": [",".join(sorted(info.tags)) for info, _ in rows],
        "TOKENS": ["" if not info.usage else str(info.usage.total_tokens) for info, _ in rows],
        "FORKED FROM": [
            "" if info.forked_from is None else f"{info.forked_from.session_id}@{info.forked_from.through}"
            for info, _ in rows
        ],
    }
    shown = [name for name, column in values.items() if any(column)]
    table_rows = [(*row, *(values[name][n] for name in shown)) for n, (_, row) in enumerate(rows)]
    return (*headers, *shown), table_rows


def _title(title: str | None) -> str:
    if not title:
        return ""
    return title if len(title) <= _TITLE_WIDTH else title[: _TITLE_WIDTH - 3] + "..."
