"""A database server that crashes under a writer and comes back: every acknowledged append is there, whole.

The shared servers are never stopped: each test makes a private PostgreSQL (``initdb``) or MariaDB
(``mariadb-install-db``) in a temporary folder, on a free port, with the engine's default durability
settings (PostgreSQL ``synchronous_commit=on``, ``fsync=on``; InnoDB ``innodb_flush_log_at_trx_commit=1``).
The crash is PostgreSQL's immediate shutdown (SIGQUIT: no checkpoint, crash recovery at the next start) or
a SIGKILL of ``mariadbd``. The test runs in the session of the engine it crashes (``CHATKEEP_TEST_SQL_URL``).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from chatkeep.core import Message, SessionKey, StoreUnavailableError
from chatkeep.sql import SQLHistoryStore
from chatkeep.testing.faults import free_port
from chatkeep.testing.services import missing_service

BATCH = 5
CRASH_AFTER = 20  # acknowledged appends before the crash


class PrivateServer(abc.ABC):
    """A database server of the test's own, in a temporary folder, that the test may crash and start again."""

    user: str  # the OS account the server runs as when the tests run as root (servers refuse root)

    def __init__(self) -> None:
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="chatkeep-private-db-"))
        self.process: asyncio.subprocess.Process | None = None
        self.as_root = os.geteuid() == 0
        if self.as_root:
            os.chown(self.folder, pwd.getpwnam(self.user).pw_uid, -1)

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """The store URL of a database on this server."""

    @abc.abstractmethod
    async def create(self) -> None:
        """Make the data folder (initdb)."""

    @abc.abstractmethod
    def command(self) -> list[str]:
        """The server's command line."""

    @abc.abstractmethod
    async def ready(self) -> bool:
        """Whether the server answers (and has the database the URL names)."""

    async def run(self, *argv: str) -> None:
        process = await asyncio.create_subprocess_exec(
            *argv,
            user=self.user if self.as_root else None,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({process.returncode}): {output.decode(errors='replace')[-2000:]}")

    def _open_log(self) -> Any:
        return open(self.folder / "server.log", "ab")  # the server keeps writing to it after start() returns

    async def start(self) -> None:
        log = self._open_log()
        self.process = await asyncio.create_subprocess_exec(
            *self.command(), user=self.user if self.as_root else None, stdout=log, stderr=log
        )
        log.close()
        for _ in range(300):
            if self.process.returncode is not None:
                break
            if await self.ready():
                return
            await asyncio.sleep(0.1)
        tail = (self.folder / "server.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"the private server on port {self.port} did not start: {tail}")

    @abc.abstractmethod
    async def crash(self) -> None:
        """Stop the server the hard way (no clean shutdown, no checkpoint)."""

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


class PrivatePostgres(PrivateServer):
    user = "postgres"

    def __init__(self, bindir: Path) -> None:
        super().__init__()
        self.bindir = bindir

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    async def create(self) -> None:
        await self.run(str(self.bindir / "initdb"), "-D", str(self.folder / "data"), "-A", "trust", "-U", "postgres")

    def command(self) -> list[str]:
        return [
            str(self.bindir / "postgres"), "-D", str(self.folder / "data"), "-p", str(self.port),
            "-k", str(self.folder), "-c", "listen_addresses=127.0.0.1",
        ]  # fmt: skip

    async def ready(self) -> bool:
        import asyncpg  # type: ignore[import-untyped]

        try:
            conn = await asyncpg.connect(host="127.0.0.1", port=self.port, user="postgres", timeout=1)
        except (OSError, asyncpg.PostgresError, asyncio.TimeoutError):
            return False
        await conn.close()
        return True

    async def crash(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGQUIT)  # immediate shutdown: every backend quits, recovery at the next start
        await self.process.wait()


class PrivateMariaDB(PrivateServer):
    user = "mysql"

    @property
    def url(self) -> str:
        return f"mysql+asyncmy://root@127.0.0.1:{self.port}/test"

    async def create(self) -> None:
        await self.run(
            "mariadb-install-db", "--no-defaults", f"--datadir={self.folder / 'data'}",
            "--auth-root-authentication-method=normal", "--skip-test-db",
        )  # fmt: skip

    def command(self) -> list[str]:
        return [
            "mariadbd", "--no-defaults", f"--datadir={self.folder / 'data'}", f"--port={self.port}",
            "--bind-address=127.0.0.1", f"--socket={self.folder / 'mysqld.sock'}",
            f"--pid-file={self.folder / 'mysqld.pid'}",
        ]  # fmt: skip

    async def ready(self) -> bool:
        import asyncmy  # type: ignore[import-untyped]

        try:
            conn = await asyncmy.connect(host="127.0.0.1", port=self.port, user="root", connect_timeout=1)
        except (OSError, asyncmy.errors.Error):
            return False
        try:
            async with conn.cursor() as cur:
                await cur.execute("CREATE DATABASE IF NOT EXISTS test CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        finally:
            conn.close()
        return True

    async def crash(self) -> None:
        assert self.process is not None
        self.process.kill()  # mariadbd is one process: SIGKILL is a crash
        await self.process.wait()


def _postgres_bindir() -> Path | None:
    initdb = shutil.which("initdb") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))), None)
    return Path(os.path.realpath(initdb)).parent if initdb else None


