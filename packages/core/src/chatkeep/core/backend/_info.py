"""What a store tells about a session beside its messages: token usage, the fork it came from, title, tags, metadata.

Backends keep these with the session and report them in :class:`~chatkeep.core.SessionInfo`. The rules every
backend shares are here once: how a batch of messages adds up to a :class:`SessionUsage` (:func:`usage_of`), and
what a title, a tag set and a metadata dict may hold (:func:`check_title`, :func:`check_tags`,
:func:`check_metadata`, called by the base class before a backend's ``_update_info``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from chatkeep.core._errors import InvalidArgumentError, InvalidArgumentTypeError
from chatkeep.core._messages import Message, UsageContent

__all__ = [
    "MAX_METADATA_BYTES",
    "MAX_TAGS",
    "MAX_TAG_LENGTH",
    "MAX_TITLE_LENGTH",
    "ForkInfo",
    "ModelUsage",
    "SessionUsage",
    "check_metadata",
    "check_tags",
    "check_title",
    "usage_of",
]

MAX_TITLE_LENGTH = 1024
MAX_TAGS = 64
MAX_TAG_LENGTH = 256
MAX_METADATA_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class ModelUsage:
    """What one model used in a session: its calls (usage contents) and their tokens."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: ModelUsage) -> ModelUsage:
        return ModelUsage(
            self.calls + other.calls,
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.total_tokens + other.total_tokens,
        )

    def __sub__(self, other: ModelUsage) -> ModelUsage:
        return ModelUsage(
            self.calls - other.calls,
            self.input_tokens - other.input_tokens,
            self.output_tokens - other.output_tokens,
            self.total_tokens - other.total_tokens,
        )


