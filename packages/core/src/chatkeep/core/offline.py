"""A built-in offline model for demos and tests: it needs no network and says plainly that it is not a real model."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from chatkeep.core._agent import BaseChatClient
from chatkeep.core._chat import ChatOptions, ChatResponse, ChatResponseUpdate, refuse_service_conversation
from chatkeep.core._messages import Message, Usage, new_message_id
from chatkeep.core._reducers import approximate_token_count

__all__ = ["OfflineChatClient"]

_NOTICE = "[offline demo model: not a real language model; set OPENAI_API_KEY and OPENAI_MODEL to use one]"


class OfflineChatClient(BaseChatClient):
    """A deterministic stand-in for a model: it answers by showing what history it was sent.

    It proves that a conversation was stored and resumed (its answer quotes the earlier turns), and
    every answer starts with a notice that it is an offline model.
    """

    keeps_history = False

    def _answer(self, messages: Sequence[Message]) -> str:
        user_texts = [m.text for m in messages if m.role == "user" and m.text]
        if not user_texts:
            return f"{_NOTICE} Say something and I will remember it."
        *earlier, latest = user_texts
        if not earlier:
            return f"{_NOTICE} This is the start of our conversation. You said: \u201c{latest}\u201d"
        recalled = "; ".join(f"\u201c{t}\u201d" for t in earlier[-5:])
        return (
            f"{_NOTICE} I was sent {len(messages) - 1} earlier messages of this conversation. "
            f"Earlier you told me: {recalled}. Now you said: \u201c{latest}\u201d"
        )

    def _response(self, messages: Sequence[Message], options: ChatOptions) -> ChatResponse:
        refuse_service_conversation(
            options,
            client="the offline demo model",
            advice="it keeps no conversations; use a session without a service_session_id (history then comes "
            "from the session or the agent's history provider)",
        )
        text = self._answer(messages)
        prompt_tokens = sum(approximate_token_count(m.text) for m in messages)
        output_tokens = approximate_token_count(text)
        return ChatResponse(
            messages=[Message(role="assistant", text=text)],
            usage=Usage(
                input_tokens=prompt_tokens, output_tokens=output_tokens, total_tokens=prompt_tokens + output_tokens
            ),
            response_id=f"offline-{new_message_id()}",
            finish_reason="stop",
        )

    async def get_response(self, messages: Sequence[Message], *, options: ChatOptions) -> ChatResponse:
        """Answer at once."""
        return self._response(messages, options)

    async def get_streaming_response(
        self, messages: Sequence[Message], *, options: ChatOptions
    ) -> AsyncIterator[ChatResponseUpdate]:
        """Answer word by word, then the whole response."""
        response = self._response(messages, options)
        words = response.text.split(" ")
        for i, word in enumerate(words):
            yield ChatResponseUpdate(text=word if i == 0 else " " + word)
        yield ChatResponseUpdate(response=response)
