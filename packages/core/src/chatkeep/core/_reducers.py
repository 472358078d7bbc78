"""Reducers: shape the history a model is sent, without deleting anything stored.

Every reducer keeps system messages and never separates a tool call from its results: messages are
reduced in groups (an assistant message that asks for tools, with the tool messages answering it),
and a tool result whose call is not in the history is dropped, since no model API accepts it.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from chatkeep.core._chat import ChatClient, ChatOptions
from chatkeep.core._errors import InvalidArgumentError
from chatkeep.core._messages import Message

__all__ = [
    "MessageCountingReducer",
    "Reducer",
    "SummarizingReducer",
    "TokenBudgetReducer",
    "approximate_token_count",
    "drop_orphan_tool_results",
]


@runtime_checkable
class Reducer(Protocol):
    """Anything with ``async reduce(messages) -> messages`` can be given to a history provider as ``reducer=``."""

    async def reduce(self, messages: Sequence[Message]) -> list[Message]:
        """Return the messages to send the model, in order."""
        ...


def _is_tool_result(message: Message) -> bool:
    return message.role == "tool" or (bool(message.contents) and len(message.function_results) == len(message.contents))


def _groups(messages: Sequence[Message]) -> tuple[list[Message], list[list[Message]]]:
    """Split into pinned system messages and call/result groups, dropping tool results whose call is absent."""
    system: list[Message] = []
    groups: list[list[Message]] = []
    open_calls: set[str] = set()
    for message in messages:
        if message.role == "system":
            system.append(message)
            continue
        if _is_tool_result(message):
            answered = {r.call_id for r in message.function_results}
            if groups and answered and answered <= open_calls:
                groups[-1].append(message)
                open_calls -= answered
            continue  # an orphan result: its call is not in this history
        groups.append([message])
        open_calls = {c.call_id for c in message.function_calls}
    return system, groups


def drop_orphan_tool_results(messages: Sequence[Message]) -> list[Message]:
    """Drop leading tool results whose call fell outside a loaded window (the rest is unchanged)."""
    start = 0
    while start < len(messages) and _is_tool_result(messages[start]):
        start += 1
    return list(messages[start:])


def _in_original_order(
    messages: Sequence[Message], system: list[Message], groups: list[list[Message]]
) -> list[Message]:
    # Keep each message where it was: a system message in the middle of the history stays there.
    keep = {id(m) for m in system} | {id(m) for group in groups for m in group}
    return [m for m in messages if id(m) in keep]


def _keep_newest_groups(
    messages: Sequence[Message],
    system: list[Message],
    groups: list[list[Message]],
    fits: Callable[[list[Message]], bool],
) -> list[Message]:
    kept: list[list[Message]] = []
    for group in reversed(groups):
        if not fits(group):
            break
        kept.append(group)
    return _in_original_order(messages, system, kept)


class MessageCountingReducer:
    """Keep at most ``n`` of the newest non-system messages (whole call/result groups), plus every system message.

    Given to a store-backed history provider, it also bounds what is read: only the ``n`` newest are loaded.
    """

    def __init__(self, n: int) -> None:
        if n < 1:
            raise InvalidArgumentError(f"MessageCountingReducer needs n >= 1, got {n}")
        self.n = n

    def __repr__(self) -> str:
        return f"MessageCountingReducer({self.n})"

    async def reduce(self, messages: Sequence[Message]) -> list[Message]:
        """Return the system messages and the newest groups that fit in ``n`` messages."""
        system, groups = _groups(messages)
        budget = [self.n]

        def fits(group: list[Message]) -> bool:
            if len(group) > budget[0]:
                return False
            budget[0] -= len(group)
            return True

        return _keep_newest_groups(messages, system, groups, fits)


_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def approximate_token_count(text: str) -> int:
    """Count tokens the way BPE tokenizers roughly do, with no download: words, punctuation, long words split."""
    count = 0
    for match in _TOKEN.finditer(text):
        # Long words are several tokens for BPE vocabularies (about four characters each).
        count += 1 + (len(match.group()) - 1) // 4
    return count


def _message_text_for_tokens(message: Message) -> str:
    parts = [message.text]
    for call in message.function_calls:
        parts.append(call.name)
        parts.append(call.arguments)
    for result in message.function_results:
        parts.append(result.result if isinstance(result.result, str) else json.dumps(result.result))
    return " ".join(parts)


class TokenBudgetReducer:
    """Keep the newest groups whose tokens fit in ``max_tokens`` (system messages always kept and counted first).

    Args:
        max_tokens: the budget for the history sent to the model.
        tokenizer: counts a text's tokens; the default is an offline approximation (no download).
            Pass an exact one for your model, for example ``lambda s: len(encoding.encode(s))`` with tiktoken.
        per_message_overhead: tokens a chat format adds per message (role markers).
    """

    def __init__(
        self, max_tokens: int, *, tokenizer: Callable[[str], int] | None = None, per_message_overhead: int = 4
    ) -> None:
        if max_tokens < 1:
            raise InvalidArgumentError(f"TokenBudgetReducer needs max_tokens >= 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self.tokenizer = tokenizer or approximate_token_count
        self.per_message_overhead = per_message_overhead

    def count(self, message: Message) -> int:
        """Tokens one message costs."""
        return self.tokenizer(_message_text_for_tokens(message)) + self.per_message_overhead

    async def reduce(self, messages: Sequence[Message]) -> list[Message]:
        """Return the system messages and the newest groups that fit in the budget."""
        system, groups = _groups(messages)
        budget = [self.max_tokens - sum(self.count(m) for m in system)]

        def fits(group: list[Message]) -> bool:
            cost = sum(self.count(m) for m in group)
            if cost > budget[0]:
                return False
            budget[0] -= cost
            return True

        return _keep_newest_groups(messages, system, groups, fits)


_SUMMARY_PROMPT = (
    "Summarize the conversation below for the assistant who will continue it. Keep names, facts, "
    "preferences, decisions and open questions; leave out pleasantries. Answer with the summary only."
)


class SummarizingReducer:
    """Replace older messages by one summary the model writes, keeping the newest ``keep_last`` as they are.

    Summaries are cached in memory by the id of the last message they cover, so a conversation is
    summarized again only when it has grown by ``summarize_after - keep_last`` messages.

    Args:
        client: the chat client that writes summaries (often a small, cheap model).
        keep_last: how many of the newest messages to keep verbatim (whole call/result groups).
        summarize_after: summarize only when there are more non-system messages than this.
        cache_size: how many summaries to remember.
    """

    def __init__(
        self, client: ChatClient, *, keep_last: int = 20, summarize_after: int | None = None, cache_size: int = 256
    ) -> None:
        if keep_last < 1:
            raise InvalidArgumentError(f"SummarizingReducer needs keep_last >= 1, got {keep_last}")
        self.client = client
        self.keep_last = keep_last
        self.summarize_after = summarize_after if summarize_after is not None else 2 * keep_last
        if self.summarize_after < keep_last:
            raise InvalidArgumentError("summarize_after must be at least keep_last")
        self._cache: OrderedDict[str, str] = OrderedDict()
        self._cache_size = cache_size

    async def reduce(self, messages: Sequence[Message]) -> list[Message]:
        """Return system messages, a summary of the older messages, and the newest ones."""
        system, groups = _groups(messages)
        total = sum(len(g) for g in groups)
        if total <= self.summarize_after:
            return _in_original_order(messages, system, groups)
        # Reuse the newest cached summary while the messages after it are few enough to send as they are.
        after = 0
        for index in range(len(groups) - 1, 0, -1):
            after += len(groups[index])
            if after > self.summarize_after:
                break
            cached = self._cache.get(groups[index - 1][-1].message_id)
            if cached is not None:
                self._cache.move_to_end(groups[index - 1][-1].message_id)
                return [*system, self._summary_message(cached), *(m for g in groups[index:] for m in g)]
        kept: list[list[Message]] = []
        count = 0
        for group in reversed(groups):
            if count + len(group) > self.keep_last and kept:
                break
            kept.append(group)
            count += len(group)
        kept.reverse()
        older = [m for g in groups[: len(groups) - len(kept)] for m in g]
        summary = await self._summary(older)
        return [*system, self._summary_message(summary), *(m for g in kept for m in g)]

    @staticmethod
    def _summary_message(summary: str) -> Message:
        return Message(role="system", text=f"Summary of the earlier conversation:\n{summary}")

    async def _summary(self, older: list[Message]) -> str:
        cache_key = older[-1].message_id
        cached = self._cache.get(cache_key)
        if cached is not None:
            self._cache.move_to_end(cache_key)
            return cached
        transcript = "\n".join(f"{m.role}: {_message_text_for_tokens(m)}" for m in older)
        response = await self.client.get_response(
            [Message(role="user", text=transcript)], options=ChatOptions(instructions=_SUMMARY_PROMPT)
        )
        summary = response.text.strip()
        self._cache[cache_key] = summary
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return summary
