"""The soak's verdict: the whole stored history checked against what the workers logged."""

from __future__ import annotations

import glob
import os
from collections import defaultdict
from dataclasses import dataclass, field

from chatkeep.core import HistoryStore, SessionKey


@dataclass
class Verdict:
    """What one backend's run did and what the checker found."""

    acknowledged: int = 0  # appends acknowledged to a writer
    reads: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # ChatkeepError kind -> count (retried)
    unexpected: list[str] = field(default_factory=list)  # exceptions of other types: always a failure
    lost: list[str] = field(default_factory=list)  # acknowledged appends missing, wholly or partly
    duplicated: list[str] = field(default_factory=list)  # message ids stored more than once
    reordered: list[str] = field(default_factory=list)  # a writer's appends out of its order
    torn: list[str] = field(default_factory=list)  # appends stored in part or not contiguously
    vanished: list[str] = field(default_factory=list)  # ids a reader saw that are no longer stored
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (start, end) of every call that returned

    @property
    def ok(self) -> bool:
        return not (self.unexpected or self.lost or self.duplicated or self.reordered or self.torn or self.vanished)


def _parse_id(message_id: str) -> tuple[str, int, int, int] | None:
    parts = message_id.split(".")
    if len(parts) != 4:
        return None
    writer, seq, index, size = parts
    return writer, int(seq), int(index), int(size)


def read_logs(folder: str, verdict: Verdict) -> tuple[dict[tuple[str, int], tuple[str, int]], dict[str, set[str]]]:
    """The acknowledged appends ``(writer, seq) -> (session, size)`` and the ids readers saw, per session."""
    acked: dict[tuple[str, int], tuple[str, int]] = {}
    seen: dict[str, set[str]] = defaultdict(set)
    for path in sorted(glob.glob(os.path.join(folder, "*.log"))):
        with open(path, encoding="utf-8") as lines:
            for raw in lines:
                fields = raw.split()
                if not raw.endswith("\n") or not fields:
                    continue  # the line a SIGKILL cut short
                kind = fields[0]
                if kind == "A":
                    _, writer, seq, session, size, start, end = fields
                    acked[(writer, int(seq))] = (session, int(size))
                    verdict.latencies.append((float(start), float(end)))
                elif kind == "R":
                    _, session, start, end, ids = fields
                    verdict.reads += 1
                    verdict.latencies.append((float(start), float(end)))
                    if ids != "-":
                        seen[session].update(ids.split(","))
                elif kind == "E":
                    verdict.errors[fields[1]] = verdict.errors.get(fields[1], 0) + 1
                elif kind == "X":
                    verdict.unexpected.append(" ".join(fields[1:]))
    verdict.acknowledged = len(acked)
    return acked, seen


async def check(store: HistoryStore, tenant: str, sessions: int, folder: str) -> Verdict:
    """Read every session back in full and compare it with the workers' logs."""
    verdict = Verdict()
    acked, seen = read_logs(folder, verdict)
    for number in range(sessions):
        session = f"s{number}"
        ids = [m.message_id async for m in store.iter_messages(SessionKey(tenant, session))]
        position: dict[str, int] = {}
        for at, message_id in enumerate(ids):
            if message_id in position:
                verdict.duplicated.append(f"{session}/{message_id}")
            position.setdefault(message_id, at)
        # Every stored append is whole and contiguous; each writer's appends keep its order.
        appends: dict[tuple[str, int], list[int]] = defaultdict(list)
        for message_id, at in position.items():
            parsed = _parse_id(message_id)
            if parsed is None:
                verdict.torn.append(f"{session}/{message_id} (not a soak id)")
                continue
            writer, seq, _, _ = parsed
            appends[(writer, seq)].append(at)
        last_by_writer: dict[str, tuple[int, int]] = {}
        for (writer, seq), places in sorted(appends.items(), key=lambda item: min(item[1])):
            size = _parse_id(ids[places[0]])[3]  # type: ignore[index]
            if len(places) != size or max(places) - min(places) != size - 1:
                verdict.torn.append(f"{session}/{writer}.{seq}: {len(places)} of {size} messages at {sorted(places)}")
            previous = last_by_writer.get(writer)
            if previous is not None and previous[0] > seq:
                verdict.reordered.append(f"{session}/{writer}: append {seq} stored after append {previous[0]}")
            last_by_writer[writer] = (seq, min(places))
        for (writer, seq), (acked_session, size) in acked.items():
            if acked_session == session and len(appends.get((writer, seq), [])) != size:
                verdict.lost.append(f"{session}/{writer}.{seq}")
        verdict.vanished += [f"{session}/{i}" for i in sorted(seen.get(session, set()) - position.keys())]
    return verdict
