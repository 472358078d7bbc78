"""The soak's checker finds each kind of damage it reports (a checker that cannot fail would prove nothing)."""

from __future__ import annotations

import uuid
from pathlib import Path

from chatkeep.core import Message, SessionKey, open_store
from soak._checker import check
from soak._worker import message_id

TENANT = f"soak-check-{uuid.uuid4().hex[:8]}"  # memory:// stores of one process share their data


def _batch(writer: str, seq: int, size: int) -> list[Message]:
    return [Message(message_id=message_id(writer, seq, i, size), role="user", text="x") for i in range(size)]


def _log(folder: Path, *lines: str) -> None:
    (folder / "p0i0.log").write_text("".join(line + "\n" for line in lines))


def _ack(writer: str, seq: int, session: str, size: int) -> str:
    return f"A {writer} {seq} {session} {size} 1.0 1.1"


async def test_a_clean_history_passes(tmp_path: Path) -> None:
    async with open_store("memory://") as store:
        await store.append(SessionKey(TENANT, "s0"), _batch("w", 0, 2))
        await store.append(SessionKey(TENANT, "s0"), _batch("w", 1, 1))
        _log(tmp_path, _ack("w", 0, "s0", 2), _ack("w", 1, "s0", 1), "R s0 1.0 1.1 " + message_id("w", 0, 0, 2))
        verdict = await check(store, TENANT, 1, str(tmp_path))
    assert verdict.ok, verdict
    assert (verdict.acknowledged, verdict.reads) == (2, 1)


async def test_lost_reordered_torn_and_vanished_are_each_found(tmp_path: Path) -> None:
    key = SessionKey(TENANT, "s0")
    async with open_store("memory://?namespace=checker-damage") as store:
        await store.append(key, _batch("w", 1, 1))
        await store.append(key, _batch("w", 0, 1))  # stored after the writer's next append: reordered
        await store.append(key, _batch("v", 0, 3)[:2])  # two of three messages: torn
        _log(
            tmp_path,
            _ack("w", 0, "s0", 1),
            _ack("w", 1, "s0", 1),
            _ack("u", 0, "s0", 2),  # acknowledged, never stored: lost
            "R s0 1.0 1.1 gone.0000001.0.1",  # seen once, not stored now: vanished
            "A cut short by a kill",  # no newline: the writer died mid-line, ignored
        )
        (tmp_path / "p0i0.log").write_text((tmp_path / "p0i0.log").read_text().rstrip("\n"))
        verdict = await check(store, TENANT, 1, str(tmp_path))
    assert verdict.lost == ["s0/u.0"]
    assert verdict.reordered == ["s0/w: append 0 stored after append 1"]
    assert len(verdict.torn) == 1
    assert "2 of 3" in verdict.torn[0]
    assert verdict.vanished == ["s0/gone.0000001.0.1"]
    assert not verdict.ok