@dataclass(frozen=True, slots=True)
class SessionUsage:
    """The tokens a session's stored messages say their model calls used (their ``UsageContent``).

    Attributes:
        input_tokens: summed over every usage content of the session's messages.
        output_tokens: likewise.
        total_tokens: likewise.
        calls: how many usage contents (model calls) the messages hold.
        models: the same counts per model, for usage contents that name their model (``UsageContent.model``).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    calls: int = 0
    models: Mapping[str, ModelUsage] = field(default_factory=dict, hash=False)  # hash=False: it stays hashable

    def __add__(self, other: SessionUsage) -> SessionUsage:
        return self._combined(other, 1)

    def __sub__(self, other: SessionUsage) -> SessionUsage:
        """What is left after removing ``other``'s messages (a pop, a trim): models left without calls go."""
        return self._combined(other, -1)

    def _combined(self, other: SessionUsage, sign: int) -> SessionUsage:
        models = dict(self.models)
        for name, used in other.models.items():
            total = models.get(name, ModelUsage()) + used if sign > 0 else models.get(name, ModelUsage()) - used
            if total.calls:
                models[name] = total
            else:
                models.pop(name, None)
        return SessionUsage(
            self.input_tokens + sign * other.input_tokens,
            self.output_tokens + sign * other.output_tokens,
            self.total_tokens + sign * other.total_tokens,
            self.calls + sign * other.calls,
            models,
        )

    def __bool__(self) -> bool:
        return self.calls != 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (what a backend may store; :meth:`from_dict` reads it back)."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "total_tokens": self.total_tokens,
            "calls": self.calls,
            "models": {
                name: [used.calls, used.input_tokens, used.output_tokens, used.total_tokens]
                for name, used in sorted(self.models.items())
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SessionUsage:
        """The usage :meth:`to_dict` wrote."""
        return cls(
            int(data.get("input_tokens", 0)),
            int(data.get("output_tokens", 0)),
            int(data.get("total_tokens", 0)),
            int(data.get("calls", 0)),
            {name: ModelUsage(*(int(n) for n in counts)) for name, counts in dict(data.get("models", {})).items()},
        )


def usage_of(messages: Iterable[Message]) -> SessionUsage:
    """The usage ``messages`` carry, summed: what an append adds to a session's usage, and a pop or trim removes.

    Every backend computes a session's usage with it (in the same write as the append), so that all count alike.
    """
    input_tokens = output_tokens = total_tokens = calls = 0
    models: dict[str, ModelUsage] = {}
    for message in messages:
        for content in message.contents:
            if not isinstance(content, UsageContent):
                continue
            used = content.usage
            input_tokens += used.input_tokens
            output_tokens += used.output_tokens
            total_tokens += used.total_tokens
            calls += 1
            if content.model is not None:
                models[content.model] = models.get(content.model, ModelUsage()) + ModelUsage(
                    1, used.input_tokens, used.output_tokens, used.total_tokens
                )
    return SessionUsage(input_tokens, output_tokens, total_tokens, calls, models)


@dataclass(frozen=True, slots=True)
class ForkInfo:
    """Where a forked session came from: the source session's id and the id of the last message it took."""

    session_id: str
    through: str


def check_title(title: object) -> str:
    """A title as ``update_info`` takes it: text of at most :data:`MAX_TITLE_LENGTH` characters (``""`` clears it)."""
    if not isinstance(title, str):
        raise InvalidArgumentTypeError(f'title must be a string ("" clears it), got {type(title).__name__}')
    if len(title) > MAX_TITLE_LENGTH:
        raise InvalidArgumentError(
            f"title is {len(title):,} characters long, over the limit of {MAX_TITLE_LENGTH:,}; pass a shorter title "
            "and keep longer text in metadata"
        )
    _check_unicode(title, "title")
    return title


def check_tag(tag: object) -> str:
    """One tag: a non-empty string of at most :data:`MAX_TAG_LENGTH` characters."""
    if not isinstance(tag, str) or not tag:
        raise InvalidArgumentError(f"a tag must be a non-empty string, got {tag!r}; pass tags such as {{'billing'}}")
    if len(tag) > MAX_TAG_LENGTH:
        raise InvalidArgumentError(
            f"a tag is {len(tag):,} characters long, over the limit of {MAX_TAG_LENGTH}; pass a shorter tag"
        )
    _check_unicode(tag, "a tag")
    return tag


def check_tags(tags: object) -> frozenset[str]:
    """A tag set as ``update_info`` takes it: an iterable (not a string) of at most :data:`MAX_TAGS` tags."""
    if isinstance(tags, (str, bytes)) or not isinstance(tags, Iterable):
        raise InvalidArgumentTypeError(
            f"tags must be a set of strings, got {type(tags).__name__}; write tags={{'billing', 'vip'}}"
        )
    checked = frozenset(check_tag(tag) for tag in tags)
    if len(checked) > MAX_TAGS:
        raise InvalidArgumentError(
            f"a session takes at most {MAX_TAGS} tags, got {len(checked)}; keep the rest in metadata"
        )
    return checked


def check_metadata(metadata: object) -> dict[str, Any]:
    """A metadata dict as ``update_info`` takes it: JSON values under string keys, at most 64 KiB as JSON.

    Returns:
        A deep copy (the caller's dict may change afterwards without changing what is stored).
    """
    if not isinstance(metadata, Mapping):
        raise InvalidArgumentTypeError(f"metadata must be a dict, got {type(metadata).__name__}; pass {{}} to clear it")
    try:
        text = json.dumps(dict(metadata), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"metadata must hold only JSON values under string keys (dict, list, str, int, float, bool, None): {exc}"
        ) from exc
    if len(text.encode("utf-8", "surrogatepass")) > MAX_METADATA_BYTES:
        raise InvalidArgumentError(
            f"metadata is over {MAX_METADATA_BYTES:,} bytes as JSON; keep large data in the messages or elsewhere"
        )
    copied: dict[str, Any] = json.loads(text)
    return copied


def _check_unicode(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(
            f"{what} holds a lone surrogate at position {exc.start}; decode it properly"
        ) from None
