"""The backends a soak runs on: where the store lives, and which faults can be injected on the way to it.

Every target is reached through a :class:`LoopbackProxy` where there is a network (so cuts, black holes and
outages break the path, never a shared server), and a target with a private server instance can restart it.
The shared PostgreSQL and MariaDB are only ever faulted through the proxy.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import random
import shutil
import signal
import time
import uuid
from pathlib import Path

from chatkeep.testing.faults import LoopbackProxy, free_cluster_ports, free_port

ROOT = Path(__file__).resolve().parents[1]
AZURITE_BIN = ROOT / ".services" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
POSTGRES_URL = os.environ.get("CHATKEEP_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("CHATKEEP_TEST_MYSQL_URL", "mysql+asyncmy://root@127.0.0.1:3306/test")


class Target:
    """One backend under soak. ``url`` is what the workers open; ``check_url`` what the checker reads through."""

    name = ""
    #: fault kinds this target supports beyond killing writer processes
    faults: tuple[str, ...] = ()

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.url = ""
        self.check_url = ""
        self.env: dict[str, str] = {}  # the workers' environment
        self.check_env: dict[str, str] = {}  # what the checker's differs in (it skips the proxy)
        self.proxy: LoopbackProxy | None = None

    async def start(self) -> None:
        """Start what the target needs (a proxy, a private server)."""

    async def stop(self) -> None:
        """Stop what :meth:`start` started."""
        if self.proxy is not None:
            await self.proxy.aclose()

    async def _proxy(self, port: int) -> int:
        self.proxy = LoopbackProxy(port)
        return await self.proxy.start()

    async def inject(self, kind: str, seconds: float) -> None:
        """Inject one fault for about ``seconds``, then heal it."""
        proxy = self.proxy
        if kind == "cut" and proxy is not None:
            proxy.cut()
        elif kind == "blackhole" and proxy is not None:
            proxy.blackhole = True
            await asyncio.sleep(seconds)
            proxy.restore()
            proxy.cut()  # connections whose replies were dropped are out of step: a real client would drop them too
        elif kind == "outage" and proxy is not None:
            proxy.down()
            await asyncio.sleep(seconds)
            proxy.restore()
        elif kind == "restart":
            await self.restart(seconds)
        else:
            raise ValueError(f"target {self.name} has no fault {kind!r}")

    async def restart(self, seconds: float) -> None:
        """Stop the private server instance, wait, start it again."""
        raise ValueError(f"target {self.name} has no private server to restart")


class SQLite(Target):
    name = "sqlite"

    async def start(self) -> None:
        self.url = self.check_url = f"sqlite:///{self.workdir / 'soak.db'}"


class ServerSQL(Target):
    """A shared SQL server behind a proxy (never restarted: other work uses it)."""

    faults = ("cut", "blackhole", "outage")
    server_url = ""

    async def start(self) -> None:
        scheme, rest = self.server_url.split("://", 1)
        credentials, location = rest.rsplit("@", 1)
        hostport, database = location.split("/", 1)
        port = int(hostport.rsplit(":", 1)[1])
        proxied = await self._proxy(port)
        self.url = f"{scheme}://{credentials}@127.0.0.1:{proxied}/{database}"
        self.check_url = self.server_url


class PostgreSQL(ServerSQL):
    name = "postgresql"
    server_url = POSTGRES_URL


class MySQL(ServerSQL):
    name = "mysql"
    server_url = MYSQL_URL


class PrivateServer(Target, abc.ABC):
    """A target with a server process of its own on a free port, behind a proxy, that a fault restarts."""

    faults = ("cut", "blackhole", "outage", "restart")
    #: how a restart stops the server: SIGKILL, or SIGTERM for one that must save its data on the way out
    stop_signal = signal.SIGKILL
    start_seconds = 10.0  # how long the server may take to listen

    @abc.abstractmethod
    def command(self) -> list[str]:
        """The command line that starts the server on :attr:`port`, its data under :attr:`workdir`."""

    async def start(self) -> None:
        self.port = free_port()
        self.process: asyncio.subprocess.Process | None = None
        await self._start_server()
        await self._proxy(self.port)

    async def _start_server(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            *self.command(), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        deadline = time.monotonic() + self.start_seconds
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"the private {self.name} server on port {self.port} did not start")

    async def _stop_server(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(self.stop_signal)
            await self.process.wait()

    async def restart(self, seconds: float) -> None:
        await self._stop_server()
        await asyncio.sleep(seconds)
        await self._start_server()

    async def stop(self) -> None:
        await super().stop()
        await self._stop_server()


class Redis(PrivateServer):
    """A private redis-server with an fsync'd append-only file, so a SIGKILL restart keeps every acknowledged write."""

    name = "redis"

    def command(self) -> list[str]:
        folder = self.workdir / "redis"
        folder.mkdir(exist_ok=True)
        return [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--dir", str(folder),
            "--appendonly", "yes", "--appendfsync", "always",
        ]  # fmt: skip

    async def start(self) -> None:
        await super().start()
        assert self.proxy is not None
        self.url = f"redis://127.0.0.1:{self.proxy.port}/0?socket_timeout=2"
        self.check_url = f"redis://127.0.0.1:{self.port}/0"


