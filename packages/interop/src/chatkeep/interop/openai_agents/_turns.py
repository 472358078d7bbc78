"""The turns of an Agents SDK history, as ``AdvancedSQLiteSession`` counts them, read from the stored messages.

A user message (an item with ``role: "user"``) starts a turn; every item after it, up to the next user message,
belongs to it, and so do the usage records ``store_run_usage`` appends (:mod:`._usage`). Turns are numbered from 1
in the order of the history (items before the first user message are turn 0), so a branch forked before turn
``n`` keeps turns 1 to ``n - 1`` with their numbers. Nothing is stored for this: the numbers come from the history
itself, so a fork, a pop or a copy of the session to another backend carries them along.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from chatkeep.core import Message
from chatkeep.interop.openai_agents._items import item_of
from chatkeep.interop.openai_agents._usage import usage_record_of

__all__ = ["Turn", "content_preview", "item_type", "matches", "tool_name", "tool_usage", "turns_of"]

#: The item types that call a tool (what ``get_tool_usage`` counts), as the SDK's own session counts them.
_TOOL_CALLS = frozenset(
    {
        "tool_call",
        "function_call",
        "computer_call",
        "file_search_call",
        "web_search_call",
        "code_interpreter_call",
        "tool_search_call",
        "custom_tool_call",
        "mcp_call",
        "mcp_approval_request",
        "shell_call",
        "apply_patch_call",
    }
)
#: Hosted tools whose items carry no ``name``: the item's type names the tool.
_NAMELESS_TOOLS = frozenset(
    {"computer_call", "file_search_call", "web_search_call", "code_interpreter_call", "shell_call", "apply_patch_call"}
)


@dataclass
class Turn:
    """One turn of a history: the user message that starts it, its items, and the usage stored with it.

    Attributes:
        number: 1 for the first user message of the history, 2 for the next...; 0 for items before any.
        message: the chatkeep message of the user item (``None`` for turn 0).
        items: the turn's items, the user message first, as the SDK added them.
        usage: the usage records stored with the turn (``store_run_usage``), oldest first, each with the id of
            the message that keeps it (a fork shares its source's records, under the same ids).
    """

    number: int
    message: Message | None
    items: list[dict[str, Any]] = field(default_factory=list)
    usage: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    @property
    def created_at(self) -> datetime | None:
        """When its user message was made (``None`` for turn 0)."""
        return None if self.message is None else self.message.created_at

    @property
    def content(self) -> Any:
        """The user message's ``content``: a string, or the list of parts of a multimodal message."""
        return None if not self.items or self.number == 0 else self.items[0].get("content", "")


def is_user_message(item: Mapping[str, Any]) -> bool:
    """Whether the item starts a turn (the SDK's rule: its ``role`` is ``"user"``)."""
    return item.get("role") == "user"


def turns_of(messages: Iterable[Message]) -> list[Turn]:
    """The turns of a history, oldest first (turn 0 only when items come before the first user message).

    Raises:
        MessageFormatError: a message was not written through ``ChatkeepSession``.
    """
    turns: list[Turn] = []
    current: Turn | None = None
    users = 0
    for message in messages:
        record = usage_record_of(message)
        if record is not None:
            if current is not None:  # usage stored before any item has no turn to belong to
                current.usage.append((message.message_id, record))
            continue
        item = item_of(message)
        if is_user_message(item):
            users += 1
            current = Turn(users, message)
            turns.append(current)
        elif current is None:
            current = Turn(0, None)
            turns.append(current)
        current.items.append(item)
    return turns


def item_type(item: Mapping[str, Any]) -> str:
    """How ``get_conversation_by_turns`` names an item: ``user``, ``assistant``, else the item's ``type``."""
    role = item.get("role")
    if role in ("user", "assistant"):
        return str(role)
    kind = item.get("type")
    return str(kind) if kind else "other"


def tool_name(item: Mapping[str, Any]) -> str | None:
    """The tool an item calls or answers, named as the SDK's session names it (``None`` for other items).

    An MCP call is ``server.tool``; a hosted tool without a name is its item type; a tool search is
    ``tool_search``; a function in a namespace is ``namespace.name``, except when the namespace repeats the
    name (the wire shape of a deferred top-level tool), which is the bare name.
    """
    kind = item.get("type")
    if kind in ("mcp_call", "mcp_approval_request") and "server_label" in item:
        parts = [str(part) for part in (item.get("server_label"), item.get("name")) if part]
        return ".".join(parts) or None
    if kind in ("tool_search_call", "tool_search_output"):
        return "tool_search"
    if kind in _NAMELESS_TOOLS:
        return str(kind)
    name = item.get("name")
    if name is None:
        return None
    namespace = item.get("namespace")
    if namespace is None or namespace == "" or str(namespace) == str(name):
        return str(name)
    return f"{namespace}.{name}"


def tool_usage(turns: Iterable[Turn]) -> list[tuple[str, int, int]]:
    """``(tool name, calls, turn number)`` for every tool called in each turn, ordered by turn then name.

    A tool search's output counts as a call of ``tool_search`` only when its turn holds no tool search call
    (a server-side search stores the output alone).
    """
    counted: list[tuple[str, int, int]] = []
    for turn in turns:
        calls: dict[str, int] = {}
        for item in turn.items:
            kind = item.get("type")
            if kind in _TOOL_CALLS:
                name = tool_name(item)
                if name is not None:
                    calls[name] = calls.get(name, 0) + 1
        searched = any(item.get("type") == "tool_search_call" for item in turn.items)
        if not searched:
            for item in turn.items:
                if item.get("type") == "tool_search_output":
                    calls["tool_search"] = calls.get("tool_search", 0) + 1
        counted += [(name, count, turn.number) for name, count in sorted(calls.items())]
    return counted


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [str(part.get("text", "")) for part in content if isinstance(part, Mapping)]
    return []


def matches(turn: Turn, search_term: str) -> bool:
    """Whether the turn's user message holds ``search_term``, ignoring the case of ASCII letters (as SQLite's
    ``LIKE``, which the SDK's session searches with)."""
    pattern = re.compile(re.escape(search_term), re.IGNORECASE | re.ASCII)
    return any(pattern.search(text) for text in _texts(turn.content))


def content_preview(content: Any, max_length: int | None = None) -> str:
    """The user message's content as a string (a list of parts as JSON), cut at ``max_length`` with ``...``."""
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    if max_length is not None and len(text) > max_length:
        return text[:max_length] + "..."
    return text
