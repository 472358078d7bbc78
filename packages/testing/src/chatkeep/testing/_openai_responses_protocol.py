"""The Responses and Conversations protocols of :class:`~chatkeep.testing.openai_server.FakeOpenAIServer`.

``POST /v1/responses`` (JSON, or SSE events when ``stream`` is true), ``GET /v1/responses/{id}``,
``POST /v1/conversations``, ``GET /v1/conversations/{id}`` and ``GET /v1/conversations/{id}/items``, with the
service's state kept in memory: stored responses chain through ``previous_response_id``, and a response made
with ``conversation=`` appends its input and output items to that conversation. A scripted reply with reasoning
starts with a reasoning item, which the items after it then require whenever they are sent back by id.
"""

from __future__ import annotations

import base64
import itertools
import re
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._openai_fake_types import FakeFailure, FakeHTTPResponse, FakeReply, FakeRequest, count_words, error_body, text_of

__all__ = ["ResponsesRoutes", "StoredResponse"]


@dataclass
class StoredResponse:
    """A response the fake service stored (one made with ``store: false`` is not).

    Attributes:
        body: the response as the service returned it.
        context: every item the model saw, then its output, as input items.
    """

    body: dict[str, Any]
    context: list[dict[str, Any]]


class ResponsesRoutes:
    """A mixin for the fake server: the Responses and Conversations route handlers and their state.

    The class it is mixed into provides the model name, the script (:meth:`next_reply`), the lock, the id
    counter and the state containers (set in its ``__init__``), and registers the handlers as routes.

    Attributes:
        model: the model name reported when a request names none.
        seen_inputs: for each Responses call the model answered, the input items it effectively saw.
    """

    model: str
    seen_inputs: list[list[dict[str, Any]]]
    _lock: threading.Lock
    _ids: itertools.count[int]
    _responses: dict[str, StoredResponse]
    _conversations: dict[str, list[tuple[str, dict[str, Any]]]]
    _reasoning: dict[str, str]  # a reasoning item's id -> the encrypted content the service issued with it
    _requires_reasoning: dict[str, str]  # an output item's id -> the reasoning item it was emitted with

    if TYPE_CHECKING:

        def next_reply(self, body: dict[str, Any]) -> FakeReply | FakeFailure: ...

    def conversation_items(self, conversation_id: str) -> list[dict[str, Any]]:
        """The items a conversation holds, oldest first, as input items (without their ids).

        Args:
            conversation_id: the conversation's id (``conv_...``).

        Returns:
            Copies of its items.

        Raises:
            KeyError: there is no such conversation.
        """
        with self._lock:
            return [dict(item) for _, item in self._conversations[conversation_id]]

    def stored_response(self, response_id: str) -> dict[str, Any] | None:
        """The stored response with this id as the service returned it, or ``None`` (unknown, or ``store: false``).

        Args:
            response_id: the response's id (``resp_...``).

        Returns:
            The response body, or ``None``.
        """
        with self._lock:
            stored = self._responses.get(response_id)
        return None if stored is None else stored.body

    def _create_response(self, request: FakeRequest) -> FakeHTTPResponse:
        body = request.body
        problem = _check_responses_request(body)
        if problem is not None:
            return FakeHTTPResponse(400, error_body(problem, "invalid_request_error"))
        with self._lock:
            problem = self._check_reasoning(body.get("input"))
        if problem is not None:
            return FakeHTTPResponse(400, error_body(problem, "invalid_request_error", param="input"))
        new_input = _input_items(body["input"]) if "input" in body else []
        previous_id = body.get("previous_response_id")
        conversation = body.get("conversation")
        conversation_id = conversation.get("id") if isinstance(conversation, dict) else conversation
        with self._lock:
            if previous_id and conversation_id:
                return FakeHTTPResponse(
                    400,
                    error_body(
                        "Mutually exclusive parameters: Ensure you are only providing one of: 'previous_response_id' "
                        "or 'conversation'.",
                        "invalid_request_error",
                        code="mutually_exclusive_parameters",
                    ),
                )
            history: list[dict[str, Any]] = []
            if previous_id:
                previous = self._responses.get(previous_id)
                if previous is None:
                    return FakeHTTPResponse(
                        400,
                        error_body(
                            f"Previous response with id '{previous_id}' not found.",
                            "invalid_request_error",
                            code="previous_response_not_found",
                            param="previous_response_id",
                        ),
                    )
                history = previous.context
            elif conversation_id:
                if conversation_id not in self._conversations:
                    return _conversation_not_found(conversation_id)
                history = [item for _, item in self._conversations[conversation_id]]
        context = [*history, *new_input]
        problem = _check_function_calls(context)
        if problem is not None:
            return FakeHTTPResponse(400, error_body(problem, "invalid_request_error", param="input"))
        reply = self.next_reply(body)
        if isinstance(reply, FakeFailure):
            return FakeHTTPResponse(
                reply.status, error_body(reply.message, reply.error_type), headers={"retry-after-ms": "1"}
            )
        response_id = f"resp_{self._object_id()}"
        output = self._output_items(reply)
        reasoning_tokens = count_words(reply.reasoning)
        input_tokens, output_tokens = reply.usage or (
            sum(count_words(_item_text(item)) for item in context),
            count_words(reply.text) + sum(count_words(c.arguments) for c in reply.tool_calls) + reasoning_tokens,
        )
        usage = {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": input_tokens + output_tokens,
        }
        incomplete = reply.finish_reason == "length"
        response = {
            "id": response_id,
            "object": "response",
            "created_at": int(time.time()),
            "status": "incomplete" if incomplete else "completed",
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": body.get("model") or self.model,
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": previous_id,
            "conversation": {"id": conversation_id} if conversation_id else None,
            "reasoning": {"effort": None, "summary": None},
            "store": body.get("store", True) is not False,
            "temperature": body.get("temperature", 1.0),
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": body.get("tools") or [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
            "metadata": {},
        }
        produced = [_input_form(item) for item in output]
        with self._lock:
            self.seen_inputs.append(context)
            if response["store"]:
                self._responses[response_id] = StoredResponse(response, [*context, *produced])
            if conversation_id:
                self._conversations[conversation_id].extend(
                    (item.get("id") or f"item_{self._object_id()}", item) for item in [*new_input, *produced]
                )
        if body.get("stream"):
            return FakeHTTPResponse(events=_response_events(response, reply), named_events=True)
        return FakeHTTPResponse(json_body=response)

    def _check_reasoning(self, value: Any) -> str | None:
        """What the service refuses about reasoning items in a request's input (under the lock), or ``None``.

        An item a reasoning item was emitted with, sent back by its id, needs that reasoning item before it; a
        reasoning item sent back needs the encrypted content it was issued with, unchanged.
        """
        if not isinstance(value, list):
            return None
        sent: set[str] = set()
        for item in value:
            item_id = item.get("id") if isinstance(item, dict) else None
            if not isinstance(item_id, str):
                continue
            if item.get("type") == "reasoning":
                issued = self._reasoning.get(item_id)
                if issued is not None and item.get("encrypted_content", issued) != issued:
                    return f"The encrypted content for item {item_id} could not be verified."
                sent.add(item_id)
                continue
            required = self._requires_reasoning.get(item_id)
            if required is not None and required not in sent:
                return (
                    f"Item '{item_id}' of type '{item.get('type', 'message')}' was provided without its required "
                    f"'reasoning' item: '{required}'."
                )
        return None

    def _output_items(self, reply: FakeReply) -> list[dict[str, Any]]:
        output: list[dict[str, Any]] = []
        reasoning_id = ""
        if reply.reasoning:
            reasoning_id = f"rs_{self._object_id()}"
            encrypted = base64.b64encode(f"fake reasoning {reasoning_id}: {reply.reasoning}".encode()).decode()
            output.append(
                {
                    "type": "reasoning",
                    "id": reasoning_id,
                    "summary": [{"type": "summary_text", "text": reply.reasoning}],
                    "encrypted_content": encrypted,
                }
            )
        if reply.text:
            output.append(
                {
                    "type": "message",
                    "id": f"msg_{self._object_id()}",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": reply.text, "annotations": [], "logprobs": []}],
                }
            )
        output.extend(
            {
                "type": "function_call",
                "id": f"fc_{self._object_id()}",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
                "status": "completed",
            }
            for call in reply.tool_calls
        )
        if reasoning_id:
            with self._lock:
                self._reasoning[reasoning_id] = output[0]["encrypted_content"]
                self._requires_reasoning.update((item["id"], reasoning_id) for item in output[1:])
        return output

    def _object_id(self) -> str:
        # The service's ids are a prefix, "_", and an opaque token; clients tell resp_ from conv_ by the prefix.
        return f"fake{next(self._ids):06d}"

    def _get_response(self, request: FakeRequest) -> FakeHTTPResponse:
        response_id = request.path_params["response_id"]
        stored = self.stored_response(response_id)
        if stored is None:
            return FakeHTTPResponse(
                404, error_body(f"Response with id '{response_id}' not found.", "invalid_request_error")
            )
        return FakeHTTPResponse(json_body=stored)

    def _create_conversation(self, request: FakeRequest) -> FakeHTTPResponse:
        body = request.body if isinstance(request.body, dict) else {}
        items = _input_items(body.get("items") or [])
        conversation_id = f"conv_{self._object_id()}"
        conversation = {
            "id": conversation_id,
            "object": "conversation",
            "created_at": int(time.time()),
            "metadata": body.get("metadata") or {},
        }
        with self._lock:
            self._conversations[conversation_id] = [(f"item_{self._object_id()}", item) for item in items]
        return FakeHTTPResponse(json_body=conversation)

    def _get_conversation(self, request: FakeRequest) -> FakeHTTPResponse:
        conversation_id = request.path_params["conversation_id"]
        with self._lock:
            known = conversation_id in self._conversations
        if not known:
            return _conversation_not_found(conversation_id)
        return FakeHTTPResponse(
            json_body={"id": conversation_id, "object": "conversation", "created_at": 0, "metadata": {}}
        )

    def _list_conversation_items(self, request: FakeRequest) -> FakeHTTPResponse:
        conversation_id = request.path_params["conversation_id"]
        with self._lock:
            entries = list(self._conversations.get(conversation_id, ()))
            known = conversation_id in self._conversations
        if not known:
            return _conversation_not_found(conversation_id)
        if (request.query.get("order") or ["desc"])[0] == "desc":
            entries.reverse()
        after = request.query.get("after", [""])[0]
        if after:
            ids = [item_id for item_id, _ in entries]
            entries = entries[ids.index(after) + 1 :] if after in ids else []
        limit = int((request.query.get("limit") or ["20"])[0])
        page = entries[:limit]
        data = [_conversation_item(item_id, item) for item_id, item in page]
        return FakeHTTPResponse(
            json_body={
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": len(entries) > limit,
            }
        )


