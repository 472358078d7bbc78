"""The helpers every backend uses instead of its own copy: write stamps, the list_sessions cursor, hashed keys."""

from __future__ import annotations

import threading
from datetime import datetime, timezone

import pytest

from chatkeep.core.backend import (
    decode_cursor,
    encode_cursor,
    hashed_key,
    length_prefixed,
    stamp_time,
    time_stamp,
    write_stamp,
)


def test_write_stamps_increase_strictly_across_threads() -> None:
    per_thread: list[list[int]] = [[] for _ in range(8)]

    def stamp(out: list[int]) -> None:
        out.extend(write_stamp() for _ in range(2_000))

    threads = [threading.Thread(target=stamp, args=(out,)) for out in per_thread]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    every = [s for out in per_thread for s in out]
    assert len(set(every)) == len(every), "two writes of one process got the same stamp"
    assert all(out == sorted(out) and len(set(out)) == len(out) for out in per_thread)


def test_a_stamp_is_the_clock_in_microseconds_and_converts_exactly_both_ways() -> None:
    previous = write_stamp()  # stamps run ahead of the clock after a burst (earlier tests make thousands)
    before = datetime.now(timezone.utc)
    stamp = write_stamp()
    after = datetime.now(timezone.utc)

    assert time_stamp(before) <= stamp <= max(time_stamp(after), previous + 1)
    assert stamp > previous
    assert time_stamp(stamp_time(stamp)) == stamp
    moment = datetime(2026, 12, 2, 23, 59, 59, 999_999, tzinfo=timezone.utc)
    assert stamp_time(time_stamp(moment)) == moment


@pytest.mark.parametrize("fields", [(0, ""), (1_796_259_963_568_176, "Ünïcødé / a%2Fb \x00 \ud800"), ("a", "b", 7)])
def test_a_cursor_gives_back_its_fields(fields: tuple[int | str, ...]) -> None:
    cursor = encode_cursor(*fields)

    assert cursor.isascii()
    assert decode_cursor(cursor, *(type(f) for f in fields)) == fields


@pytest.mark.parametrize(
    "cursor",
    [
        "not base64 !",
        encode_cursor(1),  # too few fields
        encode_cursor(1, "a", "b"),  # too many
        encode_cursor("1", "a"),  # a string where an integer belongs
        "WyJhIl0=",  # base64 of a JSON list with one string
        "dHJ1ZQ==",  # base64 of JSON `true`
        "W3RydWUsICJhIl0=",  # [true, "a"]: a boolean is not an integer
        "/w==",  # not UTF-8
    ],
)
def test_anything_else_is_not_a_cursor(cursor: str) -> None:
    with pytest.raises(ValueError, match="is not a list_sessions cursor"):
        decode_cursor(cursor, int, str)


def test_hashed_keys_keep_every_tuple_of_ids_apart() -> None:
    assert hashed_key("a:b", "c") != hashed_key("a", "b:c")
    assert hashed_key("ab", "") != hashed_key("a", "b")
    assert hashed_key("acme", domain=b"tenant\x00") != hashed_key("acme", domain=b"session\x00")
    assert length_prefixed("é", "") == b"\x00\x00\x00\x02\xc3\xa9\x00\x00\x00\x00"
    assert len(hashed_key("\ud800")) == 32  # a lone surrogate is an id like any other


def test_hashed_keys_are_the_ones_stored_blob_names_were_made_with() -> None:
    # Blob names written before the helper existed must still be found: these digests are what they used.
    assert hashed_key("acme", domain=b"tenant\x00").hex() == (
        "29d6dca18e22044551c8c4774245131be7aaa92c2376656eb0738812c2f80537"
    )
    assert hashed_key("acme", "s/1", domain=b"session\x00").hex() == (
        "baab46e2f37b12f4021834941c71f294a1e987f2364534cef0189ad6b565ba62"
    )
