"""What the benchmarks of the sync-first adapters (LangChain's history, LangGraph's saver) share.

Each measures, per backend, the framework's own stores and the adapter (its sync and async methods) on the same
server or folder, seeded, then timed round by round: a :class:`Backend` holds the paths and how to clean up what
the run made (a SQLite folder, a PostgreSQL schema, Redis keys), and :func:`run` is the command line.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from benchmarks._common import Result, adapter_targets, versus_frameworks

__all__ = ["Backend", "plan", "postgres_schema", "redis_cleanup", "run", "scratch_folder"]

P = TypeVar("P")


@dataclass
class Backend(Generic[P]):
    """A server (or folder) and every path measured on it; ``close`` releases and removes what the run made."""

    name: str
    paths: list[P]
    closers: list[Callable[[], None]] = field(default_factory=list)
    seeded: Callable[[], None] | None = None  # after seeding, before timing (PostgreSQL: ANALYZE)
    note: str = ""  # printed under the backend's table (a framework store that could not run there)

    def close(self) -> None:
        for close in reversed(self.closers):
            close()


def scratch_folder(prefix: str) -> tuple[str, Callable[[], None]]:
    """A new temporary folder for the run's SQLite files, and the call that removes it."""
    folder = tempfile.mkdtemp(prefix=prefix)
    return folder, lambda: shutil.rmtree(folder, ignore_errors=True)


def postgres_schema(url: str, schema: str) -> Callable[[], None]:
    """Create ``schema`` on ``url``'s server (psycopg 3); returns the call that drops it with what it holds."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')

    def drop() -> None:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    return drop


def redis_cleanup(url: str, prefix: str) -> Callable[[], None]:
    """The call that deletes every key of ``url``'s Redis starting with ``prefix-``."""

    def cleanup() -> None:
        import redis

        client = redis.Redis.from_url(url)
        for key in client.scan_iter(f"{prefix}-*", count=1_000):
            client.delete(key)
        client.close()

    return cleanup


def plan(iterations: dict[int, int], size: int, quick: bool) -> tuple[int, int]:
    """(iterations, warmup) per round for a size (``quick``: a fifth, at least 5)."""
    count = iterations[size]
    if quick:
        count = max(5, count // 5)
    return count, max(2, count // 10)


def run(
    argv: list[str],
    *,
    prog: str,
    description: str,
    backends: dict[str, Callable[[str], Backend[Any]]],
    sizes: Sequence[int],
    measure: Callable[[Backend[Any], tuple[int, ...], int, bool], list[Result]],
    title: Callable[[Backend[Any]], str],
    adapter: str,
    stores: str,
    framework: str,
    needs: Sequence[str],
) -> int:
    """The command line: ``--quick``, ``--backends``, ``--sizes``; a Markdown table per backend, then the targets.

    ``measure(backend, sizes, rounds, quick)`` times one backend's paths; ``needs`` are the framework's modules,
    whose absence names the nox session that installs them; ``framework`` is its key in noxfile's ``INTEROP``;
    ``stores`` names what the adapter is compared with (``"LangGraph checkpointer"``).
    """
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run, noisy numbers)")
    parser.add_argument("--backends", default=",".join(backends), help=f"comma-separated, of {', '.join(backends)}")
    parser.add_argument("--sizes", default=",".join(map(str, sizes)), help=f"comma-separated, of {sizes}")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.backends.split(",") if n.strip()]
    unknown = sorted(set(names) - set(backends))
    if unknown:
        parser.error(f"unknown backends {unknown}; choose from {', '.join(backends)}")
    chosen = tuple(int(s) for s in args.sizes.split(",") if s.strip())
    if not chosen or set(chosen) - set(sizes):
        parser.error(f"sizes must be among {', '.join(map(str, sizes))}")
    try:
        for module in needs:
            __import__(module)
    except ImportError as exc:
        print(
            f"{exc.name} is not installed: run nox -s \"interop_bench(framework='{framework}')\", or install the "
            f"pins of INTEROP['{framework}'] in noxfile.py",
            file=sys.stderr,
        )
        return 2
    rounds = 1 if args.quick else 3
    run_id = uuid.uuid4().hex[:8]
    targets: list[str] = []
    for name in names:
        backend = backends[name](run_id)
        try:
            results = measure(backend, chosen, rounds, args.quick)
        finally:
            backend.close()
        print(versus_frameworks(title(backend), results, adapter))
        if backend.note:
            print(f"\n{backend.note}")
        print()
        targets += adapter_targets(backend.name, results, adapter, chosen)
    print(f"### Targets (the sync adapter against each {stores})")
    print()
    print("\n".join(targets) or f"(no {stores} ran on these backends)")
    return 0
