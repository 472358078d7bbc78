"""docs/getting-started.md as a newcomer runs it: its agent and every ``$ chatkeep`` command, output compared.

The page's Python block is saved and run, then each ``$`` line of its text blocks runs in a new process, in
order, in one folder, and prints what the page says it prints. Times, latencies and random ids may differ;
``...`` on the page stands for the rest of a long reply. The Redis copy goes under a key prefix of its own.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

from chatkeep.core import open_store
from chatkeep.testing.services import missing_service

PAGE = Path(__file__).resolve().parents[1] / "docs" / "getting-started.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
REDIS = "redis://127.0.0.1:6379/0"
# What may differ from the page on another run: wall-clock times, latencies, the doctor's probe tenant; and "...",
# which stands for the rest of a long reply. Each: (how the page shows it, what the output may hold there).
VARIABLE = {
    "time": (r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d",) * 2,
    "ms": (r"\d+\.\d ms",) * 2,
    "probe": ("chatkeep-doctor-[0-9a-f]{12}",) * 2,
    "rest": (r"\.\.\.", ".*"),
}
ON_THE_PAGE = re.compile("|".join(f"(?P<{name}>{shown})" for name, (shown, _) in VARIABLE.items()))


def blocks() -> list[tuple[str, str]]:
    """The page's fenced blocks, as (language, text)."""
    return BLOCK.findall(PAGE.read_text(encoding="utf-8"))


def pattern(shown: str) -> re.Pattern[str]:
    """A regular expression for an output line as the page shows it (spaces collapsed; see VARIABLE)."""
    text, parts, start = " ".join(shown.split()), [], 0
    for variable in ON_THE_PAGE.finditer(text):
        parts += [re.escape(text[start : variable.start()]), VARIABLE[str(variable.lastgroup)][1]]
        start = variable.end()
    return re.compile("".join([*parts, re.escape(text[start:])]))


def assert_printed(command: str, shown: list[str], printed: str, *, subset: bool = False) -> None:
    """``printed`` matches the page's lines for ``command``, line by line (or, with ``subset``, holds each one)."""
    lines = [" ".join(line.split()) for line in printed.splitlines()]
    if subset:
        missing = [line for line in shown if not any(pattern(line).fullmatch(got) for got in lines)]
        assert not missing, f"{command}: the page shows {missing}, the command printed {lines}"
        return
    assert len(lines) == len(shown), f"{command}: the page shows {len(shown)} lines, the command printed {lines}"
    for line, got in zip(shown, lines, strict=True):
        assert pattern(line).fullmatch(got), f"{command}: the page shows\n  {line}\nthe command printed\n  {got}"


def session(text: str) -> list[tuple[str, list[str]]]:
    """A terminal session as the page shows it: each ``$`` command with the lines it printed."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:].strip(), []))
        else:
            steps[-1][1].append(line)
    for _, shown in steps:
        while shown and not shown[-1].strip():  # the blank line between one command and the next
            shown.pop()
    return steps


def run(argv: list[str], cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CHATKEEP_STORE"))}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{shlex.join(argv)} exited {done.returncode}: {done.stderr}"
    return done.stdout + done.stderr


async def delete_acme(url: str) -> None:
    async with open_store(url) as store:
        await store.delete_tenant("acme")


def test_every_command_of_the_getting_started_page_prints_what_the_page_shows(tmp_path: Path) -> None:
    try:
        asyncio.run(delete_acme(f"{REDIS}?prefix=ck-probe-{uuid.uuid4().hex[:8]}"))
    except Exception as exc:  # the page's copy goes to a Redis server on this machine
        missing_service(f"Redis at {REDIS} is unreachable ({type(exc).__name__}: {exc})")
    prefix = f"demo-{uuid.uuid4().hex[:12]}"
    found = blocks()
    python = [i for i, (language, _) in enumerate(found) if language == "python"]
    assert len(python) == 1, "the page has one program, the agent"
    commands = 0
    try:
        for index, (language, text) in enumerate(found):
            if language == "python":
                (tmp_path / "agent.py").write_text(text, encoding="utf-8")
                printed = run([sys.executable, "agent.py"], tmp_path)
                # The page wraps the reply, one line, over two.
                assert_printed("python agent.py", [" ".join(found[index + 1][1].split())], printed)
                continue
            if language != "text" or not text.startswith("$ "):
                continue
            for command, shown in session(text):
                argv = shlex.split(command.replace("?prefix=demo", f"?prefix={prefix}"))
                assert argv[0] == "chatkeep", f"the page runs {command!r}, not a chatkeep command"
                printed = run([sys.executable, "-m", "chatkeep.core.cli", *argv[1:]], tmp_path)
                printed = printed.replace(f"?prefix={prefix}", "?prefix=demo")  # as the page names it
                # The page's output comes from an install of its extras only; other backends may be here too.
                assert_printed(command, shown, printed, subset=command == "chatkeep backends")
                commands += 1
    finally:
        asyncio.run(delete_acme(f"{REDIS}?prefix={prefix}"))
    assert commands >= 8, f"only {commands} commands found on the page"  # backends ... prune
