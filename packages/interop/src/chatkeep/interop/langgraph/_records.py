"""How a LangGraph thread is kept in a chatkeep session: one record per checkpoint, one per ``put_writes`` call.

A thread is an append-only log in its session, in the order LangGraph wrote it: a checkpoint record holds the
checkpoint's namespace, id and parent id, and LangGraph's own serializer output for the checkpoint (channel values
included) and its metadata; a writes record holds the namespace and id of the checkpoint it belongs to, the task,
and each write's index, channel and serialized value. Serializer output (``serde.dumps_typed``: a type name and
bytes) is kept as the type name and the bytes in base64, so what LangGraph wrote is what it reads back, byte for
byte.

Reading walks the log from its newest end (:func:`newest_first`), a growing window at a time: the latest checkpoint
of a namespace is near the end, so reading it costs a window of a few records however long the thread is, and
``list(limit=k)`` reads about the records its k checkpoints span.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncGenerator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from chatkeep.core import HistoryStore, Message, MessageFormatError, SessionKey
from chatkeep.interop._envelope import ENVELOPE_KEY, unwrap, wrap

__all__ = [
    "FORMAT",
    "Record",
    "checkpoint_record",
    "copies",
    "decode",
    "is_thread",
    "newest_first",
    "pending_writes",
    "typed",
    "untyped",
    "writes_record",
]

#: The envelope format of the records :class:`~chatkeep.interop.langgraph.ChatkeepSaver` writes.
FORMAT = "langgraph.checkpoint"

_GROWTH = 4  # each further window of a backwards walk reads this many times the records of the one before


@dataclass(frozen=True, slots=True)
class Record:
    """One stored record of a thread: a checkpoint (``kind == "checkpoint"``) or a ``put_writes`` call's writes."""

    kind: str
    ns: str
    checkpoint_id: str
    item: dict[str, Any]
    message_id: str


def typed(value: tuple[str, bytes]) -> list[str]:
    """``serde.dumps_typed`` output as JSON: the type name and the bytes in base64."""
    kind, data = value
    return [kind, base64.b64encode(data).decode("ascii")]


def untyped(value: Sequence[str]) -> tuple[str, bytes]:
    """What :func:`typed` kept, as ``serde.loads_typed`` takes it."""
    return value[0], base64.b64decode(value[1])


def checkpoint_record(
    ns: str, checkpoint_id: str, parent_id: str | None, checkpoint: list[str], metadata: list[str], summary: str
) -> Message:
    """The stored form of a checkpoint (its serialized checkpoint and metadata), ``summary`` as readable text."""
    item = {
        "kind": "checkpoint",
        "ns": ns,
        "id": checkpoint_id,
        "parent": parent_id,
        "checkpoint": checkpoint,
        "metadata": metadata,
    }
    return wrap(item, format=FORMAT, role="system", text=summary)


def writes_record(ns: str, checkpoint_id: str, task_id: str, task_path: str, writes: list[list[Any]]) -> Message:
    """The stored form of one ``put_writes`` call: ``writes`` holds ``[idx, channel, type, base64]`` entries."""
    item = {"kind": "writes", "ns": ns, "id": checkpoint_id, "task": task_id, "path": task_path, "writes": writes}
    channels = ", ".join(sorted({str(write[1]) for write in writes}))
    return wrap(item, format=FORMAT, role="system", text=f"LangGraph writes of task {task_id}: {channels}")


def decode(message: Message, key: SessionKey) -> Record:
    """The record a stored message holds.

    Raises:
        MessageFormatError: the message was not written by ``ChatkeepSaver`` (chatkeep's own agents, another
            adapter), or its record is malformed.
    """
    item = unwrap(message, format=FORMAT)
    if item is None or item.get("kind") not in ("checkpoint", "writes"):
        raise MessageFormatError(
            f"message {message.message_id} of session {key.session_id!r} (tenant {key.tenant!r}) is not a LangGraph "
            "checkpoint or writes record: a LangGraph thread's session holds only what ChatkeepSaver wrote; give "
            "the thread an id no other history uses"
        )
    ns, checkpoint_id = item.get("ns"), item.get("id")
    if not isinstance(ns, str) or not isinstance(checkpoint_id, str):
        raise MessageFormatError(
            f"the LangGraph record of message {message.message_id} in session {key.session_id!r} has no namespace "
            "or checkpoint id: it was not written by ChatkeepSaver; delete the thread (delete_thread)"
        )
    return Record(item["kind"], ns, checkpoint_id, item, message.message_id)


def is_thread(message: Message) -> bool:
    """Whether a stored message is one of ``ChatkeepSaver``'s records (a session holding others is no thread)."""
    envelope = message.additional_properties.get(ENVELOPE_KEY)
    return isinstance(envelope, dict) and envelope.get("format") == FORMAT


async def newest_first(store: HistoryStore, key: SessionKey, window: int) -> AsyncGenerator[Record, None]:
    """A thread's records from the newest to the oldest, read ``window`` records at first, then more each time.

    Each read takes the newest ``window`` records (``load(last=window)``), and the next one a window
    :data:`_GROWTH` times larger, from which only the records older than those already given are yielded: the
    records read stay within a constant factor of those the caller consumes. Records appended meanwhile are
    ignored (they are newer than the walk's start); if the oldest record given is gone from the store (the thread
    was deleted or rewritten meanwhile), the walk ends.
    """
    oldest: str | None = None
    while True:
        batch = await store.load(key, last=window)
        if oldest is None:
            start = len(batch)
        else:
            start = next((n for n, message in enumerate(batch) if message.message_id == oldest), -1)
            if start < 0:
                if len(batch) < window:
                    return  # the record the walk stopped at is no longer stored
                window *= _GROWTH
                continue
        for message in reversed(batch[:start]):
            yield decode(message, key)
        if len(batch) < window:
            return
        if start:
            oldest = batch[0].message_id
        window *= _GROWTH


def pending_writes(records: Iterable[Record]) -> list[tuple[str, str, tuple[str, bytes]]]:
    """A checkpoint's pending writes from its writes records (given newest first): ``(task_id, channel, typed)``.

    LangGraph's rule (``WRITES_IDX_MAP``): a regular write (index 0 or more) stored again for the same task and
    index keeps the first value; a special one (an error, an interrupt: a negative index) takes the newest.
    """
    kept: dict[tuple[str, int], tuple[str, str, tuple[str, bytes]]] = {}
    for record in reversed(list(records)):
        task = str(record.item["task"])
        for idx, channel, kind, data in record.item["writes"]:
            slot = (task, int(idx))
            if slot[1] >= 0 and slot in kept:
                continue
            kept[slot] = (task, str(channel), untyped((kind, data)))
    return list(kept.values())


def copies(records: Iterable[Record]) -> list[Message]:
    """New stored messages holding the same records (new message ids), for rewriting a thread's log."""
    copied: list[Message] = []
    for record in records:
        if record.kind == "checkpoint":
            item = record.item
            copied.append(
                checkpoint_record(
                    record.ns,
                    record.checkpoint_id,
                    item.get("parent"),
                    item["checkpoint"],
                    item["metadata"],
                    f"LangGraph checkpoint {record.checkpoint_id}",
                )
            )
        else:
            item = record.item
            copied.append(writes_record(record.ns, record.checkpoint_id, item["task"], item["path"], item["writes"]))
    return copied
