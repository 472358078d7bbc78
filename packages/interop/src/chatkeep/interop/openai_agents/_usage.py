"""A run's token usage kept in the history: the usage record ``store_run_usage`` appends after a turn's items.

A record keeps, in its envelope, the SDK's ``Usage`` as the SDK reports it (requests, tokens and their details),
which ``get_turn_usage`` returns; a turn's usage is its newest record. It also holds
a :class:`~chatkeep.core.UsageContent` per model request it adds to the turn, so the store's own
:meth:`~chatkeep.core.HistoryStore.usage` (kept by ``append`` in the same write) counts the session's calls and
tokens. The SDK never sees a record: ``get_items`` and ``pop_item`` pass over them. It belongs to the turn it
follows (:mod:`._turns`), so a fork taken after it keeps it and one taken before it does not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from chatkeep.core import Message, Usage, UsageContent
from chatkeep.interop._envelope import ENVELOPE_KEY, wrap

if TYPE_CHECKING:
    from agents.usage import Usage as SDKUsage

__all__ = ["USAGE_FORMAT", "record_of", "summed", "usage_message", "usage_record_of"]

#: The envelope format of usage records (beside the items' ``openai-agents``).
USAGE_FORMAT = "openai-agents.usage"

_COUNTS = ("requests", "input_tokens", "output_tokens", "total_tokens")
_DETAILS = ("input_tokens_details", "output_tokens_details")


def _details(details: Any) -> dict[str, Any] | None:
    """Token details (the openai package's pydantic models) as a JSON dict; ``None`` when there are none."""
    if details is None:
        return None
    if hasattr(details, "model_dump"):
        dumped: dict[str, Any] = details.model_dump(mode="json")
        return dumped
    return {key: value for key, value in vars(details).items() if not key.startswith("_")}


def record_of(usage: SDKUsage) -> dict[str, Any]:
    """The SDK's ``Usage`` of a run as the JSON a usage record keeps (what ``get_turn_usage`` returns)."""
    record: dict[str, Any] = {name: int(getattr(usage, name) or 0) for name in _COUNTS}
    for name in _DETAILS:
        record[name] = _details(getattr(usage, name))
    return record


def usage_message(usage: SDKUsage, *, replaces: Mapping[str, Any] | None = None) -> Message:
    """The message that records a run's usage as its turn's usage, replacing the turn's record ``replaces``.

    A turn's usage is its newest record (a run resumed from a ``RunState`` reports the usage of the whole turn
    again, and the SDK's session keeps the last report). So that the store's counter still sums the turns, the
    record's usage contents hold what it adds to ``replaces``: one per model request made since (the SDK lists
    each request's usage in ``request_usage_entries`` when its model reports them), or else one with the
    difference of the totals.
    """
    before = replaces or {}
    done = int(before.get("requests") or 0)
    entries = usage.request_usage_entries
    if entries and len(entries) == usage.requests and usage.requests >= done:
        added = [(entry.input_tokens, entry.output_tokens, entry.total_tokens) for entry in entries[done:]]
    else:
        totals = [int(getattr(usage, name) or 0) - int(before.get(name) or 0) for name in _COUNTS]
        added = [(totals[1], totals[2], totals[3])] if any(totals) else []
    contents = [
        UsageContent(usage=Usage(input_tokens=int(i or 0), output_tokens=int(o or 0), total_tokens=int(t or 0)))
        for i, o, t in added
    ]
    return wrap(record_of(usage), format=USAGE_FORMAT, role="assistant", contents=contents)


def usage_record_of(message: Message) -> dict[str, Any] | None:
    """The SDK usage a usage record keeps; ``None`` for any other message (an item)."""
    envelope = message.additional_properties.get(ENVELOPE_KEY)
    if not isinstance(envelope, dict) or envelope.get("format") != USAGE_FORMAT:
        return None
    record = envelope.get("item")
    return record if isinstance(record, dict) else None


def summed(records: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Usage records added up: their requests and tokens (their token details are per turn only)."""
    total = dict.fromkeys(_COUNTS, 0)
    for record in records:
        for name in _COUNTS:
            total[name] += int(record.get(name) or 0)
    return total
