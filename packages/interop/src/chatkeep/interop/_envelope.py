"""How a framework's own item is kept in a chatkeep :class:`Message`, exactly as the framework wrote it.

The item's JSON form goes, untouched, into ``additional_properties`` under :data:`ENVELOPE_KEY` with the
name of its format, so what a framework writes is what it reads back, field for field (unknown future
fields included). The message's ``role`` and text are a readable rendering beside it, for ``chatkeep
sessions show`` and for chatkeep's own agents; an adapter reads only the item.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from chatkeep.core import Content, InvalidArgumentError, Message, MessageFormatError, Role, TextContent

__all__ = ["ENVELOPE_KEY", "unwrap", "wrap"]

#: The ``additional_properties`` key that holds a framework's item: ``{"format": ..., "item": {...}}``.
ENVELOPE_KEY = "chatkeep.interop"


def wrap(
    item: Mapping[str, Any],
    *,
    format: str,
    role: Role,
    text: str = "",
    contents: Sequence[Content] = (),
    message_id: str | None = None,
    author_name: str | None = None,
    created_at: datetime | None = None,
) -> Message:
    """A message that keeps ``item`` (JSON-safe) exactly, with ``role`` and ``text`` as its readable rendering.

    ``contents`` go after the text: what chatkeep itself reads from the message (its usage, for one).

    Its ``message_id`` is a new chatkeep id unless the adapter gives one: most frameworks' own ids are not unique
    enough to deduplicate appends by (the Agents SDK gives every Chat Completions item the same placeholder id);
    an adapter whose framework makes a unique id per item (ADK's events, Pydantic AI's entries) passes it, so
    that an append retried after a lost acknowledgement stores the item once. ``author_name`` and
    ``created_at`` (default: now) are the message's own fields, for chatkeep's readers.

    Raises:
        MessageFormatError: the item holds a value that is not JSON (a datetime, bytes, an object); the error
            names where.
    """
    rendered: list[Content] = [TextContent(text=text)] if text else []
    fields: dict[str, Any] = {}
    if message_id is not None:
        fields["message_id"] = message_id
    if created_at is not None:
        fields["created_at"] = created_at
    try:
        return Message(
            role=role,
            author_name=author_name,
            contents=[*rendered, *contents],
            **fields,
            additional_properties={ENVELOPE_KEY: {"format": format, "item": dict(item)}},
        )
    except InvalidArgumentError as exc:  # pydantic's ValidationError is its cause, naming the places
        found = exc.__cause__
        errors = found.errors() if isinstance(found, ValidationError) else []
        places = [_json_path(error["loc"]) for error in errors if error["loc"][:1] == ("additional_properties",)]
        if not places:
            raise
        raise MessageFormatError(
            f"a {format!r} item holds a value that is not JSON at {', '.join(places)}: chatkeep keeps items as "
            "JSON; convert it to strings, numbers, lists and dicts before storing it"
        ) from exc


def _json_path(loc: tuple[int | str, ...]) -> str:
    """``item["a"][1]`` from pydantic's location of a bad JSON value (type tags and keys alternate after the key)."""
    return "item" + "".join(f"[{step!r}]" for step in loc[5::2])


def unwrap(message: Message, *, format: str) -> dict[str, Any] | None:
    """The item of ``format`` a message keeps, or ``None`` for a message that no adapter wrote.

    Raises:
        MessageFormatError: the message keeps an item of another framework's format (the session was written
            through another adapter); read it with that adapter, or keep one framework per session.
    """
    envelope = message.additional_properties.get(ENVELOPE_KEY)
    if envelope is None:
        return None
    item = envelope.get("item") if isinstance(envelope, dict) else None
    if not isinstance(envelope, dict) or not isinstance(item, dict):
        raise MessageFormatError(
            f"message {message.message_id} has a malformed {ENVELOPE_KEY!r} entry: it was not written by "
            "chatkeep-interop; remove that key from the message's additional_properties"
        )
    if envelope.get("format") != format:
        raise MessageFormatError(
            f"message {message.message_id} holds a {envelope.get('format')!r} item, not {format!r}: this session "
            f"was written through another framework's adapter; read it with that adapter, or use one framework per "
            "session"
        )
    return item
