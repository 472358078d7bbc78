"""What the agent asks of a model client: the :class:`ChatClient` protocol and its request/response types."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from chatkeep.core._errors import AgentConfigurationError
from chatkeep.core._messages import Message, Usage

if TYPE_CHECKING:
    from chatkeep.core._tools import FunctionTool

__all__ = ["ChatClient", "ChatOptions", "ChatResponse", "ChatResponseUpdate"]


@dataclass
class ChatOptions:
    """Per-call options the agent passes to a client.

    Attributes:
        instructions: the system instructions, sent before the messages (never stored as history).
        tools: the tools the model may call.
        conversation_id: a service-side conversation or previous-response id to continue.
        model: overrides the client's model for this call.
        temperature: sampling temperature, when set.
        max_tokens: output token limit, when set.
        additional: extra request fields passed through to the service unchanged.
    """

    instructions: str | None = None
    tools: Sequence[FunctionTool] = ()
    conversation_id: str | None = None
    model: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    additional: dict[str, Any] = field(default_factory=dict)


def refuse_service_conversation(options: ChatOptions, *, client: str, advice: str) -> None:
    """For a client that keeps no conversations: refuse a call that names one (its history would be lost).

    Raises:
        AgentConfigurationError: ``options.conversation_id`` is set; the message ends with ``advice``.
    """
    if options.conversation_id is not None:
        raise AgentConfigurationError(
            f"{client} cannot continue the service-side conversation {options.conversation_id!r}: {advice}"
        )


@dataclass
class ChatResponse:
    """One completed model call.

    Attributes:
        messages: what the model produced (assistant messages, possibly with function calls).
        usage: token counts, when the service reports them.
        response_id: the service's id of this response.
        conversation_id: the id that continues this conversation on the service (service-managed history).
        finish_reason: why the model stopped, as the service says it.
    """

    messages: list[Message]
    usage: Usage | None = None
    response_id: str | None = None
    conversation_id: str | None = None
    finish_reason: str | None = None

    @property
    def text(self) -> str:
        """The text of the produced messages."""
        return "".join(m.text for m in self.messages)


@dataclass
class ChatResponseUpdate:
    """A piece of a streamed model call: text as it arrives, and the assembled response at the end.

    Attributes:
        text: the text delta (may be empty).
        response: set on the last update only: the whole response, with tool calls assembled.
    """

    text: str = ""
    response: ChatResponse | None = None


@runtime_checkable
class ChatClient(Protocol):
    """A model client the agent can call.

    ``keeps_history`` says whether the service keeps the conversation itself (for example the
    Responses API with ``store=True``); then the agent sends only new messages and the service's
    conversation id.
    """

    @property
    def keeps_history(self) -> bool:
        """Whether the service stores the conversation (service-managed history)."""
        ...

    async def get_response(self, messages: Sequence[Message], *, options: ChatOptions) -> ChatResponse:
        """Make one model call."""
        ...

    def get_streaming_response(
        self, messages: Sequence[Message], *, options: ChatOptions
    ) -> AsyncIterator[ChatResponseUpdate]:
        """Make one streamed model call; the last update carries the whole response."""
        ...