# The fields the Responses API accepts on each kind of input item; the real service refuses any other key.
_ITEM_FIELDS = {
    "message": {"type", "role", "content", "id", "status", "phase"},
    "function_call": {"type", "call_id", "name", "arguments", "id", "status"},
    "function_call_output": {"type", "call_id", "output", "id", "status"},
    "reasoning": {"type", "id", "summary", "encrypted_content", "content", "status"},
}
_INPUT_ROLES = {"user", "assistant", "system", "developer"}


def _conversation_not_found(conversation_id: str) -> FakeHTTPResponse:
    return FakeHTTPResponse(
        404, error_body(f"Conversation with id '{conversation_id}' not found.", "invalid_request_error")
    )


def _input_items(value: Any) -> list[dict[str, Any]]:
    """Request input as a list of input items (a string is one user message; a bare message gets its type)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    items = []
    for item in value:
        copy = dict(item)
        copy.setdefault("type", "message")
        copy.pop("id", None)
        copy.pop("status", None)
        items.append(copy)
    return items


def _input_form(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as the input item that repeats it (what a chained request's context holds)."""
    if item["type"] == "message":
        return {"type": "message", "role": "assistant", "content": text_of(item["content"])}
    return {k: v for k, v in item.items() if k not in ("id", "status")}


