"""Run the benchmarks: ``python -m benchmarks [sql|redis|blob|all] [options]`` (``nox -s bench`` runs all)."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import sys

SUITES = {"sql": "benchmarks.sql_bench", "redis": "benchmarks.redis_bench", "blob": "benchmarks.blob_bench"}


def main(argv: list[str]) -> int:
    suite, rest = (argv[0], argv[1:]) if argv and not argv[0].startswith("-") else ("all", argv)
    if suite not in (*SUITES, "all"):
        print(f"unknown benchmark {suite!r}; choose one of: {', '.join(SUITES)}, all", file=sys.stderr)
        return 2
    for name in SUITES if suite == "all" else [suite]:
        module = importlib.import_module(SUITES[name])
        result = module.main(rest)
        if inspect.iscoroutine(result):
            result = asyncio.run(result)
        if result:
            return int(result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
