"""Pydantic AI's conversation entries and records as chatkeep messages and documents, exactly as it writes them.

An entry's message is kept as ``ModelMessagesTypeAdapter`` writes it to JSON (field for field, bytes as base64),
in the chatkeep message's envelope beside the entry's id and parent; the chatkeep ``message_id`` is the entry's
id, so appends are idempotent by entry and ``store.fork(through=entry_id)`` cuts a history at an entry. A record
is kept as ``TypeAdapter(ConversationRecord)`` writes it to JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai.conversation_store import ConversationEntry, ConversationRecord
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    SystemPromptPart,
    ToolReturnPart,
    UserPromptPart,
)

from chatkeep.core import Message, MessageFormatError, Role
from chatkeep.interop._envelope import unwrap, wrap

__all__ = ["FORMAT", "entries_of", "history_items", "messages_of", "record_json", "record_of"]

#: The envelope format of the entries this adapter writes.
FORMAT = "pydantic-ai"

_RECORD: TypeAdapter[ConversationRecord] = TypeAdapter(ConversationRecord)


def record_json(record: ConversationRecord) -> dict[str, Any]:
    """The record as Pydantic AI writes it to JSON, as a dict (for a session document's state)."""
    data: dict[str, Any] = json.loads(_RECORD.dump_json(record))
    return data


def record_of(data: Mapping[str, Any], conversation_id: str) -> ConversationRecord:
    """The record :func:`record_json` wrote.

    Raises:
        MessageFormatError: the stored record is not one (damaged, or written by something else).
    """
    try:
        return _RECORD.validate_json(json.dumps(data))
    except ValueError as exc:
        raise MessageFormatError(
            f"the stored record of conversation {conversation_id!r} is not a Pydantic AI ConversationRecord ({exc}); "
            "delete that session (chatkeep sessions delete) or restore it from a backup"
        ) from exc


def _rendering(message: ModelMessage) -> tuple[Role, str]:
    """The role and text ``chatkeep sessions show`` displays for a message (the adapter never reads them)."""
    if isinstance(message, ModelResponse):
        return "assistant", message.text or ""
    texts = [p.content for p in message.parts if isinstance(p, UserPromptPart) and isinstance(p.content, str)]
    if texts:
        return "user", "\n".join(texts)
    if message.parts and all(isinstance(p, ToolReturnPart) for p in message.parts):
        return "tool", "\n".join(p.model_response_str() for p in message.parts if isinstance(p, ToolReturnPart))
    if any(isinstance(p, SystemPromptPart) for p in message.parts):
        return "system", "\n".join(p.content for p in message.parts if isinstance(p, SystemPromptPart))
    return "user", ""


def messages_of(entries: Sequence[ConversationEntry]) -> list[Message]:
    """The chatkeep messages that keep ``entries`` exactly, each with its entry's id as ``message_id``."""
    dumped: list[dict[str, Any]] = json.loads(ModelMessagesTypeAdapter.dump_json([e.message for e in entries]))
    messages = []
    for entry, message_json in zip(entries, dumped, strict=True):
        role, text = _rendering(entry.message)
        item = {"id": entry.id, "parent_id": entry.parent_id, "kind": entry.kind, "message": message_json}
        messages.append(wrap(item, format=FORMAT, role=role, text=text, message_id=entry.id))
    return messages


def _item_of(message: Message) -> dict[str, Any]:
    item = unwrap(message, format=FORMAT)
    if item is None:
        raise MessageFormatError(
            f"message {message.message_id} ({message.role}) was not written through ChatkeepConversationStore: "
            "this session also holds other messages; give each Pydantic AI conversation a session id of its own"
        )
    return item


def history_items(messages: Sequence[Message], head_id: str, limit: int | None) -> list[dict[str, Any]] | None:
    """The items of the history that ends at entry ``head_id``, oldest first (only the ``limit`` newest).

    ``messages`` are a line as stored (or its newest part). The history is followed from ``head_id`` through
    each entry's parent, so entries a failed save left in the line (its record write lost a race) are passed
    over. ``None`` when ``messages`` hold only part of the history: read more of the line.
    """
    by_id = {message.message_id: message for message in messages}
    items: list[dict[str, Any]] = []
    entry_id: str | None = head_id
    while entry_id is not None and (limit is None or len(items) < limit):
        message = by_id.get(entry_id)
        if message is None:
            return None
        item = _item_of(message)
        items.append(item)
        entry_id = item["parent_id"]
    items.reverse()
    return items


def entries_of(items: Sequence[Mapping[str, Any]]) -> list[ConversationEntry]:
    """The entries the items keep, their messages read as Pydantic AI reads its own JSON (one parse for all)."""
    messages = ModelMessagesTypeAdapter.validate_json(json.dumps([item["message"] for item in items]))
    return [
        ConversationEntry(id=item["id"], parent_id=item["parent_id"], kind=item["kind"], message=message)
        for item, message in zip(items, messages, strict=True)
    ]
