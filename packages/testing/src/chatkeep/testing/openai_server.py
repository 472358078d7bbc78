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

It speaks Chat Completions and the Responses and Conversations protocols (``previous_response_id``
chaining, ``conversation=``, streaming events); the scripted replies are API-neutral and answer both.

Extending it: register a handler with :meth:`FakeOpenAIServer.add_route`. A handler receives a
:class:`FakeRequest` and returns a :class:`FakeHTTPResponse`; it takes the next scripted reply with
:meth:`FakeOpenAIServer.next_reply` (text, tool calls and usage are API-neutral) and renders it in its own
wire format, the way :meth:`FakeOpenAIServer._chat_completions` does for Chat Completions.

This module holds the server's life cycle, scripting and routing; the protocols' route handlers are mixins
in ``_openai_chat_protocol`` and ``_openai_responses_protocol``, and the value types re-exported here live in
``_openai_fake_types``.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ._openai_chat_protocol import ChatCompletionsRoutes
from ._openai_embeddings_protocol import EmbeddingsRoutes
from ._openai_fake_types import (
    FakeFailure,
    FakeHTTPResponse,
    FakeReply,
    FakeRequest,
    FakeToolCall,
    RouteHandler,
    error_body,
    text_of,
)
from ._openai_responses_protocol import ResponsesRoutes, StoredResponse

__all__ = [
    "FakeFailure",
    "FakeHTTPResponse",
    "FakeOpenAIServer",
    "FakeReply",
    "FakeRequest",
    "FakeToolCall",
    "RouteHandler",
]

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


