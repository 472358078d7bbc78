"""The README's example as a newcomer runs it: after the README's own install line, against a model server.

The example's store must be one the install line installs (this environment has every extra, so running it
alone would not show a missing one), and the example must run as written.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from chatkeep.core._known_backends import KNOWN_SCHEMES
from chatkeep.testing.openai_server import FakeOpenAIServer

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def readme() -> str:
    return README.read_text(encoding="utf-8")


def example() -> str:
    """The README's first Python block: the example a newcomer copies."""
    return next(text for language, text in BLOCK.findall(readme()) if language == "python")


def install_extras() -> set[str]:
    """The chatkeep-core extras of the README's install line (``pip install "chatkeep-core[...]"``)."""
    line = re.search(r'^pip install "chatkeep-core\[([\w,-]+)\]"', readme(), re.MULTILINE)
    assert line, "the README has no install line"
    return set(line[1].split(","))


def test_the_examples_store_is_installed_by_the_install_line() -> None:
    urls = re.findall(r'history="([^"]+)"', example())
    assert urls, "the example names no store"
    for url in urls:
        scheme = url.split("://", 1)[0]
        extra = KNOWN_SCHEMES[scheme][1]
        assert extra in install_extras(), f"the example uses {url}, which the install line's extras do not install"
    assert "openai" in install_extras()  # the example's OpenAIChatClient


def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    (tmp_path / "example.py").write_text(example(), encoding="utf-8")
    with FakeOpenAIServer() as server:
        server.reply_text("Noted: you like Italian food.")
        server.reply_text("You like Italian food.")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CHATKEEP_"))}
        env |= {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "test-key", "OPENAI_MODEL": "test-model"}
        done = subprocess.run(
            [sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "You like Italian food."
        resumed = [(m["role"], m["content"]) for m in server.requests[1]["messages"] if m["role"] != "system"]
    assert resumed == [  # the resumed session's history came back from the store
        ("user", "Remember that I like Italian food."),
        ("assistant", "Noted: you like Italian food."),
        ("user", "What food do I like?"),
    ]


def test_the_readme_example_runs_offline_with_the_swap_the_readme_describes(tmp_path: Path) -> None:
    text = readme()
    assert "`OfflineChatClient().as_agent(`" in text
    assert "from chatkeep.core.offline import OfflineChatClient" in text
    offline = example().replace(
        "from chatkeep.core.openai import OpenAIChatClient", "from chatkeep.core.offline import OfflineChatClient"
    )
    offline = re.sub(r"OpenAIChatClient\(\)\.as_agent\(", "OfflineChatClient().as_agent(", offline)
    assert "OpenAIChatClient" not in offline, "the example's client line changed: update the README's offline note"
    (tmp_path / "example.py").write_text(offline, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CHATKEEP_"))}
    env["OPENAI_BASE_URL"] = "http://127.0.0.1:9"  # nothing listens: any attempt to reach a model would fail
    done = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    # The second run was sent the first one's turn: it came back from the store.
    assert "Earlier you told me: \u201cRemember that I like Italian food.\u201d" in done.stdout