class Blob(PrivateServer):
    """A private Azurite keeping its data on disk, behind a proxy; restarted gracefully (see the docs)."""

    name = "blob"
    stop_signal = signal.SIGTERM  # Azurite writes its metadata out on SIGTERM; a SIGKILL would lose some of it
    start_seconds = 20.0  # Node.js starts slowly

    def command(self) -> list[str]:
        location = self.workdir / "azurite"
        location.mkdir(exist_ok=True)
        return [
            str(AZURITE_BIN), "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--location", str(location),
            "--skipApiVersionCheck", "--loose", "--silent", "--disableTelemetry",
        ]  # fmt: skip

    async def start(self) -> None:
        if not AZURITE_BIN.exists():
            raise RuntimeError(f"{AZURITE_BIN} is missing; run scripts/azurite up (it installs Azurite)")
        await super().start()
        assert self.proxy is not None
        container = f"soak-{uuid.uuid4().hex[:12]}"
        self.url = self.check_url = f"azblob://{container}?read_timeout=5"
        self.env = {"AZURE_STORAGE_CONNECTION_STRING": _azurite(self.proxy.port)}
        self.check_env = {"AZURE_STORAGE_CONNECTION_STRING": _azurite(self.port)}


class RedisCluster(Target):
    """A private 3+3 Redis Cluster (scripts/redis-cluster --replicas) written with ``wait_replicas=1``.

    Its fault is a failover: a master is SIGKILLed, its replica takes over, and once the cluster is whole again
    the killed node comes back as a replica. Nothing is persisted, so the replica's copy is all there is.
    """

    name = "redis-cluster"
    faults = ("failover",)

    async def start(self) -> None:
        self.ports = free_cluster_ports(6)
        self.folder = self.workdir / "cluster"
        await self._script("up")
        nodes = ",".join(f"127.0.0.1:{p}" for p in self.ports[:2])
        self.check_url = f"redis+cluster://{nodes}"
        self.url = f"{self.check_url}?wait_replicas=1&wait_timeout_ms=1000&socket_timeout=2"

    async def _script(self, *args: str) -> None:
        env = {
            **os.environ,
            "CHATKEEP_REDIS_CLUSTER_PORTS": " ".join(map(str, self.ports)),
            "CHATKEEP_REDIS_CLUSTER_DIR": str(self.folder),
        }
        process = await asyncio.create_subprocess_exec(
            str(ROOT / "scripts" / "redis-cluster"), *args, "--replicas", env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        output, _ = await process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"scripts/redis-cluster {' '.join(args)} failed: {output.decode()}")

    async def _nodes(self, avoid: int) -> list[tuple[int, str]]:
        """(port, flags) of every node, as a live node other than ``avoid`` sees them."""
        from redis.asyncio import Redis as Client

        for port in self.ports:
            if port == avoid:
                continue
            client = Client(port=port, socket_timeout=1, socket_connect_timeout=1, decode_responses=True)
            try:
                text = await client.execute_command("CLUSTER", "NODES")  # type: ignore[no-untyped-call]
            except Exception:
                continue
            finally:
                await client.aclose()
            rows = [line.split() for line in text.splitlines()]
            return [(int(address.split("@")[0].rsplit(":", 1)[1]), flags) for _, address, flags, *_ in rows]
        raise RuntimeError("no node of the private cluster answers")

    async def inject(self, kind: str, seconds: float) -> None:
        if kind != "failover":
            await super().inject(kind, seconds)
            return
        masters = [port for port, flags in await self._nodes(avoid=0) if "master" in flags and "fail" not in flags]
        victim = random.choice(masters)
        os.kill(int((self.folder / str(victim) / "redis.pid").read_text()), signal.SIGKILL)
        # Back only once its replica has taken over: a node without data returning first would wipe the replica.
        for _ in range(300):
            await asyncio.sleep(0.1)
            flags = dict(await self._nodes(avoid=victim))
            if "fail" in flags.get(victim, "") and sum("master" in f and "fail" not in f for f in flags.values()) == 3:
                break
        else:
            raise RuntimeError(f"no replica took over from the killed master on port {victim}")
        await asyncio.sleep(seconds)
        await self._script("node-up", str(victim))

    async def stop(self) -> None:
        await self._script("down")


def _azurite(port: int) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={AZURITE_KEY};"
        f"BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;"
    )


TARGETS: dict[str, type[Target]] = {t.name: t for t in (SQLite, PostgreSQL, MySQL, Redis, RedisCluster, Blob)}


def clean(workdir: Path) -> None:
    """Remove a target's working folder."""
    shutil.rmtree(workdir, ignore_errors=True)
