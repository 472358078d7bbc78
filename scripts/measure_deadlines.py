"""How long a store call and a CLI command take to fail against a closed port and a silent peer, per backend.

A silent peer accepts TCP connections and never sends a byte (a wrong port, a stuck server, a black-holed
proxy); a closed port has nothing listening. Each case runs in a fresh process, capped at ``--cap`` seconds.

    python scripts/measure_deadlines.py [--cap 200] [--jobs 1] [--backends 'redis (resp)',postgresql,...]

Run it with an interpreter that has the backends installed (e.g. a nox venv); it prints a Markdown table. The API
column times the store call alone; the CLI column the whole ``chatkeep sessions list`` process (Python's start and
imports included, about 1 s).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import socket
import subprocess
import sys
import threading
import time

# backend -> URL template ({address} is host:port)
BACKENDS = {
    "redis (resp)": "redis://{address}/0",
    "redis (redis-py)": "redis://{address}/0?transport=redis-py",
    "redis-cluster": "redis+cluster://{address}",
    "postgresql": "postgresql://postgres@{address}/test",
    "mysql": "mysql://root@{address}/test",
    "blob": "azblob://deadlines",
}
BLOB_CONNECTION = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
    "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
    "BlobEndpoint=http://{address}/devstoreaccount1;"
)
# The API case times the call itself (the process's start, imports included, is in the CLI's time).
API = (
    "import asyncio, sys, time\n"
    "from chatkeep.core import SessionKey, open_store\n"
    "async def main():\n"
    "    async with open_store(sys.argv[1]) as store:\n"
    "        started = time.monotonic()\n"
    "        try:\n"
    "            await store.count(SessionKey('t', 's'))\n"
    "        finally:\n"
    "            print(f'CALL {time.monotonic() - started:.1f}')\n"
    "asyncio.run(main())\n"
)


def silent_listener() -> tuple[socket.socket, list[socket.socket]]:
    """A listening socket on loopback whose accepted connections are held open and never written to."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            held.append(connection)

    threading.Thread(target=accept, daemon=True).start()
    return server, held


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(command: list[str], env: dict[str, str], cap: float) -> tuple[str, str]:
    started = time.monotonic()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=cap)
    except subprocess.TimeoutExpired:
        return f"> {cap:g} s (killed)", ""
    took = f"{time.monotonic() - started:.1f}"
    for line in done.stdout.splitlines():
        if line.startswith("CALL "):
            took = line.split()[1]
    last = (done.stderr.strip().splitlines() or [""])[-1]
    return f"{took} s" + ("" if done.returncode else " (exit 0!)"), last[:400]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cap", type=float, default=200)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--jobs", type=int, default=1, help="cases run at once (more skews the times: imports)")
    parser.add_argument("--messages", action="store_true", help="print each case's last stderr line")
    options = parser.parse_args()
    server, _held = silent_listener()
    silent = f"127.0.0.1:{server.getsockname()[1]}"
    cli = [sys.executable, "-m", "chatkeep.core.cli"]
    rows = []
    cases = []
    for backend in options.backends.split(","):
        template = BACKENDS[backend]
        for peer, address in (("closed port", f"127.0.0.1:{closed_port()}"), ("silent peer", silent)):
            env = dict(os.environ)
            if backend == "blob":
                env["AZURE_STORAGE_CONNECTION_STRING"] = BLOB_CONNECTION.format(address=address)
            url = template.format(address=address)
            for how, command in (
                ("API", [sys.executable, "-c", API, url]),
                ("CLI", [*cli, "sessions", "list", "--store", url]),
            ):
                cases.append((backend, peer, how, command, env))
    results: dict[int, tuple[str, str]] = {}

    def work(index: int) -> None:
        _, _, _, command, env = cases[index]
        results[index] = run(command, env, options.cap)

    with concurrent.futures.ThreadPoolExecutor(options.jobs) as pool:
        list(pool.map(work, range(len(cases))))
    print("| backend | peer | via | time to fail |")
    print("|---|---|---|---|")
    for index, (backend, peer, how, _, _) in enumerate(cases):
        took = results[index][0]
        rows.append(f"| {backend} | {peer} | {how} | {took} |")
        print(rows[-1])
    if options.messages:
        for index, (backend, peer, how, _, _) in enumerate(cases):
            print(f"{backend} / {peer} / {how}: {results[index][1]}")
    server.close()


if __name__ == "__main__":
    main()
