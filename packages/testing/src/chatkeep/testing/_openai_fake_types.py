"""The value types :class:`~chatkeep.testing.openai_server.FakeOpenAIServer` is scripted and extended with.

They are re-exported by :mod:`chatkeep.testing.openai_server`, the import path to use; the protocol
modules share them (and the small helpers below) without importing the server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = [
    "FakeFailure",
    "FakeHTTPResponse",
    "FakeReply",
    "FakeRequest",
    "FakeToolCall",
    "RouteHandler",
    "count_words",
    "error_body",
    "text_of",
]


class FakeToolCall(NamedTuple):
    """A tool call the fake model makes: ``("call_1", "get_weather", '{"city":"Oslo"}')``."""

    call_id: str
    name: str
    arguments: str


@dataclass
class FakeReply:
    """What the fake model answers, independent of the API it is rendered in.

    Attributes:
        text: the assistant text (may be empty).
        tool_calls: the tool calls the model makes.
        finish_reason: ``stop``, ``tool_calls``, ``length``...; by default ``tool_calls`` when there are calls.
        usage: ``(prompt_tokens, completion_tokens)``; by default counted as words of the request and the reply.
        arguments_chunk_size: when streaming, each tool call's arguments are split into pieces of this many
            characters, one chunk each, so a client must reassemble them.
        reasoning: a reasoning summary. When set, a Responses answer starts with a reasoning item (with an
            opaque ``encrypted_content``) that the items after it require, as a reasoning model's do; Chat
            Completions leaves it out.
    """

    text: str = ""
    tool_calls: list[FakeToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: tuple[int, int] | None = None
    arguments_chunk_size: int = 5
    reasoning: str = ""


@dataclass
class FakeFailure:
    """An HTTP error the fake answers with, in the OpenAI error format.

    Attributes:
        status: the HTTP status (500, 401, 429...).
        message: the error message.
        error_type: the ``error.type`` field.
    """

    status: int = 500
    message: str = "The server had an error while processing your request."
    error_type: str = "server_error"


@dataclass
class FakeRequest:
    """A request the server received.

    Attributes:
        method: ``GET``, ``POST``, ``DELETE``...
        path: the URL path, without the query string.
        query: the query parameters.
        headers: the request headers (names in lower case).
        body: the parsed JSON body, or ``None`` when there was none.
        path_params: the values of the ``{name}`` placeholders of the matched route.
    """

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any
    path_params: dict[str, str] = field(default_factory=dict)


@dataclass
class FakeHTTPResponse:
    """A response a route handler returns: a JSON document, or a stream of server-sent events.

    Attributes:
        status: the HTTP status.
        json_body: the JSON document (for a non-streamed response).
        events: the SSE ``data`` payloads (JSON values, or strings such as ``"[DONE]"``), for a streamed response.
        headers: extra response headers.
        named_events: send each event's ``type`` as its SSE ``event:`` name too, as the Responses API does.
    """

    status: int = 200
    json_body: Any = None
    events: Iterable[Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    named_events: bool = False


RouteHandler = Callable[[FakeRequest], FakeHTTPResponse]


def error_body(message: str, error_type: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """An error document in the OpenAI format.

    Args:
        message: the ``error.message`` field.
        error_type: the ``error.type`` field.
        code: the ``error.code`` field.
        param: the ``error.param`` field (the request parameter at fault).

    Returns:
        ``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}``.
    """
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def text_of(content: Any) -> str:
    """The text of a message's ``content`` (a string or a list of Chat Completions or Responses parts).

    Args:
        content: the ``content`` value of a message or input item.

    Returns:
        Its text parts joined, or ``""`` for anything else.
    """
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "")
            for p in content
            if isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text")
        )
    return ""


def count_words(text: str) -> int:
    """The fake's token count of ``text``: its whitespace-separated words.

    Args:
        text: the text to count.

    Returns:
        The number of words.
    """
    return len(text.split())
