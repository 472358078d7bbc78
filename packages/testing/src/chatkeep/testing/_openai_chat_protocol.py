"""The Chat Completions protocol of :class:`~chatkeep.testing.openai_server.FakeOpenAIServer`.

``POST /v1/chat/completions``: a JSON completion, or SSE chunks when ``stream`` is true (with the usage chunk
when ``stream_options.include_usage`` is set). Requests the real service would refuse get HTTP 400.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ._openai_fake_types import FakeFailure, FakeHTTPResponse, FakeReply, FakeRequest, count_words, error_body, text_of

__all__ = ["ChatCompletionsRoutes"]

_CHAT_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
# The fields the Chat Completions API accepts on a message; the real service refuses any other key.
_MESSAGE_FIELDS = {
    "system": {"role", "content", "name"},
    "developer": {"role", "content", "name"},
    "user": {"role", "content", "name"},
    "assistant": {"role", "content", "name", "tool_calls", "refusal", "audio", "function_call"},
    "tool": {"role", "content", "tool_call_id"},
    "function": {"role", "content", "name"},
}


class ChatCompletionsRoutes:
    """A mixin for the fake server: the ``POST /v1/chat/completions`` route handler.

    The class it is mixed into provides the model name, the script (:meth:`next_reply`) and the ids
    (:meth:`new_id`), and registers :meth:`_chat_completions` as a route.

    Attributes:
        model: the model name reported when a request names none.
    """

    model: str

    if TYPE_CHECKING:

        def next_reply(self, body: dict[str, Any]) -> FakeReply | FakeFailure: ...

        def new_id(self, prefix: str) -> str: ...

    def _chat_completions(self, request: FakeRequest) -> FakeHTTPResponse:
        body = request.body
        problem = _check_chat_request(body)
        if problem is not None:
            return FakeHTTPResponse(400, error_body(problem, "invalid_request_error"))
        reply = self.next_reply(body)
        if isinstance(reply, FakeFailure):
            return FakeHTTPResponse(
                reply.status, error_body(reply.message, reply.error_type), headers={"retry-after-ms": "1"}
            )
        completion_id = self.new_id("chatcmpl")
        created = int(time.time())
        model = body.get("model") or self.model
        prompt_tokens, completion_tokens = reply.usage or (
            sum(count_words(text_of(m.get("content"))) for m in body["messages"]),
            count_words(reply.text) + sum(count_words(c.arguments) for c in reply.tool_calls),
        )
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        finish_reason = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            events = _chat_chunks(completion_id, created, model, reply, finish_reason, usage, include_usage)
            return FakeHTTPResponse(events=events)
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None, "refusal": None}
        if reply.tool_calls:
            message["tool_calls"] = [
                {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in reply.tool_calls
            ]
        completion = {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
            "usage": usage,
        }
        return FakeHTTPResponse(json_body=completion)


def _chat_chunks(
    completion_id: str,
    created: int,
    model: str,
    reply: FakeReply,
    finish_reason: str,
    usage: dict[str, int],
    include_usage: bool,
) -> Iterator[Any]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        value: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
        if include_usage:
            value["usage"] = None
        return value

    yield chunk({"role": "assistant", "content": ""})
    for piece in re.findall(r"\s*\S+\s*|\s+", reply.text):
        yield chunk({"content": piece})
    size = max(1, reply.arguments_chunk_size)
    for index, call in enumerate(reply.tool_calls):
        head = {"index": index, "id": call.call_id, "type": "function"}
        yield chunk({"tool_calls": [{**head, "function": {"name": call.name, "arguments": ""}}]})
        for start in range(0, len(call.arguments), size):
            piece = call.arguments[start : start + size]
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, finish_reason)
    if include_usage:
        yield {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage,
        }
    yield "[DONE]"


def _check_chat_request(body: Any) -> str | None:
    """What the real service would refuse in a Chat Completions request, or ``None``."""
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    if not body.get("model"):
        return "you must provide a model parameter"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    pending: list[str] = []  # tool call ids that still need a tool message
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _CHAT_ROLES:
            return f"messages[{i}] has an invalid role"
        role = message["role"]
        extra = set(message) - _MESSAGE_FIELDS[role]
        if extra:
            return f"messages[{i}]: additional properties are not allowed ({', '.join(sorted(extra))} unexpected)"
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in pending:
                return (
                    f"messages[{i}]: a message with role 'tool' must be a response to a preceding message "
                    f"with 'tool_calls' (tool_call_id {call_id!r} was not requested)"
                )
            pending.remove(call_id)
            continue
        if pending:
            return (
                "an assistant message with 'tool_calls' must be followed by tool messages responding to each "
                f"'tool_call_id'; missing: {', '.join(pending)}"
            )
        if role == "assistant" and message.get("tool_calls"):
            pending = [c.get("id") for c in message["tool_calls"]]
        elif "content" not in message:
            return f"messages[{i}] is missing 'content'"
    if pending:
        return (
            "an assistant message with 'tool_calls' must be followed by tool messages responding to each "
            f"'tool_call_id'; missing: {', '.join(pending)}"
        )
    return None
