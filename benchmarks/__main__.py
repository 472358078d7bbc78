"""Run the benchmarks: ``python -m benchmarks [codec|sql|redis|blob|all|interop-...] [--chart FILE.svg] [options]``.

``nox -s bench`` runs all. ``--chart FILE.svg`` also draws the run's turn tables as a chart (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import sys
from typing import Any

# codec needs no server; sql, redis and blob need the services scripts/ starts.
SUITES = {
    "codec": "benchmarks.codec_bench",
    "sql": "benchmarks.sql_bench",
    "redis": "benchmarks.redis_bench",
    "blob": "benchmarks.blob_bench",
}
# Each needs its framework's pinned packages (nox -s interop_bench), so "all" leaves them out.
INTEROP_SUITES = {
    "interop-agent-framework": "benchmarks.interop_agent_framework_bench",
}


def main(argv: list[str]) -> int:
    chart = None
    if "--chart" in argv:
        at = argv.index("--chart")
        if at + 1 >= len(argv):
            print("--chart needs a file name, for example --chart docs/assets/turns.svg", file=sys.stderr)
            return 2
        chart, argv = argv[at + 1], argv[:at] + argv[at + 2 :]
    suite, rest = (argv[0], argv[1:]) if argv and not argv[0].startswith("-") else ("all", argv)
    known = {**SUITES, **INTEROP_SUITES}
    if suite not in (*known, "all"):
        print(f"unknown benchmark {suite!r}; choose one of: {', '.join(known)}, all", file=sys.stderr)
        return 2
    from benchmarks._common import RECORDED

    rows: list[tuple[str, str, Any, float]] = []  # (suite, table title, result, ratio)
    for name in SUITES if suite == "all" else [suite]:
        module = importlib.import_module(known[name])
        start = len(RECORDED)
        result = module.main(rest)
        if inspect.iscoroutine(result):
            result = asyncio.run(result)
        rows += [(name, title, row, value) for title, row, value in RECORDED[start:]]
        if result:
            return int(result)
    if chart is not None:
        from benchmarks._chart import write_chart

        print(f"chart of {write_chart(chart, rows)} turn rows written to {chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