@pytest_asyncio.fixture(loop_scope="function")
async def private_server(sql_target: Any) -> AsyncIterator[PrivateServer]:
    """A private server of the engine under test, started (stopped and removed at the end)."""
    server: PrivateServer
    if sql_target.family == "postgresql":
        bindir = _postgres_bindir()
        if bindir is None or not (bindir / "postgres").exists():
            missing_service(
                "PostgreSQL's initdb and postgres are not installed; the crash test starts a private server"
            )
        server = PrivatePostgres(bindir)
    elif sql_target.family == "mysql":
        if shutil.which("mariadbd") is None or shutil.which("mariadb-install-db") is None:
            missing_service("mariadbd and mariadb-install-db are not installed; the crash test starts a private server")
        server = PrivateMariaDB()
    else:
        pytest.skip("SQLite has no server to crash; its process-crash tests are the kill tests")
    try:
        await server.create()
        await server.start()
        yield server
    finally:
        await server.stop()


@pytest.mark.reliability
async def test_acknowledged_appends_survive_a_server_crash_and_the_store_reconnects(
    private_server: PrivateServer,
) -> None:
    store = SQLHistoryStore(private_server.url, connect_timeout=3)
    key = SessionKey("crash", "s")
    acknowledged: list[int] = []
    enough = asyncio.Event()

    async def writer() -> None:
        for n in range(100_000):
            batch = [Message(role="user", text=f"{n}/{i}") for i in range(BATCH)]
            try:
                await store.append(key, batch)
            except StoreUnavailableError:
                return  # the server is gone: this append was never acknowledged
            acknowledged.append(n)
            if len(acknowledged) >= CRASH_AFTER:
                enough.set()

    task = asyncio.create_task(writer())
    try:
        await asyncio.wait_for(enough.wait(), 120)
        await private_server.crash()  # while the writer is mid-append
        await asyncio.wait_for(task, 60)
        await private_server.start()  # the same data folder: crash recovery replays the log
        # The same store object: its dead pooled connections are replaced, no restart of the application.
        stored = [m.text for m in await store.load(key)]
        appends: dict[int, list[str]] = {}
        for text in stored:
            appends.setdefault(int(text.split("/")[0]), []).append(text)
        missing = sorted(set(acknowledged) - set(appends))
        assert not missing, f"acknowledged appends {missing} are gone after the crash"
        for n, texts in appends.items():
            assert texts == [f"{n}/{i}" for i in range(BATCH)], f"append {n} is partial or out of order"
        assert sorted(appends) == list(range(len(appends))), "an append is missing between stored ones"
        assert await store.append(key, [Message(role="user", text="after")]) == 1
    finally:
        await store.close()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
