"""Run the benchmarks: ``python -m benchmarks [SUITE] [--chart FILE.svg] [...]``, a suite of ``SUITES`` or ``all``.

``nox -s bench`` runs all. ``--chart FILE.svg`` also draws the run's turn tables as a chart (docs/performance.md).
The ``interop-<framework>`` suites need that framework's pins (``nox -s interop_bench``), so ``all`` leaves them out.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import sys
from typing import Any

# codec, sync, telemetry, embedders, forks (on memory://) and ui (a SQLite file) need no server; sql, drivers,
# layers, search, redis, blob and the interop-* suites need the services scripts/ starts.
SUITES = {
    "codec": "benchmarks.codec_bench",
    "sql": "benchmarks.sql_bench",
    "search": "benchmarks.search_bench",
    "redis": "benchmarks.redis_bench",
    "blob": "benchmarks.blob_bench",
    "sync": "benchmarks.sync_bench",
    "drivers": "benchmarks.drivers_bench",
    "layers": "benchmarks.layers_bench",
    "telemetry": "benchmarks.telemetry_bench",
    "embedders": "benchmarks.embedders_bench",
    "forks": "benchmarks.forks_bench",
    "ui": "benchmarks.ui_bench",
}
# An adapter beside its framework's own stores; run one at a time by name (nox -s interop_bench installs the pins).
INTEROP_SUITES = {
    "interop-openai-agents": "benchmarks.interop_openai_agents_bench",
    "interop-agent-framework": "benchmarks.interop_agent_framework_bench",
    "interop-langchain": "benchmarks.interop_langchain_bench",
    "interop-llama-index": "benchmarks.interop_llama_index_bench",
    "interop-langgraph": "benchmarks.interop_langgraph_bench",
    "interop-pydantic-ai": "benchmarks.interop_pydantic_ai_bench",
    "interop-adk": "benchmarks.interop_adk_bench",
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
    if suite not in (*SUITES, *INTEROP_SUITES, "all"):
        known = ", ".join([*SUITES, "all", *INTEROP_SUITES])
        print(f"unknown benchmark {suite!r}; choose one of: {known}", file=sys.stderr)
        return 2
    from benchmarks._common import RECORDED

    rows: list[tuple[str, str, Any, float]] = []  # (suite, table title, result, ratio)
    for name in SUITES if suite == "all" else [suite]:
        module = importlib.import_module({**SUITES, **INTEROP_SUITES}[name])
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