def _item_text(item: dict[str, Any]) -> str:
    if item.get("type") == "message":
        return text_of(item.get("content"))
    return str(item.get("arguments") or item.get("output") or "")


def _conversation_item(item_id: str, item: dict[str, Any]) -> dict[str, Any]:
    """An input item as the Conversations API lists it: with its id, a status, and content as parts."""
    listed = {**item, "id": item_id, "status": "completed"}
    if item["type"] == "message" and isinstance(item.get("content"), str):
        if item["role"] == "assistant":
            part = {"type": "output_text", "text": item["content"], "annotations": [], "logprobs": []}
        else:
            part = {"type": "input_text", "text": item["content"]}
        listed["content"] = [part]
    return listed


def _check_responses_request(body: Any) -> str | None:
    """What the real service would refuse in the shape of a Responses request, or ``None``."""
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    if not body.get("model"):
        return "Missing required parameter: 'model'."
    value = body.get("input")
    if value is None or isinstance(value, str):
        return None
    if not isinstance(value, list):
        return "Invalid type for 'input': expected a string or an array of input items."
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            return f"Invalid type for 'input[{i}]': expected an object."
        kind = item.get("type", "message")
        allowed = _ITEM_FIELDS.get(kind)
        if allowed is None:
            return f"Invalid value for 'input[{i}].type': {kind!r} is not a supported input item type."
        extra = set(item) - allowed
        if extra:
            return f"Unknown parameter: 'input[{i}].{sorted(extra)[0]}'."
        if kind == "message" and (item.get("role") not in _INPUT_ROLES or "content" not in item):
            return f"Invalid 'input[{i}]': a message needs a role ({', '.join(sorted(_INPUT_ROLES))}) and content."
        if kind == "reasoning" and not isinstance(item.get("summary"), list):
            return f"Missing required parameter: 'input[{i}].summary'."
        if kind not in ("message", "reasoning") and not item.get("call_id"):
            return f"Missing required parameter: 'input[{i}].call_id'."
    return None


