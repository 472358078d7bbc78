"""``chatkeep ui`` in a real browser: Debian's headless Chromium, driven by Playwright, on the seeded SQLite store.

Nothing downloads a browser: ``scripts/chromium`` installs Debian's package (``nox -s ui`` runs it first), and
Playwright is pointed at ``/usr/bin/chromium``. Screenshots of the main pages are saved to
``$CHATKEEP_UI_SCREENSHOTS`` (default: a folder of the test run); docs/ui.md shows copies of them.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chatkeep.core.ui import UIConfig
from chatkeep.testing.browser import CHROMIUM, CHROMIUM_ARGS
from chatkeep.testing.services import missing_service

TENANT = "acme"  # as conftest seeds it
TOKEN = "browser-token-0123456789abcdef"


def expect(target: Any) -> Any:
    """Playwright's ``expect`` (imported here: Playwright is only in the ui session), whose assertions retry
    until they hold or time out: a page a click navigates to may not be shown yet when the click returns."""
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(target)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing_service('Playwright is not installed: run the tests with nox -s ui (dependency group "ui")')
    if not shutil.which(CHROMIUM):
        missing_service(f"no Chromium at {CHROMIUM}: run scripts/chromium install (apt-get install chromium)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS))
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    problems: list[str] = []
    opened.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    opened.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    yield opened
    context.close()
    # A script the CSP blocked, or a failing one, shows here: the pages must work under their own policy.
    assert problems == []


@pytest.fixture(scope="session")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = os.environ.get("CHATKEEP_UI_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_the_sessions_list(page: Any, served: Any, shots: Path) -> None:
    page.goto(served.base)
    rows = page.locator("table.sessions tbody tr")
    assert rows.count() == 5
    assert page.get_by_role("link", name="Planning a trip to Lisbon").is_visible()
    fork_row = rows.filter(has_text="tool-chat-fork")
    assert fork_row.locator("a.parent").inner_text() == "tool-chat"
    assert page.locator("text=globex").count() == 0
    page.screenshot(path=shots / "sessions.png", full_page=True)


def test_a_session_with_tool_calls_and_a_long_result(page: Any, served: Any, shots: Path) -> None:
    page.goto(served.base)
    page.locator("a.session-link[href$='id=tool-chat']").click()
    call = page.locator("#call-call-forecast")
    expect(call).to_be_visible()
    assert call.locator(".tool-name").inner_text() == "get_forecast"
    result = call.locator(".result details.long")
    assert result.count() == 1
    assert not result.evaluate("node => node.open")
    assert not call.locator(".result pre").is_visible()
    result.locator("summary").click()
    assert call.locator(".result pre").is_visible()
    assert '"sky": "sunny"' in call.locator(".result pre").inner_text()
    assert "14:05" in page.locator("#call-call-time .result").inner_text()  # the short result, open, with its call
    page.get_by_role("button", name="Collapse all").click()  # the script's buttons (the CSP let it run)
    assert not call.locator(".result pre").is_visible()
    page.get_by_role("button", name="Expand all").click()
    assert call.locator(".result pre").is_visible()
    page.screenshot(path=shots / "session.png", full_page=True)


def test_paging_through_1000_messages(page: Any, served: Any, seeded: Any) -> None:
    page.goto(f"{served.base}session?id=long-chat")
    assert "messages 901–1,000 of 1,000" in page.locator(".pager .range").first.inner_text()
    for n in range(9):
        page.locator("a.older").first.click()
        first, last = 801 - 100 * n, 900 - 100 * n
        # expect() waits for the next page: right after a click, the one before may still be shown
        expect(page.locator(".pager .range").first).to_contain_text(f"messages {first:,}–{last:,} of 1,000")
    assert page.locator("article.msg").first.locator(".text").inner_text() == "message 0"
    assert page.locator("a.older").count() == 0
    page.locator("a.newest").first.click()
    expect(page.locator("article.msg").last).to_have_id(f"m-{seeded.long_ids[-1]}")


def test_following_a_fork_to_its_parent(page: Any, served: Any, seeded: Any, shots: Path) -> None:
    page.goto(f"{served.base}session?id=tool-chat-fork")
    assert page.locator("#fork-point").is_visible()
    page.screenshot(path=shots / "fork.png", full_page=True)
    page.locator("td.fork a.parent").click()
    expect(page.locator("h1")).to_have_text("Weather tools")
    page.wait_for_url(f"**#m-{seeded.through}")
    # The fragment's target is set as the page settles, not always when the click returns: wait for it (a timeout
    # fails the test, as the assertion did).
    page.wait_for_function("id => document.getElementById(id)?.matches(':target')", arg=f"m-{seeded.through}")


def test_a_tag_filter(page: Any, served: Any) -> None:
    page.goto(served.base)
    page.locator(".tag-filter input[name=tag]").fill("tools")
    page.locator(".tag-filter button").click()
    expect(page.locator("h1")).to_have_text("Sessions tagged tools")
    assert "tag=tools" in page.url
    expect(page.locator("table.sessions tbody tr")).to_have_count(2)  # tool-chat and its fork (forks keep tags)


def test_a_search_leads_to_the_message(page: Any, served: Any, shots: Path) -> None:
    page.goto(served.base)
    page.locator(".search input[name=q]").fill("Should I bring a coat, or expect warm temperatures?")
    page.locator(".search button").click()
    answer = page.locator(".hits li.hit").first
    # the fact, found by meaning: the question shares no word with it (expect() waits for the results page)
    expect(answer).to_contain_text("sunny and 24 degrees")
    page.screenshot(path=shots / "search.png", full_page=True)
    answer.locator("a").click()
    page.wait_for_url("**/session?*#*")
    target = page.url.split("#", 1)[1]
    assert page.locator(f"[id='{target}']").evaluate("node => node.matches(':target')")
    assert "24 degrees" in page.locator(f"[id='{target}']").inner_text()


def test_a_hostile_message_renders_as_text(page: Any, served: Any, seeded: Any) -> None:
    page.goto(f"{served.base}session?id=hostile%3Cscript%3E")
    assert page.locator("article.msg .text").inner_text() == seeded.hostile
    assert page.locator("article.msg .author").inner_text() == "<b>mallory</b>"
    assert page.evaluate("window.__pwned") is None
    page.goto(served.base)
    assert page.evaluate("window.__pwned") is None


def test_the_store_page(page: Any, served: Any, shots: Path) -> None:
    page.goto(f"{served.base}store")
    assert page.locator("#session-count").inner_text() == "5"
    assert re.search(r"\d+\.\d ms", page.locator("table.facts").inner_text())
    page.screenshot(path=shots / "store.png", full_page=True)


def test_the_token_is_enforced_beyond_loopback(browser: Any, seeded: Any, serve_ui: Any) -> None:
    with serve_ui(UIConfig(seeded.url, tenant=TENANT, token=TOKEN), host="0.0.0.0") as running:
        context = browser.new_context()
        page = context.new_page()
        refused = page.goto(running.base)
        assert refused.status == 401
        assert "needs its token" in page.content()
        page.goto(f"{running.base}session?id=tool-chat&token={TOKEN}")
        assert "token=" not in page.url  # the link's token became a cookie and left the address bar
        expect(page.locator("h1")).to_have_text("Weather tools")
        page.get_by_role("link", name="Store").click()
        expect(page.locator("h1")).to_have_text("Store")  # the page the click navigates to, once it is shown
        context.close()
        stranger = browser.new_context()
        assert stranger.new_page().goto(f"{running.base}store").status == 401
        stranger.close()
