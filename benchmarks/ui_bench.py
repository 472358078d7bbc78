"""``chatkeep ui``: how long a session's page takes to arrive, for a session of 10 messages and of 100,000.

One table, measured in one run on one store (a SQLite file by default): the full response of ``/session`` (the
store's reads, the rendering, the transfer through the ASGI test client) for

* the newest page of a 10-message session (the baseline) and of a 100-message one (a whole page to render),
* the newest page of a 100,000-message session: what opening a session shows, read with ``load(last=100)``,
* its oldest page and a page in its middle, each read as a range with ``load(last=100, before=p)``.

With ``--browser`` (Playwright and Debian's Chromium, as ``nox -s ui`` installs them), a second table gives the
browser's own navigation timing of the newest pages, from a real server on loopback: when the response's last
byte arrived (``responseEnd``) and the first contentful paint, both from the start of the navigation.

Run with ``python -m benchmarks ui [--url URL] [--iterations N] [--browser]``: N requests of each page (the middle
page N/10, at least 5), and N/5 browser loads of each (at least 10), after 3 rounds of warm-up. Every response must
be a 200: a page that answers an error stops the run rather than timing the error page.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

from benchmarks._common import Result, format_table, measure
from chatkeep.core import Message, SessionKey, open_store
from chatkeep.core.ui import UIConfig, create_app
from chatkeep.testing.browser import CHROMIUM, CHROMIUM_ARGS, serving

__all__ = ["main"]

SMALL, FULL, LARGE = 10, 100, 100_000  # FULL: one whole page (the UI shows 100 messages to a page)
TEXT = "The quick brown fox jumps over the lazy dog. " * 4


async def _seed(url: str, tenant: str) -> None:
    async with open_store(url) as store:
        for size in (SMALL, FULL, LARGE):
            key = SessionKey(tenant, f"session-{size}")
            for start in range(0, size, 1_000):
                role = ("user", "assistant")
                batch = [Message(role=role[n % 2], text=f"{n}: {TEXT}") for n in range(start, min(size, start + 1_000))]
                await store.append(key, batch)


def _responses(url: str, tenant: str, iterations: int) -> list[Result]:
    from starlette.testclient import TestClient

    paths = [
        ("newest page", SMALL, f"/session?tenant={tenant}&id=session-{SMALL}"),
        ("newest page", FULL, f"/session?tenant={tenant}&id=session-{FULL}"),
        ("newest page", LARGE, f"/session?tenant={tenant}&id=session-{LARGE}"),
        ("oldest page", LARGE, f"/session?tenant={tenant}&id=session-{LARGE}&before=100"),
        ("middle page", LARGE, f"/session?tenant={tenant}&id=session-{LARGE}&before={LARGE // 2}"),
    ]
    results = []
    with TestClient(create_app(UIConfig(url, tenant=tenant)), base_url="http://127.0.0.1") as client:
        for name, size, path in paths:
            rounds = iterations if name != "middle page" else max(iterations // 10, 5)

            def fetch(path: str = path) -> None:
                response = client.get(path)
                assert response.status_code == 200, response.text

            results.append(measure(name, size, fetch, iterations=rounds, warmup=3))
    return results


def _first_paint(url: str, tenant: str, iterations: int) -> list[Result]:
    from playwright.sync_api import sync_playwright

    app = create_app(UIConfig(url, tenant=tenant))
    with serving(app) as base, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS))
        page = browser.new_page()
        metrics = {
            "response end": "performance.getEntriesByType('navigation')[0].responseEnd",
            "first contentful paint": "performance.getEntriesByName('first-contentful-paint')[0]?.startTime ?? null",
        }
        sizes = (SMALL, FULL, LARGE)
        samples: dict[tuple[str, int], list[float]] = {(metric, size): [] for metric in metrics for size in sizes}
        for n in range(iterations + 3):
            for size in sizes:  # round robin, so that a drift of the machine weighs on every size alike
                address = urljoin(base, f"session?tenant={tenant}&id=session-{size}")
                response = page.goto(address)
                status = None if response is None else response.status
                if status != 200:  # an error page paints fast too: timing it would be a wrong result
                    raise RuntimeError(f"GET {address} answered {status}, not 200: the benchmark measures nothing")
                for metric, script in metrics.items():
                    value: Any = page.evaluate(script)
                    if n >= 3 and value is not None:  # the first rounds warm the server and the browser up
                        samples[(metric, size)].append(float(value) / 1000)
        results = [Result(metric, size, samples[(metric, size)]) for metric in metrics for size in sizes]
        browser.close()
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks ui")
    parser.add_argument("--url", default=None, help="the store (default: a SQLite file in a temporary folder)")
    parser.add_argument(
        "--iterations",
        type=int,
        default=100,
        help="requests of each page (the middle page: a tenth, at least 5); with --browser, loads of each page in "
        "Chromium: a fifth, at least 10 (default: 100)",
    )
    parser.add_argument("--browser", action="store_true", help="also the first paint in headless Chromium")
    args = parser.parse_args(argv)
    tenant = f"uibench-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as folder:
        url = args.url or f"sqlite:///{Path(folder) / 'ui-bench.db'}"
        asyncio.run(_seed(url, tenant))
        try:
            results = _responses(url, tenant, args.iterations)
            print(format_table(f"chatkeep ui, /session response, {url}", results, lambda _: results[0], versus="10"))
            print()
            if args.browser:
                paints = _first_paint(url, tenant, max(args.iterations // 5, 10))
                firsts = {result.name: result for result in reversed(paints)}  # each metric's 10-message row
                title = "chatkeep ui, newest page in headless Chromium"
                print(format_table(title, paints, lambda result: firsts[result.name], versus="10"))
                print()
        finally:
            asyncio.run(_erase(url, tenant))
    return 0


async def _erase(url: str, tenant: str) -> None:
    async with open_store(url) as store:
        await store.delete_tenant(tenant)
