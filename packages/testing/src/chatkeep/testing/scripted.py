"""A scripted in-process chat client for testing providers and agents without a model server.

It records every request (the messages and options it was sent) and answers from a queue of
scripted replies, so a test can assert exactly what a model would have seen.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from chatkeep.core import (
    BaseChatClient,
    ChatOptions,
    ChatResponse,
    ChatResponseUpdate,
    FunctionCallContent,
    Message,
    TextContent,
    Usage,
)

__all__ = ["ChatRequest", "ScriptedChatClient"]

Reply = Callable[[Sequence[Message], ChatOptions], ChatResponse]


@dataclass
class ChatRequest:
    """What one call sent: deep copies of the messages and the options."""

    messages: list[Message]
    options: ChatOptions
    streamed: bool = False

    @property
    def texts(self) -> list[str]:
        """``"role: text"`` for each message, handy in assertions."""
        return [f"{m.role}: {m.text}" for m in self.messages]


@dataclass
class ScriptedChatClient(BaseChatClient):
    """Answers from a queue; when the queue is empty it echoes the last user text.

    Attributes:
        requests: every call, in order.
        keeps_history: pretend to be a service that keeps the conversation (service-managed mode).
    """

    requests: list[ChatRequest] = field(default_factory=list)
    keeps_history: bool = False
    _queue: list[Reply] = field(default_factory=list)
    _conversation_counter: int = 0

    def reply_text(self, text: str, *, usage: Usage | None = None) -> None:
        """Queue a text answer."""
        self._queue.append(lambda _m, _o: ChatResponse([Message(role="assistant", text=text)], usage=usage))

    def reply_tool_calls(self, *calls: tuple[str, str, str]) -> None:
        """Queue an answer asking for tools: ``(call_id, name, arguments_json)`` each."""
        contents = [FunctionCallContent(call_id=c, name=n, arguments=a) for c, n, a in calls]
        self._queue.append(lambda _m, _o: ChatResponse([Message(role="assistant", contents=list(contents))]))

    def reply_with(self, reply: Reply) -> None:
        """Queue a function that builds the answer from the request."""
        self._queue.append(reply)

    def fail_with(self, exc: BaseException) -> None:
        """Queue an error raised by the next call."""

        def raise_it(_m: Sequence[Message], _o: ChatOptions) -> ChatResponse:
            raise exc

        self._queue.append(raise_it)

    def _answer(self, messages: Sequence[Message], options: ChatOptions, streamed: bool) -> ChatResponse:
        self.requests.append(ChatRequest(copy.deepcopy(list(messages)), copy.copy(options), streamed))
        if self._queue:
            response = self._queue.pop(0)(messages, options)
        else:
            last = next((m.text for m in reversed(messages) if m.role == "user"), "")
            response = ChatResponse([Message(role="assistant", text=f"echo: {last}")])
        if self.keeps_history and response.conversation_id is None:
            self._conversation_counter += 1
            response.conversation_id = options.conversation_id or f"conv_{self._conversation_counter}"
        return response

    async def get_response(self, messages: Sequence[Message], *, options: ChatOptions) -> ChatResponse:
        """Answer from the queue."""
        return self._answer(messages, options, False)

    async def get_streaming_response(
        self, messages: Sequence[Message], *, options: ChatOptions
    ) -> AsyncIterator[ChatResponseUpdate]:
        """Answer from the queue, one text content at a time, split in two pieces each."""
        response = self._answer(messages, options, True)
        for message in response.messages:
            for content in message.contents:
                if isinstance(content, TextContent) and content.text:
                    half = len(content.text) // 2
                    yield ChatResponseUpdate(text=content.text[:half])
                    yield ChatResponseUpdate(text=content.text[half:])
        yield ChatResponseUpdate(response=response)