def _check_function_calls(context: list[dict[str, Any]]) -> str | None:
    """Every function call output answers an earlier call, and every call has its output (as the service checks)."""
    pending: list[str] = []
    for item in context:
        if item["type"] == "function_call":
            pending.append(item["call_id"])
        elif item["type"] == "function_call_output":
            if item["call_id"] not in pending:
                return f"No tool call found for function call output with call_id {item['call_id']}."
            pending.remove(item["call_id"])
    if pending:
        return f"No tool output found for function call {pending[0]}."
    return None


def _response_events(response: dict[str, Any], reply: FakeReply) -> list[dict[str, Any]]:
    """The SSE events of a streamed response, in the service's order, with arguments split across deltas."""
    sequence = itertools.count()
    events: list[dict[str, Any]] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": next(sequence), **fields})

    started = {**response, "status": "in_progress", "output": [], "usage": None}
    emit("response.created", response=started)
    emit("response.in_progress", response=started)
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            part = item["content"][0]
            emit(
                "response.output_item.added", output_index=index, item={**item, "status": "in_progress", "content": []}
            )
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            emit("response.content_part.added", **where, part={**part, "text": ""})
            for piece in re.findall(r"\s*\S+\s*|\s+", part["text"]):
                emit("response.output_text.delta", **where, delta=piece, logprobs=[])
            emit("response.output_text.done", **where, text=part["text"], logprobs=[])
            emit("response.content_part.done", **where, part=part)
        elif item["type"] == "reasoning":
            emit("response.output_item.added", output_index=index, item={**item, "summary": []})
        else:
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            size = max(1, reply.arguments_chunk_size)
            for start in range(0, len(item["arguments"]), size):
                piece = item["arguments"][start : start + size]
                emit("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=piece)
            emit(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=item["arguments"],
            )
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.incomplete" if response["status"] == "incomplete" else "response.completed", response=response)
    return events