class FakeOpenAIServer(ChatCompletionsRoutes, ResponsesRoutes, EmbeddingsRoutes):
    """A scripted OpenAI-compatible server on ``127.0.0.1``, for tests that drive the real ``openai`` package.

    It serves ``POST /v1/chat/completions`` (JSON, and SSE when ``stream`` is true, with the usage chunk when
    ``stream_options.include_usage`` is set). Replies are scripted in order with :meth:`reply_text`,
    :meth:`reply_tool_calls`, :meth:`reply_with` and :meth:`fail`; with nothing scripted it answers
    ``"You said: <last user text>"``. Like the real service it refuses (HTTP 400) a message with an unknown
    field, and an assistant ``tool_calls`` message not followed by a tool message for each call.

    ``POST /v1/embeddings`` answers each input with a deterministic vector (words hashed, salted with the model's
    name; 64 dimensions unless the request asks for ``dimensions``), as floats or base64.

    It also serves the Responses API (``POST /v1/responses``, JSON or SSE events; ``GET /v1/responses/{id}``)
    and Conversations (``POST /v1/conversations``, ``GET /v1/conversations/{id}`` and ``.../items``), keeping
    state in memory like the service: a stored response continues with ``previous_response_id`` (one made with
    ``store: false`` cannot be found), and a response made with ``conversation=`` appends its input and output
    items to that conversation. Like the service it refuses (HTTP 400) an unknown previous response, both
    ``previous_response_id`` and ``conversation`` at once, a function call output without its call, and a
    function call left without an output; an unknown conversation is HTTP 404.

    Args:
        api_key: when set, requests without ``Authorization: Bearer <api_key>`` get HTTP 401.
        model: the model name it reports when a request names none.

    Attributes:
        requests: the parsed JSON body of every request received, in order (failed ones included).
        log: every request received, with method, path and headers.
        seen_inputs: for each Responses call the model answered, in order, the input items it effectively saw:
            the chained history (of the previous response or the conversation) followed by the request's own
            input, as input items (``{"type": "message", "role": ..., "content": ...}``, ``function_call``,
            ``function_call_output``); instructions are not items. Tests use it to prove that the model never
            sees a message twice.
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
        self.seen_inputs: list[list[dict[str, Any]]] = []
        self._responses: dict[str, StoredResponse] = {}
        self._conversations: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        self._reasoning: dict[str, str] = {}
        self._requires_reasoning: dict[str, str] = {}
        self.add_route("POST", "/v1/chat/completions", self._chat_completions)
        self.add_route("POST", "/v1/embeddings", self._embeddings)
        self.add_route("POST", "/v1/responses", self._create_response)
        self.add_route("GET", "/v1/responses/{response_id}", self._get_response)
        self.add_route("POST", "/v1/conversations", self._create_conversation)
        self.add_route("GET", "/v1/conversations/{conversation_id}", self._get_conversation)
        self.add_route("GET", "/v1/conversations/{conversation_id}/items", self._list_conversation_items)

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

    def reply_text(
        self,
        text: str,
        *,
        usage: tuple[int, int] | None = None,
        finish_reason: str | None = None,
        reasoning: str = "",
    ) -> None:
        """Queue a plain text answer.

        Args:
            text: the assistant's text; streamed word by word.
            usage: ``(prompt_tokens, completion_tokens)`` to report instead of the word counts.
            finish_reason: the finish reason to report (default ``stop``).
            reasoning: a reasoning summary: the Responses answer starts with a reasoning item (see :class:`FakeReply`).
        """
        self._push(FakeReply(text=text, usage=usage, finish_reason=finish_reason, reasoning=reasoning), 1)

    def reply_tool_calls(
        self,
        calls: Sequence[tuple[str, str, str]],
        *,
        text: str = "",
        usage: tuple[int, int] | None = None,
        arguments_chunk_size: int = 5,
        reasoning: str = "",
    ) -> None:
        """Queue an answer that calls tools.

        Args:
            calls: ``(call_id, name, arguments_json)`` for each call, in order.
            text: assistant text sent with the calls.
            usage: ``(prompt_tokens, completion_tokens)`` to report instead of the word counts.
            arguments_chunk_size: when streamed, the size of the pieces each call's arguments are split into.
            reasoning: a reasoning summary: the Responses answer starts with a reasoning item (see :class:`FakeReply`).
        """
        reply = FakeReply(
            text=text,
            tool_calls=[FakeToolCall(*c) for c in calls],
            usage=usage,
            arguments_chunk_size=arguments_chunk_size,
            reasoning=reasoning,
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

        Args:
            body: the request's parsed JSON body (given to a :meth:`reply_with` function; the echo reads it).

        Returns:
            The reply to render, or the failure to answer with.
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
        items = body.get("input")
        if isinstance(items, str):
            return items
        for message in reversed(body.get("messages") or (items if isinstance(items, list) else [])):
            if isinstance(message, dict) and message.get("role") == "user":
                return text_of(message.get("content"))
        return ""

    def new_id(self, prefix: str) -> str:
        """A deterministic id unique within this server: ``chatcmpl-fake-1``, ``resp-fake-2``...

        Args:
            prefix: the id's prefix, such as ``chatcmpl``.

        Returns:
            ``<prefix>-fake-<n>``.
        """
        return f"{prefix}-fake-{next(self._ids)}"

    # -- routing ----------------------------------------------------------------------------------------

    def add_route(self, method: str, path: str, handler: RouteHandler) -> None:
        """Serve ``method path`` with ``handler``; ``path`` may hold ``{name}`` placeholders (one path segment).

        A later registration for the same method and path wins.

        Args:
            method: the HTTP method, such as ``POST`` (any case).
            path: the URL path, such as ``/v1/embeddings`` or ``/v1/files/{file_id}``.
            handler: called with each matching :class:`FakeRequest`; returns the :class:`FakeHTTPResponse`.
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
            response = FakeHTTPResponse(500, error_body(f"fake server error: {exc!r}", "server_error"))
        self._write(handler, response)

    def _dispatch(self, request: FakeRequest) -> FakeHTTPResponse:
        if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return FakeHTTPResponse(
                401, error_body("Incorrect API key provided.", "invalid_request_error", code="invalid_api_key")
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
            return FakeHTTPResponse(405, error_body(f"{request.method} is not allowed here", "invalid_request_error"))
        return FakeHTTPResponse(
            404, error_body(f"Invalid URL ({request.method} {request.path})", "invalid_request_error")
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
                event_name = event.get("type") if response.named_events and isinstance(event, dict) else None
                head = f"event: {event_name}\n" if isinstance(event_name, str) else ""
                data = f"{head}data: {payload}\n\n".encode()
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                handler.wfile.flush()
            handler.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away mid-answer (a cancelled stream); nothing to tell it
