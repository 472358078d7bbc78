"""``OpenAIResponsesClient``: the Responses API, where the service can keep the conversation itself."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, cast

import openai
from openai import AsyncOpenAI, omit

from chatkeep.core._chat import ChatOptions, ChatResponse, ChatResponseUpdate
from chatkeep.core._errors import AgentConfigurationError, ModelError
from chatkeep.core._messages import (
    Content,
    DataContent,
    FunctionCallContent,
    FunctionResultContent,
    Message,
    TextContent,
    UriContent,
    Usage,
    UsageContent,
)
from chatkeep.core.openai._base import OpenAIClientBase, assistant_message, model_error

if TYPE_CHECKING:
    from openai.types.responses import Response, ResponseInputParam, ResponseStreamEvent, ToolParam

    from chatkeep.core._tools import FunctionTool

__all__ = ["OpenAIResponsesClient"]

# Request fields the client sets itself, so they cannot be defaults.
_RESERVED_OPTIONS = frozenset(
    {
        "input",
        "model",
        "stream",
        "tools",
        "store",
        "previous_response_id",
        "conversation",
        "conversation_id",
        "additional",
    }
)
# The id prefixes the service gives conversations and responses; they say how a stored id is continued.
_CONVERSATION_PREFIX = "conv_"
_RESPONSE_PREFIX = "resp_"


class OpenAIResponsesClient(OpenAIClientBase):
    """A :class:`~chatkeep.core.ChatClient` for the OpenAI Responses API, with service-managed history.

    With ``store=True`` (the default) the service keeps the conversation (``keeps_history`` is ``True``): the
    agent sends only new messages, and each response's id continues the conversation. Turns are chained with
    ``previous_response_id`` (``ChatResponse.conversation_id`` is the newest ``resp_...`` id), or, with
    ``use_conversations=True``, inside a Conversations object (``conv_...``, created on the first call of a
    session that has none). Whatever the setting, an id starting with ``conv_`` is continued as a conversation
    and one starting with ``resp_`` as a previous response, so a session keeps working across configurations.
    With ``store=False`` the service keeps nothing: the client is stateless like Chat Completions, and every
    call sends the whole history.

    Example:
        ```python
        async with OpenAIResponsesClient("gpt-4o-mini") as client:
            agent = client.as_agent(name="Helper", instructions="Be brief.")
            session = agent.create_session()
            await agent.run("Hi!", session=session)  # session.service_session_id is now "resp_..."
        ```

    Args:
        model: the model name; defaults to ``OPENAI_MODEL``, then ``OPENAI_RESPONSES_MODEL_ID``.
        base_url: the API's base URL (ending with ``/v1``); defaults to ``OPENAI_BASE_URL``, then OpenAI's.
        api_key: defaults to ``OPENAI_API_KEY``. When neither is set and ``base_url`` is a loopback address,
            the placeholder ``"not-needed"`` is sent; any other server needs a key.
        client: an ``AsyncOpenAI`` to use as it is; ``base_url``, ``api_key`` and the timeouts are then its own,
            and :meth:`close` leaves it open.
        timeout: seconds the server may stay silent: for a call's whole answer, retries included, and between the
            chunks of a stream; default 120 (a call that is not streamed gets nothing until the model is done).
            Then :class:`~chatkeep.core.ModelError` names it.
        connect_timeout: seconds a connection to the server may take to open; default 5.
        store: let the service keep the conversation (service-managed history).
        use_conversations: chain new sessions in a Conversations object instead of by previous response id.
        **default_options: defaults for every call: ``instructions``, ``temperature`` and ``max_tokens``
            (sent as ``max_output_tokens``; used when a call's :class:`~chatkeep.core.ChatOptions` leaves them
            unset), and any other Responses request field (``top_p``, ``reasoning``, ``truncation``...),
            sent as given unless the call's ``options.additional`` overrides it.

    Raises:
        AgentConfigurationError: no model or no API key is configured, or a default option is one the
            client sets itself (``input``, ``tools``, ``store``, ``previous_response_id``...).
    """

    _client_name: ClassVar[str] = "OpenAIResponsesClient"
    _api_name: ClassVar[str] = "Responses"
    _model_env: ClassVar[str] = "OPENAI_RESPONSES_MODEL_ID"
    _reserved_options: ClassVar[frozenset[str]] = _RESERVED_OPTIONS
    _reserved_hint: ClassVar[str] = (
        "give tools to the agent (Agent(tools=...)), use store= and use_conversations= for the "
        "conversation, and ChatOptions for per-call fields"
    )

    def __init__(
        self,
        model: str | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        client: AsyncOpenAI | None = None,
        store: bool = True,
        use_conversations: bool = False,
        timeout: float | None = None,
        connect_timeout: float | None = None,
        **default_options: Any,
    ) -> None:
        self.store = store
        self.use_conversations = use_conversations
        super().__init__(
            model,
            base_url=base_url,
            api_key=api_key,
            client=client,
            default_options=default_options,
            timeout=timeout,
            connect_timeout=connect_timeout,
        )

    def _check_config(self) -> None:
        if self.use_conversations and not self.store:
            raise AgentConfigurationError(
                "OpenAIResponsesClient(use_conversations=True, store=False) is contradictory: a conversation is "
                "kept by the service; drop use_conversations, or keep store=True"
            )

    def __repr__(self) -> str:
        return (
            f"OpenAIResponsesClient(model={self.model!r}, base_url={self._where!r}, "
            f"store={self.store}, use_conversations={self.use_conversations})"
        )

    @property
    def keeps_history(self) -> bool:
        """``store``: whether the service keeps the conversation, so only new messages need sending."""
        return self.store

    # -- calls ------------------------------------------------------------------------------------------

    async def get_response(self, messages: Sequence[Message], *, options: ChatOptions) -> ChatResponse:
        """Make one Responses call.

        Args:
            messages: what to send: the new messages when the service keeps the conversation
                (``options.conversation_id`` names it), else the whole conversation, oldest first.
            options: instructions, tools, sampling settings and the conversation to continue.

        Returns:
            One assistant message with the text, tool calls and usage; ``conversation_id`` is the id that
            continues the conversation (``None`` with ``store=False``).

        Raises:
            ModelError: the service could not be reached, refused the call (an unknown or expired
                conversation id included) or failed the response (the ``openai`` error is the cause).
            AgentConfigurationError: ``store=False`` and ``options.conversation_id`` is set.
        """
        request = await self._request(messages, options)
        try:
            response = await self._answered(self._client.responses.create(**request.kwargs()))
        except openai.OpenAIError as exc:
            raise self._model_error(exc, request) from exc
        return _chat_response(response, request)

    async def get_streaming_response(
        self, messages: Sequence[Message], *, options: ChatOptions
    ) -> AsyncIterator[ChatResponseUpdate]:
        """Make one streamed Responses call.

        Yields an update per text delta (``response.output_text.delta``), then a last update (with empty
        text) whose ``response`` holds the whole response from ``response.completed``; function-call
        arguments streamed in pieces are reassembled.

        Args:
            messages: as for :meth:`get_response`.
            options: as for :meth:`get_response`.

        Raises:
            ModelError: the service could not be reached, refused the call, failed the response, or ended
                the stream before it completed.
            AgentConfigurationError: ``store=False`` and ``options.conversation_id`` is set.
        """
        request = await self._request(messages, options)
        assembler = _StreamAssembler()
        try:
            stream = await self._answered(self._client.responses.create(**request.kwargs(), stream=True))
            async with stream:
                async for event in stream:
                    text = assembler.add(event, request)
                    if text:
                        yield ChatResponseUpdate(text=text)
        except openai.OpenAIError as exc:
            raise self._model_error(exc, request) from exc
        yield ChatResponseUpdate(response=assembler.response(request))

    async def _request(self, messages: Sequence[Message], options: ChatOptions) -> _Request:
        conversation_id = options.conversation_id
        if conversation_id is not None and not self.store:
            raise AgentConfigurationError(
                f"OpenAIResponsesClient(store=False) cannot continue the service-side conversation "
                f"{conversation_id!r}: with store=False the service keeps nothing; use store=True, or a session "
                "without a service_session_id"
            )
        request = _Request(model=options.model or self.model, store=self.store)
        if conversation_id is None and self.use_conversations:
            try:
                conversation = await self._answered(self._client.conversations.create())
            except openai.OpenAIError as exc:
                raise self._model_error(exc, request) from exc
            conversation_id = conversation.id
        if conversation_id is not None:
            as_conversation = conversation_id.startswith(_CONVERSATION_PREFIX) or (
                self.use_conversations and not conversation_id.startswith(_RESPONSE_PREFIX)
            )
            if as_conversation:
                request.conversation = conversation_id
            else:
                request.previous_response_id = conversation_id
        settings = self._settings(options)
        request.instructions = settings.instructions or None
        request.input = [item for message in messages for item in to_response_items(message)]
        request.tools = [function_tool(t) for t in options.tools]
        request.temperature = settings.temperature
        request.max_tokens = settings.max_tokens
        request.extra_body = settings.extra_body
        return request

    def _model_error(self, exc: openai.OpenAIError, request: _Request) -> ModelError:
        chained = request.conversation or request.previous_response_id
        unknown_id: str | None = None
        if isinstance(exc, (openai.NotFoundError, openai.BadRequestError)) and chained and chained in str(exc):
            unknown_id = (
                f"does not know {chained!r}: it may have expired, been deleted, or been made with "
                "store=False; start a new session (without service_session_id) to begin a new conversation"
            )
        return model_error(
            exc,
            where=self._where,
            api_name=self._api_name,
            model=request.model,
            not_found_hint=(
                f"has no model {request.model!r} or no Responses endpoint; check the model name and that "
                "base_url ends with /v1"
            ),
            bad_request_hint=f"refused the request; check that model {request.model!r} supports the options and tools",
            extra_hint=unknown_id,
            timeouts=self._timeouts,
        )


class _Request:
    """One call's request fields, before they become ``responses.create()`` keyword arguments."""

    def __init__(self, *, model: str, store: bool) -> None:
        self.model = model
        self.store = store
        self.conversation: str | None = None
        self.previous_response_id: str | None = None
        self.instructions: str | None = None
        self.input: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] = []
        self.temperature: float | None = None
        self.max_tokens: int | None = None
        self.extra_body: dict[str, Any] = {}

    def kwargs(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "input": cast("ResponseInputParam", self.input),
            "instructions": self.instructions if self.instructions is not None else omit,
            "store": self.store,
            "conversation": self.conversation if self.conversation is not None else omit,
            "previous_response_id": self.previous_response_id if self.previous_response_id is not None else omit,
            "tools": cast("list[ToolParam]", self.tools) if self.tools else omit,
            "temperature": self.temperature if self.temperature is not None else omit,
            "max_output_tokens": self.max_tokens if self.max_tokens is not None else omit,
            "extra_body": self.extra_body or None,
        }

    def continuation(self, response_id: str | None) -> str | None:
        """The id that continues the conversation after a response with ``response_id``."""
        if self.conversation is not None:
            return self.conversation
        return response_id if self.store else None


