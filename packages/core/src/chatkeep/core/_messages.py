"""Messages, their contents, and the versioned JSON record every store keeps.

A stored record is the message's JSON with a leading version field: ``{"v":1,"message_id":...}``.
It holds no module paths and no pickled objects, so any later release (or another language)
can read it. Golden files in the tests pin the format.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticSerializationError

from chatkeep.core._errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    MessageFormatError,
    MessageTooLargeError,
)

__all__ = [
    "RECORD_VERSION",
    "Content",
    "DataContent",
    "FunctionCallContent",
    "FunctionResultContent",
    "Message",
    "Role",
    "TextContent",
    "UriContent",
    "Usage",
    "UsageContent",
    "decode_records",
    "encode_records",
    "new_message_id",
    "record_size",
]

RECORD_VERSION = 1
_RECORD_PREFIX = '{"v":1,'
_RECORD_PREFIX_BYTES = _RECORD_PREFIX.encode()

Role = Literal["system", "user", "assistant", "tool"]


def _refusal(what: str, exc: ValidationError, hint: str) -> InvalidArgumentError:
    """The ChatkeepError a constructor raises for pydantic's refusal of its arguments (chain ``exc`` as its cause).

    An :class:`InvalidArgumentTypeError` when every value was of a wrong type, else an :class:`InvalidArgumentError`;
    ``hint`` says what to pass.
    """
    wrong_type = all(error["type"].endswith("_type") for error in exc.errors())
    error = InvalidArgumentTypeError if wrong_type else InvalidArgumentError
    return error(f"{what} got a value it cannot hold: {exc}. {hint}")


_Dataclass = TypeVar("_Dataclass", bound=type)


def _refusing(cls: _Dataclass) -> _Dataclass:
    """Make a content dataclass's constructor refuse bad arguments as :class:`Message`'s does (:func:`_refusal`).

    Only the constructor is wrapped: decoding stored records builds contents without calling it.
    """
    init: Callable[..., None] = vars(cls)["__init__"]  # the one pydantic made for the dataclass
    params = ", ".join(
        f"{field.name}: {field.type}" + ("" if default is dataclasses.MISSING else f" = {default!r}")
        for field in dataclasses.fields(cls)
        if field.name != "type"  # the tag, which each class sets itself
        for default in [getattr(field.default, "default", field.default)]  # a pydantic Field(...) holds its default
    )
    hint = f"Pass keyword arguments of these types: {cls.__name__}({params})"

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except ValidationError as exc:
            raise _refusal(cls.__name__, exc, hint) from exc

    cls.__init__ = __init__  # type: ignore[misc]
    return cls


# Contents and Usage are slotted pydantic dataclasses, not models: a batch decode makes one per content, and a
# slotted dataclass is one object where a model is three (itself, its __dict__ and its set of fields given). The
# ``type`` tag comes first so that a record's bytes keep their order (golden files pin them).
_CONTENT = ConfigDict(extra="forbid")


@_refusing
@dataclass(slots=True, kw_only=True, config=_CONTENT)
class TextContent:
    """Plain text."""

    type: Literal["text"] = "text"
    text: str


@_refusing
@dataclass(slots=True, kw_only=True, config=_CONTENT)
class FunctionCallContent:
    """The model asks for a tool to be called; ``arguments`` is the JSON text the model produced."""

    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str = "{}"

    def parse_arguments(self) -> dict[str, Any]:
        """Decode ``arguments`` into a dict (an empty string means no arguments)."""
        if not self.arguments.strip():
            return {}
        value = json.loads(self.arguments)
        if not isinstance(value, dict):
            raise ValueError(f"tool arguments must be a JSON object, got {type(value).__name__}")
        return value


@_refusing
@dataclass(slots=True, kw_only=True, config=_CONTENT)
class FunctionResultContent:
    """The result of a tool call, answering the ``FunctionCallContent`` with the same ``call_id``."""

    type: Literal["function_result"] = "function_result"
    call_id: str
    result: JsonValue = None
    is_error: bool = False


@_refusing
@dataclass(slots=True, kw_only=True, config=_CONTENT)
class DataContent:
    """Inline binary data, base64-encoded, with its media type."""

    type: Literal["data"] = "data"
    data: str
    media_type: str


@_refusing
@dataclass(slots=True, kw_only=True, config=_CONTENT)
class UriContent:
    """A reference to content by URI (an image URL, a file id...)."""

    type: Literal["uri"] = "uri"
    uri: str
    media_type: str | None = None


@_refusing
@dataclass(slots=True, kw_only=True, config=_CONTENT)
class Usage:
    """Token counts reported by a model service."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
        )


