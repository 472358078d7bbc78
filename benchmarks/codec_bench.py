"""Decoding a long history: ``decode_records`` beside ``json.loads`` and beside the collector paused around it.

Run with ``python -m benchmarks codec [--rounds N] [--iterations N] [--messages N] [--heap N,N]``; it needs no
server. The history is what an agent keeps: user and assistant texts of about 200 characters, usage on the
assistant's answers, and in every ten messages a tool call and its result. The paths:

* ``json.loads of each record``: plain dicts, no validation (the raw baseline);
* ``decode_records``: the library (one pydantic-core ``validate_json`` call for the batch);
* ``decode_records, GC paused``: the same call between ``gc.disable()`` and ``gc.enable()``, what
  ``decode_records`` itself did for batches of 256 records or more until that was removed (the collector is
  process-wide: every other thread runs without it meanwhile);
* ``orjson.loads, then pydantic``: the other way to the same messages, each record parsed by orjson and the dicts
  validated into messages in one ``validate_python`` call (pydantic validates Python objects more slowly than
  JSON, which it parses itself);
* ``msgspec Structs``: not messages, and not what the library returns: the records decoded and validated by msgspec
  into ``msgspec.Struct`` mirrors of ``Message`` and its contents, what taking ``Message`` off pydantic would buy.

Each path is timed twice per decode: the decode alone, and the decode followed by what a caller does next,
turning the messages into a model request (a dict per message). A paused collector does not skip its work on
the decoded objects, it postpones it: the first collection after ``gc.enable()`` examines them all at once, in
whatever runs next, and the second timing counts that. The collector's cost lands wherever it is triggered,
so each path runs in processes of its own (``--rounds`` of them, in a rotating order, ``--iterations`` decodes
each) to pay for its own collections and no other path's. It all runs again beside a larger heap (a server's:
a full collection walks every live object), made of small dicts holding a list each. The tables give medians;
the summary lines also compare means, since a full collection lands in only some of the decodes, and give the
memory the decoded history holds (traced once per process, after the timed decodes) beside ``json.loads``'s dicts.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import msgspec
import orjson
from pydantic import TypeAdapter

from benchmarks._common import Result, format_table
from chatkeep.core import (
    FunctionCallContent,
    FunctionResultContent,
    Message,
    TextContent,
    Usage,
    UsageContent,
)
from chatkeep.core.backend import decode_records

__all__ = ["main"]

TEXT = "The quick brown fox jumps over the lazy dog. " * 4  # ~180 characters, ~200 with the turn number
RAW = "json.loads of each record"
LIBRARY = "decode_records"
PAUSED = "decode_records, GC paused"
ORJSON = "orjson.loads, then pydantic"
MSGSPEC = "msgspec Structs (no pydantic)"
PATHS = [RAW, LIBRARY, PAUSED, ORJSON, MSGSPEC]
ROOT = Path(__file__).resolve().parents[1]


def history(n: int) -> list[Message]:
    """``n`` messages in turns of ten: texts, usage on answers, a tool call and its result."""
    messages = []
    for i in range(n):
        step = i % 10
        if step == 3:
            call = FunctionCallContent(call_id=f"call_{i}", name="get_weather", arguments='{"city": "Lisbon"}')
            messages.append(Message(role="assistant", contents=[call]))
        elif step == 4:
            result = FunctionResultContent(call_id=f"call_{i - 1}", result={"temperature": 21, "sky": "clear"})
            messages.append(Message(role="tool", contents=[result]))
        elif i % 2 == 0:
            messages.append(Message(role="user", text=f"{i}: {TEXT}"))
        else:
            usage = UsageContent(usage=Usage(input_tokens=1200 + i, output_tokens=40, total_tokens=1240 + i))
            messages.append(Message(role="assistant", contents=[TextContent(text=f"{i}: {TEXT}"), usage]))
    return messages


def _paused(records: list[bytes]) -> list[Message]:
    gc.disable()
    try:
        return decode_records(records)
    finally:
        gc.enable()


_MESSAGES = TypeAdapter(list[Message])


def _orjson_then_pydantic(records: list[bytes]) -> list[Message]:
    dicts = [orjson.loads(r) for r in records]
    for d in dicts:
        del d["v"]
    return _MESSAGES.validate_python(dicts)


# The record's shape in msgspec, as chatkeep would declare it without pydantic (the same fields, tags, defaults and
# refusal of unknown fields); only this benchmark uses it.
class _Struct(msgspec.Struct, forbid_unknown_fields=True, tag_field="type"):
    pass


class _Text(_Struct, tag="text"):
    text: str


class _Call(_Struct, tag="function_call"):
    call_id: str
    name: str
    arguments: str = "{}"


class _Result(_Struct, tag="function_result"):
    call_id: str
    result: Any = None
    is_error: bool = False


class _Data(_Struct, tag="data"):
    data: str
    media_type: str


class _Uri(_Struct, tag="uri"):
    uri: str
    media_type: str | None = None


class _Usage(msgspec.Struct, forbid_unknown_fields=True):
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0


class _UsageContent(_Struct, tag="usage"):
    usage: _Usage


class _Message(msgspec.Struct, forbid_unknown_fields=True):
    v: Literal[1]
    message_id: str
    role: Literal["system", "user", "assistant", "tool"]
    created_at: datetime
    contents: list[_Text | _Call | _Result | _Data | _Uri | _UsageContent] = []
    author_name: str | None = None
    additional_properties: dict[str, Any] = {}


_STRUCTS = msgspec.json.Decoder(list[_Message])


def _request(messages: list[Any]) -> list[dict[str, Any]]:
    """What a client does with a loaded history: one request dict per message."""
    if messages and isinstance(messages[0], dict):
        return [{"role": m["role"], "content": "".join(c.get("text", "") for c in m["contents"])} for m in messages]
    if messages and isinstance(messages[0], _Message):
        return [
            {"role": m.role, "content": "".join(c.text for c in m.contents if isinstance(c, _Text))} for m in messages
        ]
    return [{"role": m.role, "content": m.text} for m in messages]


def _worker(path: str, messages: int, heap: int, iterations: int, warmup: int = 3) -> dict[str, Any]:
    """Run one path over and over in this process, so it pays for the collections it causes and no others."""
    records = [m.to_record().encode() for m in history(messages)]
    decode: Callable[[], list[Any]] = {
        RAW: lambda: [json.loads(r) for r in records],
        LIBRARY: lambda: decode_records(records),
        PAUSED: lambda: _paused(records),
        ORJSON: lambda: _orjson_then_pydantic(records),
        MSGSPEC: lambda: _STRUCTS.decode(b"[" + b",".join(records) + b"]"),
    }[path]
    ballast = [{"n": [i]} for i in range(heap)]
    for _ in range(warmup):
        _request(decode())
    gc.collect()
    alone, used = [], []
    for _ in range(iterations):
        start = time.perf_counter()
        decoded = decode()
        decoded_at = time.perf_counter()
        request = _request(decoded)
        done = time.perf_counter()
        del decoded, request
        alone.append(decoded_at - start)
        used.append(done - start)
    tracemalloc.start()
    decoded = decode()
    held = tracemalloc.get_traced_memory()[0]  # while ``decoded`` is alive: what the history holds
    tracemalloc.stop()
    del decoded
    return {
        "alone": alone,
        "used": used,
        "objects": len(gc.get_objects()) - len(ballast) * 2,  # the ballast's dicts and lists aside
        "bytes": sum(map(len, records)) / len(records),
        "held": held,
    }


def run(
    messages: int, heap: int, rounds: int, iterations: int
) -> tuple[list[Result], list[Result], dict[str, Any], dict[str, float]]:
    """Each path in processes of its own, ``rounds`` processes per path in a rotating order (the machine is
    shared: a load spike then hits every path alike); returns (decode alone, decode then request, details, the
    bytes each path's decoded history holds)."""
    names = PATHS
    alone: dict[str, list[float]] = {name: [] for name in names}
    used: dict[str, list[float]] = {name: [] for name in names}
    held: dict[str, list[int]] = {name: [] for name in names}
    details: dict[str, Any] = {}
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            command = [sys.executable, "-m", "benchmarks.codec_bench", "--worker", name]
            command += ["--messages", str(messages), "--heap", str(heap), "--iterations", str(iterations)]
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
            details = json.loads(done.stdout)
            alone[name] += details["alone"]
            used[name] += details["used"]
            held[name].append(details["held"])
    memory = {n: statistics.median(held[n]) for n in names}
    return (
        [Result(n, messages, alone[n]) for n in names],
        [Result(n, messages, used[n]) for n in names],
        details,
        memory,
    )


def _table(title: str, results: list[Result]) -> str:
    by_name = {r.name: r for r in results}
    return format_table(title, results, lambda r: by_name[RAW], also=("GC paused", lambda r: by_name[PAUSED]))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks codec")
    parser.add_argument("--rounds", type=int, default=3, help="processes per path")
    parser.add_argument("--iterations", type=int, default=7, help="timed decodes per process")
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--heap", default="0,500000", help="extra live dicts (each with a list) to run beside")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args.worker, args.messages, int(args.heap), args.iterations)))
        return
    for heap in (int(h) for h in args.heap.split(",")):
        alone, used, details, memory = run(args.messages, heap, args.rounds, args.iterations)
        what = (
            f"{args.messages:,} records of {details['bytes']:.0f} bytes; {details['objects']:,} other tracked objects "
            f"live, {heap * 2:,} more in the heap; {args.rounds * args.iterations} decodes per path"
        )
        print(_table(f"decode: {what}", alone))
        print()
        print(_table(f"decode, then a model request from the messages: {what}", used))
        print()
        # The mean beside the median: a full collection lands in a fraction of the decodes only.
        for label, results in (("decoding alone", alone), ("with the request built", used)):
            by_name = {r.name: r for r in results}
            raw = by_name[RAW].samples
            for name in PATHS[1:]:
                samples = by_name[name].samples
                print(
                    f"{name} vs {RAW}, {label}: {statistics.median(samples) / statistics.median(raw):.2f}x at p50, "
                    f"{statistics.fmean(samples) / statistics.fmean(raw):.2f}x on average"
                )
        print()
        for name in PATHS:
            mib, times = memory[name] / 2**20, memory[name] / memory[RAW]
            print(f"memory the decoded history holds, {name}: {mib:.1f} MiB, {times:.2f}x {RAW}'s")
        print()
        for label, results in (("decoding alone", alone), ("with the request built", used)):
            by_name = {r.name: r for r in results}
            library, paused = by_name[LIBRARY].samples, by_name[PAUSED].samples
            print(
                f"decode_records without the pause vs with it, {label}: "
                f"{statistics.median(library) / statistics.median(paused):.2f}x at p50, "
                f"{statistics.fmean(library) / statistics.fmean(paused):.2f}x on average"
            )
        print()


if __name__ == "__main__":  # a worker process (see run)
    main(sys.argv[1:])
