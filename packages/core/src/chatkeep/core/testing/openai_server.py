"""A scripted, local OpenAI-compatible HTTP server for tests: the real ``openai`` package talks to it over loopback.

Example:
    ```python
    with FakeOpenAIServer() as server:
        server.reply_text("hello")
        client = OpenAIChatClient("fake-model", base_url=server.base_url)
        ...
        assert server.requests[0]["messages"][-1] == {"role": "user", "content": "hi"}
    ```

Only the standard library is used: a ``ThreadingHTTPServer`` on ``127.0.0.1`` (a free port) served from a
background thread. Every response closes its connection, so stopping the server never waits on an idle
keep-alive socket and leaves no socket behind.

Extending it (for example with the Responses API): register a handler with :meth:`FakeOpenAIServer.add_route`
(``"/v1/responses"``, ``"/v1/conversations/{conversation_id}/items"``...). A handler receives a
:class:`FakeRequest` and returns a :class:`FakeHTTPResponse`; it takes the next scripted reply with
:meth:`FakeOpenAIServer.next_reply` (text, tool calls and usage are API-neutral) and renders it in its own
wire format, the way :meth:`FakeOpenAIServer._chat_completions` does for Chat Completions.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "FakeFailure",
    "FakeHTTPResponse",
    "FakeOpenAIServer",
    "FakeReply",
    "FakeRequest",
    "FakeToolCall",
    "RouteHandler",
]

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
    """

    text: str = ""
    tool_calls: list[FakeToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: tuple[int, int] | None = None
    arguments_chunk_size: int = 5


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
    """

    status: int = 200
    json_body: Any = None
    events: Iterable[Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)


RouteHandler = Callable[[FakeRequest], FakeHTTPResponse]
_Action = FakeReply | FakeFailure | Callable[[dict[str, Any]], "FakeReply | FakeFailure | str"]


@dataclass
class _Scripted:
    action: _Action
    remaining: int | None  # None: answer every request until the script is cleared


@dataclass
class _Route:
    method: str
    pattern: re.Pattern[str]
    handler: RouteHandler


def _compile_path(template: str) -> re.Pattern[str]:
    parts = re.split(r"\{(\w+)\}", template)
    regex = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^/]+)" for i, p in enumerate(parts))
    return re.compile(f"^{regex}$")


def _error_body(message: str, error_type: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def _text_of(content: Any) -> str:
    """The text of a Chat Completions message ``content`` (a string or a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _count_words(text: str) -> int:
    return len(text.split())


class _Server(ThreadingHTTPServer):
    # Handler threads are joined on close, so nothing outlives the server.
    daemon_threads = False
    block_on_close = True

    def __init__(self, address: tuple[str, int], fake: FakeOpenAIServer) -> None:
        super().__init__(address, _Handler)
        self.fake = fake


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    timeout = 30  # a client that connects and never sends cannot hold the server's shutdown forever

    def do_GET(self) -> None:
        self.server.fake._handle(self)

    def do_POST(self) -> None:
        self.server.fake._handle(self)

    def do_DELETE(self) -> None:
        self.server.fake._handle(self)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output quiet


class FakeOpenAIServer:
    """A scripted OpenAI-compatible server on ``127.0.0.1``, for tests that drive the real ``openai`` package.

    It serves ``POST /v1/chat/completions`` (JSON, and SSE when ``stream`` is true, with the usage chunk when
    ``stream_options.include_usage`` is set). Replies are scripted in order with :meth:`reply_text`,
    :meth:`reply_tool_calls`, :meth:`reply_with` and :meth:`fail`; with nothing scripted it answers
    ``"You said: <last user text>"``. Like the real service it refuses (HTTP 400) a message with an unknown
    field, and an assistant ``tool_calls`` message not followed by a tool message for each call.

    Args:
        api_key: when set, requests without ``Authorization: Bearer <api_key>`` get HTTP 401.
        model: the model name it reports when a request names none.

    Attributes:
        requests: the parsed JSON body of every request received, in order (failed ones included).
        log: every request received, with method, path and headers.
    """

    def __init__(self, *, api_key: str | None = None, model: str = "fake-model") -> None:
        self.api_key = api_key
        self.model = model
        self.requests: list[Any] = []
        self.log: list[FakeRequest] = []
        self._lock = threading.Lock()
        self._script: deque[_Scripted] = deque()
        self._routes: list[_Route] = []
        self._ids = itertools.count(1)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.add_route("POST", "/v1/chat/completions", self._chat_completions)

    # -- life cycle -------------------------------------------------------------------------------------

    def start(self) -> FakeOpenAIServer:
        """Bind a free loopback port and serve from a background thread; returns ``self``."""
        if self._server is not None:
            raise RuntimeError("this FakeOpenAIServer is already running")
        self._server = _Server(("127.0.0.1", 0), self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="FakeOpenAIServer", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, wait for in-flight requests, and close the listening socket (idempotent)."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join()

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port the server listens on."""
        if self._server is None:
            raise RuntimeError("start the FakeOpenAIServer first (use it as a context manager or call start())")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """The URL to give an OpenAI client, ending with ``/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    # -- scripting --------------------------------------------------------------------------------------

    def reply_text(self, text: str, *, usage: tuple[int, int] | None = None, finish_reason: str | None = None) -> None:
        """Queue a plain text answer.

        Args:
            text: the assistant's text; streamed word by word.
            usage: ``(prompt_tokens, completion_tokens)`` to report instead of the word counts.
            finish_reason: the finish reason to report (default ``stop``).
        """
        self._push(FakeReply(text=text, usage=usage, finish_reason=finish_reason), 1)

    def reply_tool_calls(
        self,
        calls: Sequence[tuple[str, str, str]],
        *,
        text: str = "",
        usage: tuple[int, int] | None = None,
        arguments_chunk_size: int = 5,
    ) -> None:
        """Queue an answer that calls tools.

        Args:
            calls: ``(call_id, name, arguments_json)`` for each call, in order.
            text: assistant text sent with the calls.
            usage: ``(prompt_tokens, completion_tokens)`` to report instead of the word counts.
            arguments_chunk_size: when streamed, the size of the pieces each call's arguments are split into.
        """
        reply = FakeReply(
            text=text,
            tool_calls=[FakeToolCall(*c) for c in calls],
            usage=usage,
            arguments_chunk_size=arguments_chunk_size,
        )
        self._push(reply, 1)

    def reply_with(
        self, fn: Callable[[dict[str, Any]], FakeReply | FakeFailure | str], *, times: int | None = 1
    ) -> None:
        """Queue a function that makes the answer from the request body (a ``str`` return means a text reply).

        Args:
            fn: called with the parsed request JSON.
            times: how many requests it answers; ``None`` for every request until :meth:`clear_script`.
        """
        self._push(fn, times)

    def fail(
        self,
        status: int = 500,
        *,
        message: str | None = None,
        error_type: str | None = None,
        times: int | None = 1,
    ) -> None:
        """Queue an HTTP error answer.

        Errors carry ``retry-after-ms: 1`` so the ``openai`` package's automatic retries don't slow tests.

        Args:
            status: the HTTP status, e.g. 500, 401, 429.
            message: the error message (a default names the status).
            error_type: the OpenAI ``error.type`` (a default follows the status).
            times: how many requests fail; ``None`` for every request until :meth:`clear_script`.
        """
        default_type = {400: "invalid_request_error", 401: "invalid_request_error", 429: "rate_limit_exceeded"}
        failure = FakeFailure(
            status=status,
            message=message or f"fake failure (HTTP {status})",
            error_type=error_type or default_type.get(status, "server_error"),
        )
        self._push(failure, times)

    def clear_script(self) -> None:
        """Drop every queued reply and failure; the default echo answers from now on."""
        with self._lock:
            self._script.clear()

    def _push(self, action: _Action, times: int | None) -> None:
        if times is not None and times < 1:
            raise ValueError("times must be at least 1, or None for every request")
        with self._lock:
            self._script.append(_Scripted(action, times))

    def next_reply(self, body: dict[str, Any]) -> FakeReply | FakeFailure:
        """Take the next scripted answer for a request (the default echo when nothing is queued).

        Route handlers for other APIs call this, then render the reply in their own format.
        """
        with self._lock:
            entry = self._script[0] if self._script else None
            if entry is not None and entry.remaining is not None:
                entry.remaining -= 1
                if entry.remaining == 0:
                    self._script.popleft()
        if entry is None:
            return FakeReply(text=f"You said: {self._last_user_text(body)}")
        action = entry.action
        if isinstance(action, (FakeReply, FakeFailure)):
            return action
        result = action(body)
        return FakeReply(text=result) if isinstance(result, str) else result

    @staticmethod
    def _last_user_text(body: dict[str, Any]) -> str:
        for message in reversed(body.get("messages") or []):
            if isinstance(message, dict) and message.get("role") == "user":
                return _text_of(message.get("content"))
        return ""

    def new_id(self, prefix: str) -> str:
        """A deterministic id unique within this server: ``chatcmpl-fake-1``, ``resp-fake-2``..."""
        return f"{prefix}-fake-{next(self._ids)}"

    # -- routing ----------------------------------------------------------------------------------------

    def add_route(self, method: str, path: str, handler: RouteHandler) -> None:
        """Serve ``method path`` with ``handler``; ``path`` may hold ``{name}`` placeholders (one path segment).

        A later registration for the same method and path wins.
        """
        self._routes.insert(0, _Route(method.upper(), _compile_path(path), handler))

    def _handle(self, handler: _Handler) -> None:
        handler.close_connection = True
        url = urlsplit(handler.path)
        headers = {k.lower(): v for k, v in handler.headers.items()}
        length = int(headers.get("content-length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        request = FakeRequest(handler.command, url.path, parse_qs(url.query), headers, body)
        with self._lock:
            self.requests.append(body)
            self.log.append(request)
        try:
            response = self._dispatch(request)
        except Exception as exc:  # a bug in a handler or a reply_with function: tell the client, don't hang
            response = FakeHTTPResponse(500, _error_body(f"fake server error: {exc!r}", "server_error"))
        self._write(handler, response)

    def _dispatch(self, request: FakeRequest) -> FakeHTTPResponse:
        if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return FakeHTTPResponse(
                401, _error_body("Incorrect API key provided.", "invalid_request_error", code="invalid_api_key")
            )
        path_known = False
        for route in self._routes:
            match = route.pattern.match(request.path)
            if match is None:
                continue
            path_known = True
            if route.method == request.method:
                request.path_params = match.groupdict()
                return route.handler(request)
        if path_known:
            return FakeHTTPResponse(405, _error_body(f"{request.method} is not allowed here", "invalid_request_error"))
        return FakeHTTPResponse(
            404, _error_body(f"Invalid URL ({request.method} {request.path})", "invalid_request_error")
        )

    @staticmethod
    def _write(handler: _Handler, response: FakeHTTPResponse) -> None:
        try:
            handler.send_response(response.status)
            for name, value in response.headers.items():
                handler.send_header(name, value)
            handler.send_header("Connection", "close")
            if response.events is None:
                data = json.dumps(response.json_body).encode()
                handler.send_header("Content-Type", "application/json")
                handler.send_header("Content-Length", str(len(data)))
                handler.end_headers()
                handler.wfile.write(data)
                return
            # A real stream: chunked transfer encoding, one chunk per event, flushed as it is made.
            handler.send_header("Content-Type", "text/event-stream; charset=utf-8")
            handler.send_header("Cache-Control", "no-cache")
            handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            for event in response.events:
                payload = event if isinstance(event, str) else json.dumps(event)
                data = f"data: {payload}\n\n".encode()
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                handler.wfile.flush()
            handler.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away mid-answer (a cancelled stream); nothing to tell it

    # -- Chat Completions -------------------------------------------------------------------------------

    def _chat_completions(self, request: FakeRequest) -> FakeHTTPResponse:
        body = request.body
        problem = self._check_chat_request(body)
        if problem is not None:
            return FakeHTTPResponse(400, _error_body(problem, "invalid_request_error"))
        reply = self.next_reply(body)
        if isinstance(reply, FakeFailure):
            return FakeHTTPResponse(
                reply.status, _error_body(reply.message, reply.error_type), headers={"retry-after-ms": "1"}
            )
        completion_id = self.new_id("chatcmpl")
        created = int(time.time())
        model = body.get("model") or self.model
        prompt_tokens, completion_tokens = reply.usage or (
            sum(_count_words(_text_of(m.get("content"))) for m in body["messages"]),
            _count_words(reply.text) + sum(_count_words(c.arguments) for c in reply.tool_calls),
        )
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        finish_reason = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            events = self._chat_chunks(completion_id, created, model, reply, finish_reason, usage, include_usage)
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

    @staticmethod
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

    @staticmethod
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