@_refusing
@dataclass(slots=True, kw_only=True, config=_CONTENT)
class UsageContent:
    """Usage attached to the message that a model call produced, and the model that produced it (when known).

    ``model`` is left out of the stored record when ``None``, so records without it keep their bytes.
    """

    type: Literal["usage"] = "usage"
    usage: Usage
    model: str | None = Field(default=None, exclude_if=lambda model: model is None)


Content = Annotated[
    TextContent | FunctionCallContent | FunctionResultContent | DataContent | UriContent | UsageContent,
    Field(discriminator="type"),
]

_id_lock = threading.Lock()
_last_ms = 0
_counter = 0


def new_message_id() -> str:
    """Return a new time-ordered id (a UUIDv7 string): ids made later in this process sort after earlier ones."""
    global _last_ms, _counter
    with _id_lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            # Same (or a stepped-back) millisecond: keep order with the 12-bit counter; borrow the next ms on overflow.
            _counter += 1
            if _counter > 0xFFF:
                _last_ms += 1
                _counter = 0
            ms = _last_ms
        else:
            _last_ms = ms
            _counter = int.from_bytes(os.urandom(2), "big") & 0x3FF
        counter = _counter
    rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | rand_b
    return str(uuid.UUID(int=value))


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Message(BaseModel):
    """One message of a conversation.

    Example:
        ``Message(role="user", text="hi")`` makes a user message with one text content.

    Attributes:
        message_id: time-ordered unique id, assigned on creation; stores deduplicate appends by it.
        role: ``system``, ``user``, ``assistant`` or ``tool``.
        contents: text, function calls, function results, data, URIs and usage.
        author_name: optional name of the author (an agent's name, a user's display name).
        created_at: when the message was made (UTC).
        additional_properties: JSON-safe values of your own, stored with the message.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    message_id: str = Field(default_factory=new_message_id, min_length=1)
    role: Role
    contents: list[Content] = Field(default_factory=list)
    author_name: str | None = None
    created_at: datetime = Field(default_factory=_utcnow)
    additional_properties: dict[str, JsonValue] = Field(default_factory=dict)

    def __init__(self, text: str | None = None, /, **data: Any) -> None:
        try:
            if "text" in data:  # text= by keyword (positional-only above, so a text given both ways is refused here)
                if text is not None:
                    raise InvalidArgumentError(
                        "Pass Message its text once: Message('hi', role=...) or Message(text='hi', role=...)"
                    )
                text = data.pop("text")
            if text is not None:
                if data.get("contents"):
                    raise InvalidArgumentError("give Message either text= or contents=, not both")
                data["contents"] = [TextContent(text=text)]
            super().__init__(**data)
        except ValidationError as exc:  # a ChatkeepError, as every refusal of the public API; pydantic's is the cause
            raise _refusal(
                "Message",
                exc,
                "Pass role= one of system, user, assistant or tool, "
                "text= a string or contents= a list of contents (TextContent(text=...), ...)",
            ) from exc

    # Validation (decode_records) builds messages without calling __init__: it adds nothing to stored data,
    # and pydantic would otherwise call it for every message of a batch decode, about twice as slow.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @property
    def text(self) -> str:
        """The texts of the message's text contents, concatenated."""
        return "".join(c.text for c in self.contents if isinstance(c, TextContent))

    @property
    def function_calls(self) -> list[FunctionCallContent]:
        """The tool calls this message asks for."""
        return [c for c in self.contents if isinstance(c, FunctionCallContent)]

    @property
    def function_results(self) -> list[FunctionResultContent]:
        """The tool results this message carries."""
        return [c for c in self.contents if isinstance(c, FunctionResultContent)]

    @property
    def source(self) -> str | None:
        """The ``source_id`` of the provider that loaded this message in the current run, else ``None``."""
        private = self.__pydantic_private__
        return private.get("source") if private else None

    def with_source(self, source_id: str | None) -> Message:
        """Stamp this message (in memory only) as coming from ``source_id``; returns ``self``.

        The stamp lives in pydantic's private slot, so it never reaches a stored record nor a request to a
        model. It is not declared as a ``PrivateAttr``: that would make pydantic initialize private state for
        every message a store decodes, which costs a third of a batch decode.
        """
        object.__setattr__(self, "__pydantic_private__", {"source": source_id})
        return self

    def to_record(self) -> str:
        """Encode as a versioned JSON record (``{"v":1,...}``).

        Raises:
            MessageFormatError: a string in the message is not valid unicode (it holds a lone surrogate).
        """
        try:
            return _RECORD_PREFIX + self.model_dump_json()[1:]
        except PydanticSerializationError as exc:
            # The one failure JSON-typed fields leave: a lone surrogate (from a bad decode) has no UTF-8 form.
            raise MessageFormatError(
                f"message {self.message_id} cannot be stored: {exc}; a text or value in it holds a lone surrogate "
                "(a half of a UTF-16 pair, as a bad decode leaves): decode the text properly, or replace them "
                "with text.encode('utf-8', 'replace').decode()"
            ) from exc

    @classmethod
    def from_record(cls, record: str | bytes) -> Message:
        """Decode one record made by :meth:`to_record` (of this or an earlier format version)."""
        return decode_records([record])[0]


