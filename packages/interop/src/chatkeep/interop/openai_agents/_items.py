"""The Agents SDK's input items as chatkeep messages, and the rule that keeps a windowed history sendable.

An item (a ``TResponseInputItem`` dict) is kept exactly in the message's envelope; the message's role and
text are only a readable rendering of it. The SDK's items are the Responses API's: a model's reasoning, each
tool call and each tool output is an item of its own, paired by ``call_id``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chatkeep.core import Message, MessageFormatError, Role
from chatkeep.interop._envelope import unwrap, wrap

__all__ = ["FORMAT", "item_of", "message_of", "sendable_window"]

#: The envelope format of the items this adapter writes.
FORMAT = "openai-agents"

_ROLES: dict[str, Role] = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def _is_output(item: Mapping[str, Any]) -> bool:
    """Whether the item answers a call: an ``mcp_approval_response`` or any ``*_output`` item."""
    # function_call_output, computer_call_output, shell_call_output, custom_tool_call_output, program_output,
    # tool_search_output, ...: the Responses API names every output type so, the ones it adds later too.
    kind = item.get("type")
    return kind == "mcp_approval_response" or (isinstance(kind, str) and kind.endswith("_output"))


def _links(item: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The id of the call the item makes, and the id of the call it answers (``None`` where there is none).

    An output of a hosted tool names no call (its ``call_id`` is null), so nothing outside the window can
    be missing for it.
    """
    kind = item.get("type")
    if _is_output(item):
        answered = item.get("approval_request_id" if kind == "mcp_approval_response" else "call_id")
        return None, answered if isinstance(answered, str) else None
    made = item.get("id") if kind == "mcp_approval_request" else item.get("call_id")
    return made if isinstance(made, str) else None, None


def _text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = (p.get("text") or p.get("refusal") for p in value if isinstance(p, Mapping))
        return "\n".join(p for p in parts if isinstance(p, str))
    return ""


def message_of(item: Mapping[str, Any]) -> Message:
    """The chatkeep message that keeps ``item`` exactly (a new message id; the SDK's ids are not unique).

    Raises:
        MessageFormatError: ``item`` is not a dict of JSON values.
    """
    if not isinstance(item, Mapping):
        raise MessageFormatError(
            f"an Agents SDK session item is a dict (a TResponseInputItem), not a {type(item).__name__}; pass "
            "items as the SDK makes them (item.to_input_item())"
        )
    if _is_output(item):
        return wrap(item, format=FORMAT, role="tool", text=_text_of(item.get("output")))
    role = item.get("role")
    if isinstance(role, str) and item.get("type", "message") == "message":
        return wrap(item, format=FORMAT, role=_ROLES.get(role, "user"), text=_text_of(item.get("content")))
    return wrap(item, format=FORMAT, role="assistant")


def item_of(message: Message) -> dict[str, Any]:
    """The item a message keeps, exactly as it was added.

    Raises:
        MessageFormatError: the message was not written through ``ChatkeepSession`` (another adapter, or
            chatkeep's own agents, wrote it).
    """
    item = unwrap(message, format=FORMAT)
    if item is None:
        raise MessageFormatError(
            f"message {message.message_id} ({message.role}) was not written through ChatkeepSession: this session "
            "also holds chatkeep's own messages; give the Agents SDK a session id of its own"
        )
    return item


def sendable_window(items: Sequence[dict[str, Any]], *, before: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The longest suffix of a cut history that the Responses API accepts as the start of an input.

    ``items`` are the newest items of a longer history and ``before`` the item just older than them. The
    suffix starts past every item whose partner fell outside it: a tool output whose call is older than the
    start, and the item a reasoning item outside the window was emitted with (the API refuses an item whose
    required reasoning item is missing). It stays contiguous, so the SDK sees a true tail of its history.
    """
    calls: dict[str, int] = {}
    outputs: list[tuple[int, str]] = []
    for index, item in enumerate(items):
        made, answered = _links(item)
        if made is not None:
            calls.setdefault(made, index)
        if answered is not None:
            outputs.append((index, answered))
    start = 0
    while True:
        moved = start
        previous = items[moved - 1] if moved > 0 else before
        follows_reasoning = previous is not None and previous.get("type") == "reasoning"
        if follows_reasoning and moved < len(items) and items[moved].get("type") != "reasoning":
            moved += 1
        for index, answered in outputs:
            if index >= moved and calls.get(answered, -1) < moved:
                moved = index + 1
        if moved == start:
            return list(items[start:])
        start = moved
