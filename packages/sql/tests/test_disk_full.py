"""A full disk: a clear StoreFullError, nothing acknowledged lost, an intact file, and writes again once there is room.

SQLite runs on a small tmpfs of the test's own (mounting one needs root, which CI has); PostgreSQL's and
MySQL's "disk full" errors are checked on the drivers' own exception types, since filling a shared server's
disk is not an option.
"""

from __future__ import annotations

import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chatkeep.core import Message, SessionKey, StoreFullError, StoreUnavailableError
from chatkeep.sql import SQLHistoryStore
from chatkeep.sql._errors import disk_full, translate
from chatkeep.testing.services import missing_service

FS_BYTES = 3 * 1024 * 1024
FILLER_BYTES = 1024 * 1024


@pytest.fixture
def small_disk(tmp_path: Path, sql_target: Any) -> Iterator[Path]:
    """A 3 MiB tmpfs mounted for this test (unmounted afterwards), holding a 1 MiB filler file."""
    if sql_target.family != "sqlite":
        pytest.skip("a test of SQLite files: it runs in the SQLite session")
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        missing_service(
            f"a small tmpfs to fill could not be mounted ({mounted.stderr.strip() or mounted.returncode}); "
            "this test needs root (CAP_SYS_ADMIN): run it as root, as CI does"
        )
    try:
        (mount_point / "filler").write_bytes(b"\0" * FILLER_BYTES)
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


async def _fill(store: SQLHistoryStore, key: SessionKey, batch: int) -> tuple[list[str], StoreFullError]:
    """Append ``batch`` messages at a time until the disk is full: the texts acknowledged, and the error."""
    acknowledged: list[str] = []
    for n in range(FS_BYTES // 1000):  # more than fits: each append stores over 1,000 bytes
        texts = [f"{n}/{i}:" + "x" * 600 for i in range(batch)]
        try:
            await store.append(key, [Message(role="user", text=text) for text in texts])
        except StoreFullError as exc:
            return acknowledged, exc
        acknowledged += texts
    raise AssertionError(f"{len(acknowledged)} messages fit on a {FS_BYTES}-byte disk: it never filled")


@pytest.mark.parametrize("driver", ["sqlite", "sqlite+aiosqlite"])
@pytest.mark.parametrize("batch", [2, 40], ids=["short-inline", "long-thread"])
async def test_a_full_disk_raises_store_full_keeps_every_acknowledged_append_and_recovers(
    small_disk: Path, driver: str, batch: int
) -> None:
    path = small_disk / "history.db"
    store = SQLHistoryStore(f"{driver}:///{path}")
    key = SessionKey("t", "full")
    try:
        acknowledged, error = await _fill(store, key, batch)
        assert isinstance(error, StoreUnavailableError)  # handlers of an unavailable store still catch it
        assert "has no room left" in str(error)
        assert "Free space" in str(error)
        assert "without a restart" in str(error)
        assert isinstance(error.__cause__, sqlite3.Error | OSError)
        assert len(acknowledged) >= 20 * batch, "the disk filled before the test appended anything"
        # Nothing acknowledged is lost, nothing of the failed append is there, and the file is sound.
        assert [m.text for m in await store.load(key)] == acknowledged
        assert await store.count(key) == len(acknowledged)
        check = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        finally:
            check.close()
        # Room again: the same store object takes appends, no restart.
        (small_disk / "filler").unlink()
        assert await store.append(key, [Message(role="user", text="after")]) == 1
        assert [m.text for m in await store.load(key)] == [*acknowledged, "after"]
    finally:
        await store.close()


def _driver_errors() -> Iterator[tuple[str, BaseException, bool]]:
    """(label, an error as the driver raises it, whether it means a full disk)."""
    import asyncpg  # type: ignore[import-untyped]
    import psycopg
    from asyncmy import errors as asyncmy_errors
    from sqlalchemy.exc import OperationalError

    pg_full = asyncpg.exceptions.DiskFullError("could not extend file: No space left on device")
    yield "asyncpg disk_full", pg_full, True
    yield "asyncpg other", asyncpg.exceptions.UniqueViolationError("duplicate key"), False
    wrapped = OperationalError("INSERT ...", {}, Exception("adapted"))
    wrapped.__cause__ = pg_full
    yield "SQLAlchemy wrapping asyncpg", wrapped, True
    yield "psycopg disk_full", psycopg.errors.DiskFull("could not extend file"), True
    yield "asyncmy table full", asyncmy_errors.OperationalError(1114, "The table 'chatkeep_messages' is full"), True
    yield "asyncmy disk full", asyncmy_errors.OperationalError(1021, "Disk full (/tmp/x); waiting..."), True
    yield "asyncmy gone away", asyncmy_errors.OperationalError(2006, "MySQL server has gone away"), False
    yield "ENOSPC", OSError(28, "No space left on device"), True
    yield "connection refused", ConnectionRefusedError(111, "Connection refused"), False
    yield "sqlite locked", sqlite3.OperationalError("database is locked"), False


_DRIVER_ERRORS = list(_driver_errors())


@pytest.mark.parametrize(("label", "error", "full"), _DRIVER_ERRORS, ids=[label for label, _, _ in _DRIVER_ERRORS])
def test_disk_full_errors_of_every_driver_become_store_full(label: str, error: BaseException, full: bool) -> None:
    assert disk_full(error) is full, label
    translated = translate(error, description="sqlite:///x.db", hint="retry", statement_timeout=None)
    assert isinstance(translated, StoreFullError) is full
    assert ("has no room left" in str(translated)) is full
