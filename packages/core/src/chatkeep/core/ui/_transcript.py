"""A session's transcript as the browser shows it: pages of messages, and each message as blocks to render.

Pages are counted from the newest message, so the page a session opens on is the newest ``PAGE_SIZE`` messages,
read with ``load(last=...)``: it costs the same for a session of 10 messages and of 100,000. An older page is the
range ending before a position, read with ``load(last=PAGE_SIZE, before=...)``: the store reads only that range.

A tool call and its result are shown together: a result whose call is on the same page is rendered inside the
call's block, and its own message says where it went.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, cast

from chatkeep.core._messages import (
    DataContent,
    FunctionCallContent,
    FunctionResultContent,
    Message,
    TextContent,
    UriContent,
    UsageContent,
)
from chatkeep.core.backend import HistoryStore, SessionKey
from chatkeep.core.cli._output import iso, when

__all__ = ["PAGE_SIZE", "Block", "Page", "Shown", "message_page", "page_of", "read_page", "shown"]

#: Messages per transcript page.
PAGE_SIZE = 100
#: A pretty-printed JSON longer than this (characters or lines) starts collapsed.
FOLD_CHARACTERS, FOLD_LINES = 600, 12
#: The longest text shown whole; a longer one is cut (the export holds it all).
MAX_TEXT = 200_000


@dataclass(frozen=True, slots=True)
class Page:
    """Which messages of a session a page shows: positions ``start`` to ``end`` (excluded) of ``total``."""

    start: int
    end: int
    total: int

    @property
    def older(self) -> int | None:
        """The ``before`` of the next older page, or ``None`` on the oldest."""
        return self.start if self.start > 0 else None

    @property
    def newer(self) -> int | None:
        """The ``before`` of the next newer page (``total``: the newest page), or ``None`` on the newest."""
        return None if self.end >= self.total else min(self.end + PAGE_SIZE, self.total)

    @property
    def oldest(self) -> int | None:
        """The ``before`` of the oldest page, or ``None`` when this is it."""
        return None if self.start == 0 else min(PAGE_SIZE, self.total)


def page_of(position: int, total: int) -> int:
    """The ``before`` of the page holding the message at ``position`` (pages are aligned on the newest message)."""
    from_newest = (total - 1 - position) // PAGE_SIZE
    return total - from_newest * PAGE_SIZE


async def read_page(store: HistoryStore, key: SessionKey, before: int | None) -> tuple[Page, list[Message]]:
    """The page ending before position ``before`` (``None``: the newest page), reading only its messages."""
    total = await store.count(key)
    end = total if before is None else max(0, min(before, total))
    if end == total:
        newest = await store.load(key, last=PAGE_SIZE)
        return Page(total - len(newest), total, total), newest
    messages = await store.load(key, last=PAGE_SIZE, before=end)
    return Page(end - len(messages), end, total), messages


def _stream(store: HistoryStore, key: SessionKey, batch: int) -> AsyncGenerator[Message, None]:
    """``iter_messages`` as the async generator it is, so that stopping early closes it (and its read) at once."""
    return cast("AsyncGenerator[Message, None]", store.iter_messages(key, batch=batch))


async def message_page(store: HistoryStore, key: SessionKey, message_id: str) -> int | None:
    """The ``before`` of the page holding message ``message_id``, or ``None`` when the session has no such message.

    The store keeps no index from a message id to its position, so the history is streamed until it is found.
    """
    total = await store.count(key)
    position = 0
    async with contextlib.aclosing(_stream(store, key, 1000)) as stream:
        async for message in stream:
            if message.message_id == message_id:
                return page_of(position, total)
            position += 1
    return None


@dataclass
class Block:
    """One content of a message, ready for the template: ``kind`` picks how it is drawn."""

    kind: str  # text, call, result, data, uri, usage
    text: str = ""
    name: str = ""
    call_id: str = ""
    folded: bool = False
    is_error: bool = False
    result: Block | None = None  # a call's result, when it is on the same page
    shown_with_call: bool = False  # a result drawn inside its call's block


@dataclass
class Shown:
    """One message for the template."""

    message_id: str
    role: str
    author: str | None
    time: str
    iso_time: str
    blocks: list[Block] = field(default_factory=list)
    usage: dict[str, Any] | None = None


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


def _arguments(text: str) -> str:
    """A call's arguments as indented JSON when they are JSON, else the text as the model wrote it."""
    try:
        return _pretty(json.loads(text))
    except ValueError:
        return text


def _long(text: str) -> bool:
    return len(text) > FOLD_CHARACTERS or text.count("\n") >= FOLD_LINES


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT else f"{text[:MAX_TEXT]}\n... ({len(text):,} characters; export has it all)"


def _block(content: Any) -> Block | None:
    if isinstance(content, TextContent):
        return Block("text", text=_cut(content.text))
    if isinstance(content, FunctionCallContent):
        arguments = _cut(_arguments(content.arguments))
        return Block("call", text=arguments, name=content.name, call_id=content.call_id, folded=_long(arguments))
    if isinstance(content, FunctionResultContent):
        result = _cut(_pretty(content.result))
        return Block("result", text=result, call_id=content.call_id, folded=_long(result), is_error=content.is_error)
    if isinstance(content, DataContent):
        return Block("data", text=f"{content.media_type}, {len(content.data):,} base64 characters")
    if isinstance(content, UriContent):  # shown as text, never as a link: a stored URI may be javascript:
        return Block("uri", text=f"{content.media_type or 'uri'} {content.uri}")
    return None


def shown(messages: list[Message]) -> list[Shown]:
    """The messages of a page for the template, each call carrying its result when the result is on the page."""
    page: list[Shown] = []
    calls: dict[str, Block] = {}
    for message in messages:
        item = Shown(
            message.message_id,
            message.role,
            message.author_name,
            when(message.created_at),
            iso(message.created_at),
        )
        for content in message.contents:
            if isinstance(content, UsageContent):
                used = content.usage
                item.usage = {
                    "input": used.input_tokens,
                    "output": used.output_tokens,
                    "total": used.total_tokens,
                    "model": content.model,
                }
                continue
            block = _block(content)
            if block is None:
                continue
            if block.kind == "call":
                calls[block.call_id] = block
            elif block.kind == "result" and block.call_id in calls and calls[block.call_id].result is None:
                calls[block.call_id].result = block
                block.shown_with_call = True
            item.blocks.append(block)
        page.append(item)
    return page
