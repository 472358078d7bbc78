"""``OpenAIChatClient``: the Chat Completions API of OpenAI or of any OpenAI-compatible server."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, cast

import openai
from openai import AsyncOpenAI, omit

from chatkeep.core._chat import ChatOptions, ChatResponse, ChatResponseUpdate, refuse_service_conversation
from chatkeep.core._errors import ModelError
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
    from openai.types import CompletionUsage
    from openai.types.chat import (
        ChatCompletion,
        ChatCompletionChunk,
        ChatCompletionMessageParam,
        ChatCompletionToolParam,
    )

__all__ = ["OpenAIChatClient"]

# What OpenAI accepts as a message's ``name``; an author name outside it is not sent (it would fail the call).
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Request fields the client sets itself, so they cannot be defaults.
_RESERVED_OPTIONS = frozenset(
    {"messages", "model", "stream", "stream_options", "tools", "conversation_id", "additional"}
)
_AUDIO_FORMATS = {
    "audio/wav": "wav",
    "audio/x-wav": "wav",
    "audio/wave": "wav",
    "audio/mpeg": "mp3",
    "audio/mp3": "mp3",
}


class OpenAIChatClient(OpenAIClientBase):
    """A :class:`~chatkeep.core.ChatClient` for the Chat Completions API (OpenAI or any compatible server).

    The service keeps no history (``keeps_history`` is ``False``): every call sends the instructions as a
    leading system message, then the whole conversation it is given.

    Example:
        ```python
        async with OpenAIChatClient("gpt-4o-mini") as client:
            agent = client.as_agent(name="Helper", instructions="Be brief.")
        ```

    Args:
        model: the model name; defaults to ``OPENAI_MODEL``, then ``OPENAI_CHAT_MODEL_ID``.
        base_url: the API's base URL (ending with ``/v1``); defaults to ``OPENAI_BASE_URL``, then OpenAI's.
        api_key: defaults to ``OPENAI_API_KEY``. When neither is set and ``base_url`` is a loopback address
            (``localhost``, ``127.0.0.1``, ``::1``), the placeholder ``"not-needed"`` is sent, since local servers
            need no key; any other server needs one.
        client: an ``AsyncOpenAI`` to use as it is (its own base URL, key, retries and timeouts);
            ``base_url`` and ``api_key`` are then ignored, and :meth:`close` leaves it open.
        timeout: seconds the server may stay silent: for a call's whole answer, retries included, and between the
            chunks of a stream; default 120 (a call that is not streamed gets nothing until the model is done).
            Then :class:`~chatkeep.core.ModelError` names it.
        connect_timeout: seconds a connection to the server may take to open; default 5.
        **default_options: defaults for every call: ``instructions``, ``temperature`` and ``max_tokens``
            (used when a call's :class:`~chatkeep.core.ChatOptions` leaves them unset), and any other
            Chat Completions request field (``top_p``, ``seed``, ``reasoning_effort``...), sent as given
            unless the call's ``options.additional`` overrides it.

    Raises:
        AgentConfigurationError: no model or no API key is configured, or a default option is one the
            client sets itself (``messages``, ``tools``, ``stream``...).
    """

    _client_name: ClassVar[str] = "OpenAIChatClient"
    _api_name: ClassVar[str] = "Chat Completions"
    _model_env: ClassVar[str] = "OPENAI_CHAT_MODEL_ID"
    _reserved_options: ClassVar[frozenset[str]] = _RESERVED_OPTIONS
    _reserved_hint: ClassVar[str] = "give tools to the agent (Agent(tools=...)) and per-call fields in ChatOptions"

    def __init__(
        self,
        model: str | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        client: AsyncOpenAI | None = None,
        timeout: float | None = None,
        connect_timeout: float | None = None,
        **default_options: Any,
    ) -> None:
        super().__init__(
            model,
            base_url=base_url,
            api_key=api_key,
            client=client,
            default_options=default_options,
            timeout=timeout,
            connect_timeout=connect_timeout,
        )

    @property
    def keeps_history(self) -> bool:
        """Always ``False``: Chat Completions keeps no conversation, so the caller sends the history."""
        return False

    # -- calls ------------------------------------------------------------------------------------------

    async def get_response(self, messages: Sequence[Message], *, options: ChatOptions) -> ChatResponse:
        """Make one Chat Completions call.

        Args:
            messages: the conversation to send, oldest first.
            options: instructions, tools and sampling settings for this call.

        Returns:
            The response: one assistant message with its text, tool calls and usage.

        Raises:
            ModelError: the service could not be reached or refused the call (the ``openai`` error is the cause).
            AgentConfigurationError: ``options.conversation_id`` is set (Chat Completions keeps no conversations).
        """
        request = self._request(messages, options)
        try:
            completion = await self._answered(self._client.chat.completions.create(**request.kwargs()))
        except openai.OpenAIError as exc:
            raise self._model_error(exc, request.model) from exc
        return _response_from_completion(completion, request.model)

    async def get_streaming_response(
        self, messages: Sequence[Message], *, options: ChatOptions
    ) -> AsyncIterator[ChatResponseUpdate]:
        """Make one streamed Chat Completions call.

        Yields an update per text delta, then a last update (with empty text) whose ``response`` holds the
        whole response: the text, the tool calls with their arguments reassembled, the usage.

        Args:
            messages: the conversation to send, oldest first.
            options: instructions, tools and sampling settings for this call.

        Raises:
            ModelError: the service could not be reached, refused the call, or broke off the stream.
            AgentConfigurationError: ``options.conversation_id`` is set (Chat Completions keeps no conversations).
        """
        request = self._request(messages, options)
        assembler = _StreamAssembler()
        try:
            stream = await self._answered(
                self._client.chat.completions.create(
                    **request.kwargs(), stream=True, stream_options={"include_usage": True}
                )
            )
            async with stream:
                async for chunk in stream:
                    text = assembler.add(chunk)
                    if text:
                        yield ChatResponseUpdate(text=text)
        except openai.OpenAIError as exc:
            raise self._model_error(exc, request.model) from exc
        yield ChatResponseUpdate(response=assembler.response(request.model))

    def _request(self, messages: Sequence[Message], options: ChatOptions) -> _Request:
        refuse_service_conversation(
            options,
            client="OpenAIChatClient",
            advice="Chat Completions keeps no conversations; use OpenAIResponsesClient, or a session without "
            "a service_session_id",
        )
        settings = self._settings(options)
        instructions = settings.instructions
        wire: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
        for message in messages:
            wire.extend(to_chat_messages(message))
        return _Request(
            model=options.model or self.model,
            messages=wire,
            tools=[t.to_openai() for t in options.tools],
            temperature=settings.temperature,
            max_tokens=settings.max_tokens,
            extra_body=settings.extra_body,
        )

    def _model_error(self, exc: openai.OpenAIError, model: str) -> ModelError:
        return model_error(
            exc,
            where=self._where,
            api_name=self._api_name,
            model=model,
            not_found_hint=(
                f"has no model {model!r} or no Chat Completions endpoint; check the model name and that "
                "base_url ends with /v1"
            ),
            bad_request_hint=f"refused the request; check that model {model!r} supports the options and tools sent",
            timeouts=self._timeouts,
        )


class _Request:
    """One call's request fields, before they become ``create()`` keyword arguments."""

    def __init__(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        temperature: float | None,
        max_tokens: int | None,
        extra_body: dict[str, Any],
    ) -> None:
        self.model = model
        self.messages = messages
        self.tools = tools
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.extra_body = extra_body

    def kwargs(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": cast("list[ChatCompletionMessageParam]", self.messages),
            "tools": cast("list[ChatCompletionToolParam]", self.tools) if self.tools else omit,
            "temperature": self.temperature if self.temperature is not None else omit,
            # max_completion_tokens is what current OpenAI models accept; max_tokens is refused by reasoning models.
            "max_completion_tokens": self.max_tokens if self.max_tokens is not None else omit,
            "extra_body": self.extra_body or None,
        }


# -- chatkeep messages -> Chat Completions messages ---------------------------------------------------------


def to_chat_messages(message: Message) -> list[dict[str, Any]]:
    """Map one chatkeep message to the Chat Completions messages that carry it.

    Only ``role``, ``content``, ``tool_calls``, ``tool_call_id`` and ``name`` are sent: never the message id,
    timestamps, additional properties or the in-memory source stamp. ``name`` is the author name when it fits
    OpenAI's pattern (letters, digits, ``_``, ``-``; up to 64), else it is left out. Each function result becomes
    its own ``tool`` message; usage contents are not sent. A message with nothing to send maps to no message.

    Raises:
        ModelError: the message holds content Chat Completions cannot take (for example a video).
    """
    results = [_tool_message(r) for r in message.function_results]
    rest = [c for c in message.contents if not isinstance(c, (FunctionResultContent, UsageContent))]
    name = message.author_name if message.author_name and _NAME.match(message.author_name) else None
    own: dict[str, Any] | None = None
    if message.role == "assistant":
        calls = [c for c in rest if isinstance(c, FunctionCallContent)]
        texts = [c for c in rest if isinstance(c, TextContent)]
        _refuse_other(message, [c for c in rest if not isinstance(c, (FunctionCallContent, TextContent))])
        if calls or texts:
            own = {"role": "assistant", "content": "".join(t.text for t in texts) if texts else None}
            if name:
                own["name"] = name
            if calls:
                own["tool_calls"] = [
                    {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in calls
                ]
        # The results of an assistant's own calls answer them, so they follow it.
        return ([own] if own else []) + results
    if message.role == "tool":
        _refuse_other(message, rest)
        return results
    if rest:
        own = {"role": message.role, "content": _content(message, rest)}
        if name:
            own["name"] = name
    # In a user or system message, results answer an earlier assistant's calls: they come before its text.
    return results + ([own] if own else [])


def _refuse_other(message: Message, contents: Sequence[Content]) -> None:
    if contents:
        kinds = ", ".join(sorted({c.type for c in contents}))
        raise ModelError(
            f"message {message.message_id} ({message.role}) holds {kinds} content, which Chat Completions cannot "
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
            parts.append({"type": "text", "text": c.text})
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
            return {"type": "image_url", "image_url": {"url": data_url}}
        if media_type in _AUDIO_FORMATS:
            return {"type": "input_audio", "input_audio": {"data": content.data, "format": _AUDIO_FORMATS[media_type]}}
        if media_type == "application/pdf":
            return {"type": "file", "file": {"file_data": data_url, "filename": "document.pdf"}}
    elif not media_type or media_type.startswith("image/"):
        # A URL part in Chat Completions is always an image.
        return {"type": "image_url", "image_url": {"url": content.uri}}
    raise ModelError(
        f"message {message.message_id} holds {content.type} content of media type {media_type or 'unknown'!r}; "
        "Chat Completions takes images, WAV or MP3 audio and PDF files (and images only by URL)"
    )


def _tool_message(result: FunctionResultContent) -> dict[str, Any]:
    value = result.result
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if result.is_error:
        # Chat Completions has no error flag on a tool result: say it in the text the model reads.
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": result.call_id, "content": text}


# -- Chat Completions responses -> chatkeep -------------------------------------------------------------------


def _usage(usage: CompletionUsage | None) -> Usage | None:
    if usage is None:
        return None
    return Usage(
        input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens, total_tokens=usage.total_tokens
    )


def _response_from_completion(completion: ChatCompletion, model: str) -> ChatResponse:
    if not completion.choices:
        raise ModelError(
            f"the Chat Completions response {completion.id!r} has no choices; check that model {model!r} "
            "serves chat completions"
        )
    choice = completion.choices[0]
    message = choice.message
    text = (message.content or "") + (message.refusal or "")
    calls = [
        FunctionCallContent(call_id=c.id, name=c.function.name, arguments=c.function.arguments)
        for c in message.tool_calls or []
        if c.type == "function"
    ]
    usage = _usage(completion.usage)
    return ChatResponse(
        messages=[assistant_message(text, calls, usage, completion.model)],
        usage=usage,
        response_id=completion.id,
        finish_reason=choice.finish_reason,
    )


class _StreamAssembler:
    """Builds the whole response from streamed chunks; tool calls are keyed by their ``index``."""

    def __init__(self) -> None:
        self.response_id: str | None = None
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.model: str | None = None

    def add(self, chunk: ChatCompletionChunk) -> str:
        """Take one chunk; return its text delta."""
        self.response_id = self.response_id or chunk.id
        self.model = self.model or chunk.model
        if chunk.usage is not None:
            self.usage = _usage(chunk.usage)
        delta_text = ""
        for choice in chunk.choices:
            if choice.index != 0:
                continue  # only the first choice is used, as in get_response
            delta = choice.delta
            delta_text += (delta.content or "") + (delta.refusal or "")
            for position, call in enumerate(delta.tool_calls or []):
                index = call.index if isinstance(getattr(call, "index", None), int) else position
                entry = self.calls.setdefault(index, {"id": None, "name": None, "arguments": []})
                entry["id"] = entry["id"] or call.id
                if call.function is not None:
                    entry["name"] = entry["name"] or call.function.name
                    if call.function.arguments:
                        entry["arguments"].append(call.function.arguments)
            if choice.finish_reason is not None:
                self.finish_reason = choice.finish_reason
        self.text.append(delta_text)
        return delta_text

    def response(self, model: str) -> ChatResponse:
        """The assembled response."""
        calls = []
        for index in sorted(self.calls):
            entry = self.calls[index]
            if not entry["id"] or not entry["name"]:
                raise ModelError(
                    f"the stream from model {model!r} sent tool call #{index} without an id or a name; "
                    "the server's streaming is not Chat Completions compatible"
                )
            calls.append(
                FunctionCallContent(call_id=entry["id"], name=entry["name"], arguments="".join(entry["arguments"]))
            )
        return ChatResponse(
            messages=[assistant_message("".join(self.text), calls, self.usage, self.model or model)],
            usage=self.usage,
            response_id=self.response_id,
            finish_reason=self.finish_reason,
        )
