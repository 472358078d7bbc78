"""The ``chatkeep`` command as a person runs it: real processes, real output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    return subprocess.run(
        [sys.executable, "-m", "chatkeep.core.cli", *args],
        cwd=cwd,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_demo_keeps_a_conversation_across_two_processes_in_the_default_sqlite_store(tmp_path: Path) -> None:
    result = run_cli("demo", "--state-dir", str(tmp_path / "state"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "a SQLite file" in result.stdout
    assert "with 2 stored messages" in result.stdout.split("-- process 2")[1]
    saved = json.loads((tmp_path / "state" / "session.json").read_text(encoding="utf-8"))
    assert "in_memory" not in saved["state"]  # the store holds the history, not the session
    database = f"sqlite:///{(tmp_path / 'state' / 'history.db').resolve()}"
    history = run_cli("sessions", "show", saved["session_id"], "--store", database, cwd=tmp_path)
    assert history.returncode == 0, history.stderr
    lines = history.stdout.splitlines()
    assert lines[0] == f"session {saved['session_id']} (tenant default): 4 messages"
    assert len(lines) == 5
    assert lines[1].endswith("user: Remember that I like Italian food.")
    sessions = run_cli("sessions", "list", "--store", database, cwd=tmp_path)
    row = next(line for line in sessions.stdout.splitlines() if line.startswith(saved["session_id"]))
    assert row.split()[1] == "4"


def test_demo_with_history_in_the_session(tmp_path: Path) -> None:
    result = run_cli("demo", "--in-session", "--state-dir", str(tmp_path / "state"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "offline demo model" in out  # it says plainly that it is not a real model
    first, second = out.split("-- process 2")
    assert "Remember that I like Italian food." in first
    assert "loaded session" in second
    assert "with 2 stored messages" in second
    assert "Earlier you told me: \u201cRemember that I like Italian food.\u201d" in second
    saved = json.loads((tmp_path / "state" / "session.json").read_text(encoding="utf-8"))
    assert saved["type"] == "session"
    assert len(saved["state"]["in_memory"]["messages"]) == 4


def test_demo_with_a_store_that_does_not_survive_the_process_fails_plainly(tmp_path: Path) -> None:
    result = run_cli("demo", "--state-dir", str(tmp_path), "--store", "memory://", cwd=tmp_path)
    assert result.returncode == 1
    assert "not in the stored history" in result.stdout
    assert "the demo failed in process 2" in result.stdout


def test_backends_lists_the_installed_memory_backend(tmp_path: Path) -> None:
    result = run_cli("backends", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].split() == ["BACKEND", "URL", "SCHEMES", "DISTRIBUTION", "VERSION"]
    assert any(line.split()[:3] == ["memory", "memory://", "chatkeep-memory"] for line in result.stdout.splitlines())


@pytest.mark.parametrize(
    ("url", "extra"),
    [("postgresql://bob:hunter2@db/chats", "postgresql"), ("rediss://cache:6380/0?password=hunter2", "redis")],
)
def test_unknown_backend_says_what_to_install_and_hides_the_password(
    tmp_path: Path, url: str, extra: str, install_hint: Callable[[str], str]
) -> None:
    # Only the memory plugin is loaded, as if the other backends were not installed.
    result = run_cli("sessions", "list", "--store", url, cwd=tmp_path, env={"CHATKEEP_PLUGINS": "memory"})
    assert result.returncode == 1
    assert install_hint(extra) in result.stderr
    assert "hunter2" not in result.stderr
    assert "Traceback" not in result.stderr


def test_sessions_list_and_show_on_an_empty_store(tmp_path: Path) -> None:
    sessions = run_cli("sessions", "list", "--store", "memory://cli", cwd=tmp_path)
    assert sessions.returncode == 0, sessions.stderr
    assert "no sessions for tenant 'default'" in sessions.stdout
    history = run_cli("sessions", "show", "abc", "--store", "memory://cli", cwd=tmp_path)
    assert history.returncode == 1
    assert "no session 'abc' in tenant 'default'" in history.stderr


def test_no_command_prints_help(tmp_path: Path) -> None:
    result = run_cli(cwd=tmp_path)
    assert result.returncode == 2
    assert "demo" in result.stdout


def test_sessions_pages_with_the_command_it_prints(tmp_path: Path) -> None:
    import asyncio
    import shlex

    from chatkeep.core import Message, SessionKey, open_store

    url = f"sqlite:///{tmp_path / 'paging.db'}"

    async def seed() -> None:
        async with open_store(url) as store:
            for i in range(3):
                await store.append(SessionKey("acme", f"chat-{i}"), [Message(role="user", text=f"hello {i}")])

    asyncio.run(seed())
    first = run_cli("sessions", "list", "--store", url, "--tenant", "acme", "--limit", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    listed = [line.split()[0] for line in first.stdout.splitlines() if line.startswith("chat-")]
    assert listed == ["chat-2", "chat-1"]  # newest first
    hint = next(line for line in first.stdout.splitlines() if line.startswith("more sessions: chatkeep "))
    second = run_cli(*shlex.split(hint.removeprefix("more sessions: chatkeep ")), cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert [line.split()[0] for line in second.stdout.splitlines() if line.startswith("chat-")] == ["chat-0"]
    assert "more sessions" not in second.stdout


def test_a_bad_cursor_is_reported_without_a_traceback(tmp_path: Path) -> None:
    result = run_cli("sessions", "list", "--store", "memory://x", "--cursor", "bogus", cwd=tmp_path)
    assert result.returncode == 1
    assert "cursor" in result.stderr
    assert "Traceback" not in result.stderr
