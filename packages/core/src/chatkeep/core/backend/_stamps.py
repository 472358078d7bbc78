"""Write stamps: the time of a write, strictly increasing within the process, so that writes order within a tick."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

__all__ = ["stamp_time", "time_stamp", "write_stamp"]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_lock = threading.Lock()
_last = 0


def write_stamp() -> int:
    """Microseconds since the epoch, strictly after every earlier stamp of this process (from any thread).

    The clock alone can repeat a microsecond, or step back; stamps from this function never do, so two writes of
    one process order by their stamps. Across processes the stamps are the clocks' (no order is promised).
    """
    global _last
    now = time.time_ns() // 1000
    with _lock:
        _last = now = max(now, _last + 1)
    return now


def stamp_time(stamp: int) -> datetime:
    """The UTC time of a stamp (exact to the microsecond)."""
    return _EPOCH + timedelta(microseconds=stamp)


def time_stamp(moment: datetime) -> int:
    """The stamp of a time (an aware one; exact to the microsecond): the inverse of :func:`stamp_time`."""
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
