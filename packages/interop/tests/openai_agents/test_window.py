"""The window rule: a cut history never starts with an item whose partner fell outside it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
from agents import TResponseInputItem

from chatkeep.interop.openai_agents import ChatkeepSession
from chatkeep.interop.openai_agents._items import sendable_window

SessionFactory = Callable[..., Awaitable[ChatkeepSession]]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def answer(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def call(call_id: str, kind: str = "function_call") -> dict[str, Any]:
    return {"type": kind, "call_id": call_id, "name": "tool", "arguments": "{}"}


def output(call_id: str, kind: str = "function_call_output") -> dict[str, Any]:
    return {"type": kind, "call_id": call_id, "output": "done"}


def reasoning(n: int) -> dict[str, Any]:
    return {"type": "reasoning", "id": f"rs_{n}", "summary": [], "encrypted_content": "opaque"}


# A weather question answered with two parallel tool calls, then a follow-up answered with one.
HISTORY = [
    user("weather in Paris and Rome?"),
    reasoning(1),
    call("c1"),
    call("c2"),
    output("c1"),
    output("c2"),
    answer("Sunny in both."),
    user("and tomorrow?"),
    reasoning(2),
    call("c3"),
    output("c3"),
    answer("Rain."),
]


def window(last: int) -> list[dict[str, Any]]:
    """What a session with ``HISTORY`` returns for ``get_items(limit=last)``."""
    cut = len(HISTORY) - last
    return sendable_window(HISTORY[cut:], before=HISTORY[cut - 1])


@pytest.mark.parametrize(
    ("last", "expected"),
    [
        (1, HISTORY[-1:]),  # the answer alone
        (2, HISTORY[-1:]),  # the output of c3 without c3: dropped
        (3, HISTORY[-1:]),  # c3's reasoning is outside: c3 goes, and then its output
        (4, HISTORY[-4:]),  # reasoning, c3, output, answer
        (5, HISTORY[-5:]),  # from the user's follow-up
        (6, HISTORY[-6:]),  # from the first answer
        (7, HISTORY[-6:]),  # output of c2 whose call is outside: dropped
        (8, HISTORY[-6:]),  # output of c1 and c2, both calls outside
        (9, HISTORY[-6:]),  # c1's output answers a call outside; past it, c2's output has lost its call
        (10, HISTORY[-6:]),  # c1 follows a reasoning item that is outside: c1 goes, then both outputs
        (11, HISTORY[-11:]),  # the whole first response
    ],
)
def test_the_window_starts_where_every_item_has_its_partner(last: int, expected: list[dict[str, Any]]) -> None:
    assert window(last) == expected


def test_every_output_kind_of_the_responses_api_needs_its_call() -> None:
    kinds = [
        ("computer_call", "computer_call_output"),
        ("local_shell_call", "local_shell_call_output"),
        ("shell_call", "shell_call_output"),
        ("apply_patch_call", "apply_patch_call_output"),
        ("custom_tool_call", "custom_tool_call_output"),
        ("program", "program_output"),
        ("tool_search_call", "tool_search_output"),
        ("a_future_call", "a_future_call_output"),
    ]
    for call_kind, output_kind in kinds:
        items = [output("x", output_kind), call("y", call_kind), output("y", output_kind)]
        assert sendable_window(items, before=call("x", call_kind)) == items[1:], output_kind


def test_an_mcp_approval_response_needs_its_request() -> None:
    request = {"type": "mcp_approval_request", "id": "mcpr_1", "name": "t", "arguments": "{}", "server_label": "s"}
    response = {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}
    assert sendable_window([response, user("hi")], before=request) == [user("hi")]
    assert sendable_window([request, response], before=user("hi")) == [request, response]


def test_an_output_of_a_hosted_tool_names_no_call_and_stays() -> None:
    hosted = {"type": "tool_search_output", "call_id": None, "status": "completed", "tools": []}
    assert sendable_window([hosted, answer("ok")], before=user("find a tool")) == [hosted, answer("ok")]


def test_a_reasoning_item_at_the_start_is_kept_with_what_follows_it() -> None:
    items = [reasoning(2), call("c3"), output("c3")]
    assert sendable_window(items, before=reasoning(1)) == items


def test_a_window_that_needs_nothing_dropped_is_unchanged() -> None:
    assert sendable_window(HISTORY[1:], before=HISTORY[0]) == HISTORY[1:]
    assert sendable_window([], before=user("x")) == []


@pytest.mark.parametrize("last", range(1, len(HISTORY) + 1))
async def test_a_session_applies_the_rule_when_a_limit_cuts_the_history(
    make_session: SessionFactory, last: int
) -> None:
    session = await make_session()
    await session.add_items(cast(list[TResponseInputItem], HISTORY))
    expected = HISTORY[-last:] if last == len(HISTORY) else window(last)
    assert await session.get_items(limit=last) == expected
