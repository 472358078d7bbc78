"""The service scripts' ``up`` and a server already on their port: reused, unless CI requires its own.

With ``CHATKEEP_REQUIRE_OWN_SERVICES=1`` (what ``.ci/run`` sets), ``scripts/redis-cluster``, ``scripts/azurite``
and ``scripts/pgvector`` reuse only a server this checkout started (its pid file names the listening process);
anything else fails ``up``, naming the process on the port, and is left running. The foreign server of these
tests is a socket of the test process itself, on a free port: nothing shared is touched.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from chatkeep.testing.faults import free_cluster_ports, free_port
from chatkeep.testing.services import missing_service

ROOT = Path(__file__).resolve().parents[1]


def run(script: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "CHATKEEP_REQUIRE_OWN_SERVICES"}
    return subprocess.run(
        [str(ROOT / "scripts" / script), *args], env={**environment, **env}, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def foreign_port() -> Iterator[int]:
    """A port on which this test process listens: a server no service script started."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


def _on_port(script: str, port: int, tmp_path: Path) -> dict[str, str]:
    """The environment that points ``script`` at ``port`` (and, for the cluster, at a folder of the test's own)."""
    if script == "azurite":
        return {"CHATKEEP_AZURITE_PORT": str(port)}
    if script == "pgvector":
        return {"CHATKEEP_PGVECTOR_PORT": str(port)}
    return {
        "CHATKEEP_REDIS_CLUSTER_PORTS": " ".join(map(str, [port, free_port(), free_port()])),
        "CHATKEEP_REDIS_CLUSTER_DIR": str(tmp_path / "cluster"),
    }


# Each script once, with each spelling the variable accepts.
@pytest.mark.parametrize(("script", "required"), [("redis-cluster", "1"), ("azurite", "true"), ("pgvector", "YES")])
def test_up_refuses_a_server_it_did_not_start_when_ci_requires_its_own(
    script: str, required: str, foreign_port: int, tmp_path: Path
) -> None:
    done = run(
        script, "up", env={**_on_port(script, foreign_port, tmp_path), "CHATKEEP_REQUIRE_OWN_SERVICES": required}
    )
    assert done.returncode == 1, done.stdout + done.stderr
    # What is on the port: this process, by pid and command line.
    assert f"scripts/{script}: 127.0.0.1:{foreign_port} is taken by a server this checkout did not start" in done.stderr
    assert f"pid {os.getpid()}: " in done.stderr
    assert "CHATKEEP_REQUIRE_OWN_SERVICES is set, so it is not reused" in done.stderr
    # Refused before anything was installed, started or stopped: the foreign server still accepts connections.
    assert not (tmp_path / "cluster").exists()
    with socket.create_connection(("127.0.0.1", foreign_port), timeout=5):
        pass


def test_a_cluster_this_checkout_started_is_reused_and_another_only_without_the_requirement(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        missing_service("redis-server and redis-cli are not installed (Debian: apt-get install redis-server)")
    ports = " ".join(map(str, free_cluster_ports(3)))
    ours = {"CHATKEEP_REDIS_CLUSTER_PORTS": ports, "CHATKEEP_REDIS_CLUSTER_DIR": str(tmp_path / "ours")}
    # Another checkout's view of the same ports: its folder holds no pid file of theirs.
    elsewhere = {**ours, "CHATKEEP_REDIS_CLUSTER_DIR": str(tmp_path / "elsewhere")}
    started = run("redis-cluster", "up", env=ours)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        assert "redis cluster: running on" in started.stdout
        again = run("redis-cluster", "up", env={**ours, "CHATKEEP_REQUIRE_OWN_SERVICES": "1"})
        assert (again.returncode, again.stdout.strip()) == (0, f"redis cluster: already running on 127.0.0.1:{ports}")
        refused = run("redis-cluster", "up", env={**elsewhere, "CHATKEEP_REQUIRE_OWN_SERVICES": "1"})
        assert refused.returncode == 1
        assert f"127.0.0.1:{ports.split()[0]} is taken by a server this checkout did not start" in refused.stderr
        assert "redis-server 127.0.0.1:" in refused.stderr  # the process on the port, by its command line
        reused = run("redis-cluster", "up", env=elsewhere)
        assert (reused.returncode, reused.stdout.strip()) == (0, f"redis cluster: already running on 127.0.0.1:{ports}")
    finally:
        stopped = run("redis-cluster", "down", env=ours)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr


@pytest.fixture
def foreign_redis(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], list[int]]]:
    """A standalone redis-server on the first of three free cluster ports (no script started it), and the ports."""
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        missing_service("redis-server and redis-cli are not installed (Debian: apt-get install redis-server)")
    ports = free_cluster_ports(3)
    foreign = subprocess.Popen(
        ["redis-server", "--port", str(ports[0]), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
    )
    try:
        while _ping(ports[0]) != "PONG":
            assert foreign.poll() is None, "the test's redis-server did not start"
        yield foreign, ports
    finally:
        foreign.terminate()
        foreign.wait(timeout=30)


def _ping(port: int) -> str:
    return subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True).stdout.strip()


def test_up_never_stops_a_redis_it_did_not_start(
    tmp_path: Path, foreign_redis: tuple[subprocess.Popen[bytes], list[int]]
) -> None:
    # A server on one of the cluster's ports that is no healthy cluster: up used to shut it down (SHUTDOWN NOSAVE)
    # and put a node of its own there. It fails instead, with or without the requirement, and leaves it running.
    foreign, ports = foreign_redis
    port = ports[0]
    done = run(
        "redis-cluster",
        "up",
        env={
            "CHATKEEP_REDIS_CLUSTER_PORTS": " ".join(map(str, ports)),
            "CHATKEEP_REDIS_CLUSTER_DIR": str(tmp_path / "c"),
        },
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"127.0.0.1:{port} is taken by a server this checkout did not start (pid {foreign.pid}: " in done.stderr
    assert "it is no healthy cluster, and this script stops only the nodes it started" in done.stderr
    info = subprocess.run(["redis-cli", "-p", str(port), "info", "server"], capture_output=True, text=True)
    assert f"process_id:{foreign.pid}\n" in info.stdout  # the same server, still running
    assert "redis_mode:standalone" in info.stdout


def test_down_under_the_requirement_stops_only_the_nodes_this_checkout_started(
    tmp_path: Path, foreign_redis: tuple[subprocess.Popen[bytes], list[int]]
) -> None:
    # .ci/run stops its services on exit: it must not stop a Redis it refused to use (without the requirement,
    # `down` stops whatever answers on the cluster's ports, as it always did).
    foreign, ports = foreign_redis
    env = {
        "CHATKEEP_REDIS_CLUSTER_PORTS": " ".join(map(str, ports)),
        "CHATKEEP_REDIS_CLUSTER_DIR": str(tmp_path / "c"),
        "CHATKEEP_REQUIRE_OWN_SERVICES": "1",
    }
    done = run("redis-cluster", "down", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _ping(ports[0]) == "PONG"  # still running
    assert foreign.poll() is None