_MESSAGES = TypeAdapter(list[Message])


def encode_records(messages: Iterable[Message], *, max_bytes: int | None = None) -> list[str]:
    """Encode messages as records, refusing any record larger than ``max_bytes`` (UTF-8).

    Raises:
        MessageTooLargeError: a message's record exceeds the limit.
    """
    records = []
    for message in messages:
        record = message.to_record()
        # A str's length is a lower bound of its UTF-8 size; encode only when that bound is close to the limit.
        if max_bytes is not None and len(record) * 4 > max_bytes and record_size(record) > max_bytes:
            raise MessageTooLargeError(
                f"message {message.message_id} is {record_size(record):,} bytes as stored, "
                f"over this store's limit of {max_bytes:,} bytes; split the content, store large data elsewhere "
                "and keep a URI in the message, or open the store with a larger max_message_bytes"
            )
        records.append(record)
    return records


def record_size(record: str) -> int:
    """A record's size as a store counts it against ``max_message_bytes``: its UTF-8 bytes."""
    return len(record.encode("utf-8", "surrogatepass"))


def decode_records(records: Sequence[str | bytes]) -> list[Message]:
    """Decode stored records into messages, in the given order.

    Raises:
        MessageFormatError: a record is not a message record this version understands; the error names the
            record by its place in ``records`` and, when it can be read, its message id.
    """
    if not records:
        return []
    joined = _joined(records)
    if joined is not None:
        # The cyclic collector runs as usual meanwhile. Pausing it here (it is process-wide) would not save its
        # work on the new messages, only postpone it to the caller's next allocations (benchmarks/codec_bench.py).
        try:
            messages = _MESSAGES.validate_json(joined)
        except ValidationError:
            pass  # find the culprit record below, to name it in the error
        else:
            # A corrupt record holding "},{" would otherwise pass as two messages.
            if len(messages) == len(records):
                return messages
    return [_decode_one(record, index, len(records)) for index, record in enumerate(records)]


def _joined(records: Sequence[str | bytes]) -> str | bytes | None:
    """The records as one JSON array without their version fields, for one validation call; ``None`` when a record
    does not start as this version's records do, or is bytes that are not UTF-8 beside ``str`` records (such a
    batch is decoded record by record, which names the culprit)."""
    n = len(_RECORD_PREFIX)
    if all(isinstance(r, bytes) for r in records):
        raw = cast("Sequence[bytes]", records)
        if all(r.startswith(_RECORD_PREFIX_BYTES) for r in raw):
            return b"[{" + b",{".join([r[n:] for r in raw]) + b"]"
        return None
    try:
        texts = [r.decode() if isinstance(r, bytes) else r for r in records]
    except UnicodeDecodeError:
        return None
    if all(t.startswith(_RECORD_PREFIX) for t in texts):
        return "[{" + ",{".join([t[n:] for t in texts]) + "]"
    return None


def _decode_one(record: str | bytes, index: int, count: int) -> Message:
    which = f"stored record {index + 1} of {count}"
    try:
        data = json.loads(record)
    except ValueError as exc:  # UnicodeDecodeError included: bytes that are not UTF-8
        raise MessageFormatError(f"{which} is not valid JSON ({exc}); the record may be corrupted") from exc
    if not isinstance(data, dict):
        raise MessageFormatError(f"{which} is not a JSON object; the record may be corrupted")
    message_id = data.get("message_id")
    if isinstance(message_id, str):
        which += f" (message {message_id!r})"
    version = data.pop("v", None)
    if version != RECORD_VERSION:
        raise MessageFormatError(
            f"{which} has record version {version!r}, and this chatkeep-core reads version {RECORD_VERSION}; "
            "upgrade chatkeep-core to read records written by a newer release"
        )
    try:
        return Message.model_validate(data)
    except ValidationError as exc:
        raise MessageFormatError(f"{which} is malformed: {exc}") from exc