# -- chatkeep -> Responses -------------------------------------------------------------------------------


def function_tool(tool: FunctionTool) -> dict[str, Any]:
    """The tool in the Responses ``tools`` format (not strict: the schema may have optional parameters)."""
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
        "strict": False,
    }


def to_response_items(message: Message) -> list[dict[str, Any]]:
    """Map one chatkeep message to the Responses input items that carry it.

    Text becomes a ``message`` item with the message's role; an assistant's tool calls become ``function_call``
    items, and tool results ``function_call_output`` items. Only what the API defines is sent: never the message
    id, author name, timestamps, additional properties or the in-memory source stamp; usage is not sent.

    Raises:
        ModelError: the message holds content the Responses API cannot take in its role (for example an
            image in an assistant message).
    """
    results = [_output_item(r) for r in message.function_results]
    rest = [c for c in message.contents if not isinstance(c, (FunctionResultContent, UsageContent))]
    if message.role == "assistant":
        calls = [c for c in rest if isinstance(c, FunctionCallContent)]
        texts = [c for c in rest if isinstance(c, TextContent)]
        _refuse_other(message, [c for c in rest if not isinstance(c, (FunctionCallContent, TextContent))])
        items: list[dict[str, Any]] = []
        if texts:
            items.append({"type": "message", "role": "assistant", "content": "".join(t.text for t in texts)})
        items.extend(
            {"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments} for c in calls
        )
        # The results of an assistant's own calls answer them, so they follow it.
        return items + results
    if message.role == "tool":
        _refuse_other(message, rest)
        return results
    own = [{"type": "message", "role": message.role, "content": _content(message, rest)}] if rest else []
    # In a user or system message, results answer an earlier assistant's calls: they come before its text.
    return results + own


def _refuse_other(message: Message, contents: Sequence[Content]) -> None:
    if contents:
        kinds = ", ".join(sorted({c.type for c in contents}))
        raise ModelError(
            f"message {message.message_id} ({message.role}) holds {kinds} content, which the Responses API cannot "
            f"take in a {message.role} message; move it to a user message"
        )


def _content(message: Message, contents: Sequence[Content]) -> str | list[dict[str, Any]]:
    if all(isinstance(c, TextContent) for c in contents):
        return "".join(cast(TextContent, c).text for c in contents)
    if message.role != "user":
        _refuse_other(message, [c for c in contents if not isinstance(c, TextContent)])
    parts: list[dict[str, Any]] = []
    for c in contents:
        if isinstance(c, TextContent):
            parts.append({"type": "input_text", "text": c.text})
        elif isinstance(c, (DataContent, UriContent)):
            parts.append(_media_part(message, c))
        else:
            _refuse_other(message, [c])
    return parts


def _media_part(message: Message, content: DataContent | UriContent) -> dict[str, Any]:
    media_type = content.media_type or ""
    if isinstance(content, DataContent):
        data_url = f"data:{media_type};base64,{content.data}"
        if media_type.startswith("image/"):
            return {"type": "input_image", "image_url": data_url, "detail": "auto"}
        if media_type == "application/pdf":
            return {"type": "input_file", "file_data": data_url, "filename": "document.pdf"}
    elif not media_type or media_type.startswith("image/"):
        return {"type": "input_image", "image_url": content.uri, "detail": "auto"}
    elif media_type == "application/pdf":
        return {"type": "input_file", "file_url": content.uri}
    raise ModelError(
        f"message {message.message_id} holds {content.type} content of media type {media_type or 'unknown'!r}; "
        "the Responses API takes images and PDF files"
    )


def _output_item(result: FunctionResultContent) -> dict[str, Any]:
    value = result.result
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if result.is_error:
        # A function call output has no error flag: say it in the text the model reads.
        text = f"Error: {text}"
    return {"type": "function_call_output", "call_id": result.call_id, "output": text}


# -- Responses -> chatkeep ----------------------------------------------------------------------------------


def _chat_response(response: Response, request: _Request) -> ChatResponse:
    if response.error is not None:
        raise ModelError(
            f"the Responses service failed response {response.id!r} of model {request.model!r}: "
            f"{response.error.message} ({response.error.code}); retry, or check the request"
        )
    texts: list[str] = []
    calls: list[FunctionCallContent] = []
    for item in response.output:
        if item.type == "message":
            for part in item.content:
                texts.append(part.text if part.type == "output_text" else part.refusal)
        elif item.type == "function_call":
            calls.append(FunctionCallContent(call_id=item.call_id, name=item.name, arguments=item.arguments))
    usage = None
    if response.usage is not None:
        u = response.usage
        usage = Usage(input_tokens=u.input_tokens, output_tokens=u.output_tokens, total_tokens=u.total_tokens)
    if calls:
        finish_reason: str | None = "tool_calls"
    elif response.status == "incomplete" and response.incomplete_details is not None:
        finish_reason = response.incomplete_details.reason
    else:
        finish_reason = "stop" if response.status in (None, "completed") else response.status
    return ChatResponse(
        messages=[assistant_message("".join(texts), calls, usage, response.model)],
        usage=usage,
        response_id=response.id,
        conversation_id=request.continuation(response.id),
        finish_reason=finish_reason,
    )


class _StreamAssembler:
    """Follows a response's events: the text deltas, the function calls by item id, and the final response."""

    def __init__(self) -> None:
        self.calls: dict[str, dict[str, Any]] = {}  # item id -> call_id, name, argument pieces
        self.final: Response | None = None

    def add(self, event: ResponseStreamEvent, request: _Request) -> str:
        """Take one event; return its text delta."""
        if event.type in ("response.output_text.delta", "response.refusal.delta"):
            return event.delta
        if event.type in ("response.output_item.added", "response.output_item.done"):
            item = event.item
            if item.type == "function_call":
                entry = self.calls.setdefault(item.id or item.call_id, {"pieces": [], "arguments": None})
                entry.update(call_id=item.call_id, name=item.name)
                if event.type == "response.output_item.done":
                    entry["arguments"] = item.arguments
        elif event.type == "response.function_call_arguments.delta":
            self.calls.setdefault(event.item_id, {"pieces": [], "arguments": None})["pieces"].append(event.delta)
        elif event.type == "response.function_call_arguments.done":
            self.calls.setdefault(event.item_id, {"pieces": [], "arguments": None})["arguments"] = event.arguments
        elif event.type in ("response.completed", "response.incomplete"):
            self.final = event.response
        elif event.type == "response.failed":
            error = event.response.error
            detail = f"{error.message} ({error.code})" if error is not None else "no reason given"
            raise ModelError(
                f"the Responses service failed response {event.response.id!r} of model {request.model!r} while "
                f"streaming: {detail}; retry, or check the request"
            )
        elif event.type == "error":
            raise ModelError(
                f"the Responses stream of model {request.model!r} reported an error: {event.message} "
                f"({event.code}); retry, or check the request"
            )
        return ""

    def response(self, request: _Request) -> ChatResponse:
        """The whole response from ``response.completed``, with the streamed calls when it lists none."""
        if self.final is None:
            raise ModelError(
                f"the Responses stream of model {request.model!r} ended before response.completed; the connection "
                "was cut or the server's streaming is not Responses compatible"
            )
        chat = _chat_response(self.final, request)
        message = chat.messages[0]
        if not message.function_calls and self.calls:
            # Some compatible servers send a completed response without its output items: use what streamed.
            calls = []
            for item_id, entry in self.calls.items():
                if not entry.get("call_id") or not entry.get("name"):
                    raise ModelError(
                        f"the stream from model {request.model!r} sent function call {item_id!r} without a call id "
                        "or a name; the server's streaming is not Responses compatible"
                    )
                arguments = entry["arguments"] if entry["arguments"] is not None else "".join(entry["pieces"])
                calls.append(FunctionCallContent(call_id=entry["call_id"], name=entry["name"], arguments=arguments))
            model = next((c.model for c in message.contents if isinstance(c, UsageContent)), None)
            chat.messages = [assistant_message(message.text, calls, chat.usage, model)]
            chat.finish_reason = "tool_calls"
        return chat
