"""Every ``chatkeep`` command end to end, in-process on memory:// and SQLite files, bad input included.

``memory://NAME`` lives in the process, so these tests call ``chatkeep.core.cli.main`` directly; the real
processes (pipes, a terminal-less stdin, the chat resumed in a second process) are in the last tests. Each
backend's nox session runs the commands on that backend through the kit's ``CLIConformance``
(``packages/*/tests/test_cli.py``), a copy killed with SIGKILL and rerun included.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from chatkeep.core import (
    AgentSession,
    HistoryStore,
    Message,
    MessageFormatError,
    SessionKey,
    open_store,
)
from chatkeep.core.backend import BackendSpec, SupportsExistenceCheck, hookimpl
from chatkeep.core.cli import _transfer, main
from chatkeep.core.cli._app import duration
from chatkeep.core.plugins import default_registry, register_plugin
from chatkeep.memory import MemoryHistoryStore
from chatkeep.sql._schema import key_hash
from chatkeep.testing.conformance._cli import conversation


class CLI:
    """Runs ``chatkeep`` in this process and returns (exit status, stdout, stderr)."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    def __call__(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(list(args))
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *args: str) -> Any:
        code, out, err = self(*args, "--json")
        assert code == 0, err
        return json.loads(out)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> CLI:
    return CLI(capsys)


@pytest.fixture
def memory_url() -> str:
    return f"memory://cli-{uuid.uuid4().hex}"


@pytest.fixture(params=["memory", "sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return f"memory://cli-{uuid.uuid4().hex}"
    return f"sqlite:///{tmp_path / 'cli.db'}"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def seed(url: str, tenant: str = "acme", sessions: int = 3, *, document: bool = True) -> list[SessionKey]:
    keys = []
    async with open_store(url) as store:
        for i in range(sessions):
            key = SessionKey(tenant, f"chat-{i}")
            if document and i == 1:
                session = AgentSession(session_id="chat-1", tenant=tenant, state={"memo": {"likes": "pasta"}})
                await store.save_session(key, session, owner="bob")
            await store.append(key, conversation(i))
            keys.append(key)
    return keys


async def records(url: str, key: SessionKey) -> list[str]:
    async with open_store(url) as store:
        return [m.to_record() async for m in store.iter_messages(key)]


async def snapshot(url: str, tenant: str) -> dict[str, Any]:
    """Everything a tenant holds: each session's records and its document with owner."""
    result: dict[str, Any] = {}
    async with open_store(url) as store:
        page = await store.list_sessions(tenant, limit=1000)
        for info in page.items:
            key = SessionKey(tenant, info.session_id)
            stored = await store.load_session(key)
            result[info.session_id] = (
                [m.to_record() for m in await store.load(key)],
                None if stored is None else (stored.session.to_dict(), stored.owner),
            )
    return result


async def delete_tenant(url: str, tenant: str) -> int:
    async with open_store(url) as store:
        return await store.delete_tenant(tenant)


async def count(url: str, key: SessionKey) -> int:
    store: HistoryStore
    async with open_store(url) as store:
        return await store.count(key)


# -- usage ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus"],
        ["sessions"],
        ["sessions", "show"],
        ["copy", "--from", "memory://a"],
        ["prune", "--store", "memory://a", "--tenant", "t"],
        ["sessions", "list", "--limit", "0"],
    ],
)
def test_usage_errors_exit_2_without_a_traceback(cli: CLI, argv: list[str]) -> None:
    code, out, err = cli(*argv)
    assert code == 2
    assert "Traceback" not in out + err


def test_help_exits_0(cli: CLI) -> None:
    code, out, _ = cli("--help")
    assert code == 0
    for command in ("backends", "doctor", "sessions", "export", "import", "copy", "prune", "migrate", "chat"):
        assert command in out


@pytest.mark.parametrize(("text", "seconds"), [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("45s", 45)])
def test_durations(text: str, seconds: int) -> None:
    assert duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "30", "d", "0d", "-1d", "1.5h", "3x", "12 hours"])
def test_bad_durations_are_refused(text: str) -> None:
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="30d, 12h, 90m"):
        duration(text)


@pytest.mark.parametrize("text", ["99999999999d", "800000d", "99999999999999999999999w"])
def test_ages_beyond_the_calendar_are_a_usage_error(cli: CLI, memory_url: str, text: str) -> None:
    code, out, err = cli("prune", "--store", memory_url, "--tenant", "acme", "--older-than", text, "--yes")
    assert (code, out) == (2, "")
    assert "reaches before the year 1; give an age of at most a few thousand years" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["sessions", "delete", "chat-0", "--tenant", "", "--yes"],
        ["sessions", "list", "--tenant", ""],
        ["sessions", "show", "chat-0", "--tenant", ""],
        ["prune", "--tenant", "", "--older-than", "1s", "--yes"],
        ["export", "--tenant", ""],
        ["import", "--tenant", "", "-i", "x.jsonl"],
        ["copy", "--from", "memory://elsewhere", "--to", "STORE", "--tenant", ""],
        ["chat", "--tenant", "", "--session", "chat-0"],
        ["export", "--session", ""],
        ["sessions", "show", ""],
    ],
)
def test_an_empty_tenant_or_session_id_is_refused_not_taken_for_the_default(
    cli: CLI, memory_url: str, argv: list[str]
) -> None:
    run(seed(memory_url, "default", 1, document=False))
    before = run(snapshot(memory_url, "default"))
    code, out, err = cli(
        *[memory_url if arg == "STORE" else arg for arg in argv],
        *(["--store", memory_url] if "copy" not in argv else []),
    )
    assert (code, out) == (2, "")
    assert "is empty (an unset shell variable?); give its name" in err
    assert run(snapshot(memory_url, "default")) == before  # the default tenant was not touched


@pytest.mark.parametrize("argv", [["sessions", "list"], ["sessions", "delete", "chat-0", "--yes"], ["doctor"]])
def test_an_empty_store_url_is_refused_not_taken_for_the_default_store(
    cli: CLI, memory_url: str, monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    run(seed(memory_url, "default", 1, document=False))
    monkeypatch.setenv("CHATKEEP_STORE", memory_url)  # what an empty --store would otherwise fall back to
    code, out, err = cli(*argv, "--store", "")
    assert (code, out) == (2, "")
    assert "the store URL is empty (an unset shell variable?)" in err
    assert run(count(memory_url, SessionKey("default", "chat-0"))) == 4


def test_the_store_comes_from_chatkeep_store_when_no_store_is_given(
    cli: CLI, memory_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(seed(memory_url))
    monkeypatch.setenv("CHATKEEP_STORE", memory_url)
    listed = cli.json("sessions", "list", "--tenant", "acme")
    assert [s["session_id"] for s in listed["sessions"]] == ["chat-2", "chat-1", "chat-0"]


# -- backends and doctor -------------------------------------------------------------------------


def test_backends_json(cli: CLI) -> None:
    report = cli.json("backends")
    memory = next(b for b in report["backends"] if b["name"] == "memory")
    assert memory["schemes"] == ["memory"]
    assert memory["distribution"] == "chatkeep-memory"
    assert set(memory) == {"name", "schemes", "distribution", "version", "description"}
    assert report["broken"] == []


def test_doctor_on_sqlite_reports_each_check_the_schema_and_leaves_nothing(cli: CLI, tmp_path: Path) -> None:
    from chatkeep.sql import SCHEMA_REVISION

    url = f"sqlite:///{tmp_path / 'doctor.db'}"
    report = cli.json("doctor", "--store", url)
    assert report["ok"] is True
    assert report["schema_revision"] == SCHEMA_REVISION
    assert [c["name"] for c in report["checks"]] == [
        "connect",
        "schema",
        "write",
        "read back",
        "clean up",
        "sessions",
    ]
    assert all(c["ok"] for c in report["checks"])
    assert all(isinstance(c["ms"], float) for c in report["checks"] if c["name"] != "schema")
    assert run(count(url, SessionKey(report["probe_tenant"], "probe"))) == 0

    code, out, _ = cli("doctor", "--store", url)
    assert code == 0
    assert out.splitlines()[-1] == "the store works"
    assert any(line.startswith("schema") and f"revision {SCHEMA_REVISION}" in line for line in out.splitlines())


def test_doctor_on_memory_has_no_schema(cli: CLI, memory_url: str) -> None:
    report = cli.json("doctor", "--store", memory_url)
    assert report["ok"] is True
    assert report["schema_revision"] is None
    assert "schema" not in [c["name"] for c in report["checks"]]


def test_doctor_on_an_unreachable_server_says_what_to_fix(cli: CLI) -> None:
    url = "postgresql+asyncpg://u:hunter2@127.0.0.1:1/x?connect_timeout=2"
    code, out, err = cli("doctor", "--store", url)
    assert code == 1
    assert "connect  FAILED" in out
    assert "fix: start the server" in out
    assert "hunter2" not in out + err
    assert "Traceback" not in out + err
    code, out, _ = cli("doctor", "--store", url, "--json")
    assert code == 1
    report = json.loads(out)
    assert report["ok"] is False
    assert report["error"]["type"] == "StoreUnavailableError"
    assert report["checks"] == [{"name": "connect", "ok": False, "ms": None, "detail": "see the error below"}]


def test_doctor_on_an_unknown_scheme(cli: CLI) -> None:
    code, out, _ = cli("doctor", "--store", "nosuch://x", "--json")
    assert code == 1
    report = json.loads(out)
    assert report["error"]["type"] == "UnknownBackendError"
    assert "chatkeep backends" in report["fix"]


def test_an_unknown_store_url_is_an_error_with_json_on_stderr(cli: CLI) -> None:
    code, out, err = cli("sessions", "list", "--store", "nosuch://x", "--json")
    assert code == 1
    assert out == ""
    assert json.loads(err)["error"]["type"] == "UnknownBackendError"


# -- sessions ------------------------------------------------------------------------------------


def test_sessions_list_pages_newest_first_with_counts(cli: CLI, store_url: str) -> None:
    run(seed(store_url, sessions=3))
    first = cli.json("sessions", "list", "--store", store_url, "--tenant", "acme", "--limit", "2")
    assert [s["session_id"] for s in first["sessions"]] == ["chat-2", "chat-1"]
    assert {s["message_count"] for s in first["sessions"]} == {4}
    assert set(first["sessions"][0]) == {
        *("session_id", "tenant", "message_count", "created_at", "updated_at", "damaged"),
        *("title", "tags", "metadata", "usage", "forked_from"),
    }
    assert first["sessions"][0]["damaged"] is None
    assert first["sessions"][0]["updated_at"].endswith("+00:00")
    second = cli.json("sessions", "list", "--store", store_url, "--tenant", "acme", "--cursor", first["next_cursor"])
    assert [s["session_id"] for s in second["sessions"]] == ["chat-0"]
    assert second["next_cursor"] is None
    code, out, _ = cli("sessions", "list", "--store", store_url, "--tenant", "acme")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["SESSION", "MESSAGES", "CREATED", "(UTC)", "UPDATED", "(UTC)"]
    assert [line.split()[:2] for line in lines[1:]] == [["chat-2", "4"], ["chat-1", "4"], ["chat-0", "4"]]
    assert len({len(line) for line in lines[1:]}) == 1  # aligned


def test_sessions_show_renders_the_transcript_with_tool_calls(cli: CLI, store_url: str) -> None:
    run(seed(store_url))
    code, out, _ = cli("sessions", "show", "chat-1", "--store", store_url, "--tenant", "acme")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "session chat-1 (tenant acme): 4 messages"
    assert lines[1].endswith("user: weather in Paris? #1")
    assert lines[2] == "    thanks \u2603"  # continuation lines are indented
    assert lines[3].endswith('assistant: -> calls weather({"city": "Paris"}) [call-1]')
    assert lines[4].endswith('tool: <- result of [call-1]: {"celsius": 21}')
    assert lines[5].endswith("assistant: It is 21 \u00b0C in Paris.")

    shown = cli.json("sessions", "show", "chat-1", "--store", store_url, "--tenant", "acme")
    assert [json.dumps(r, separators=(",", ":"), ensure_ascii=False) for r in shown["messages"]] == run(
        records(store_url, SessionKey("acme", "chat-1"))
    )
    last = cli.json("sessions", "show", "chat-1", "--store", store_url, "--tenant", "acme", "--last", "1")
    assert [Message.model_validate({k: v for k, v in r.items() if k != "v"}).text for r in last["messages"]] == [
        "It is 21 \u00b0C in Paris."
    ]


def test_sessions_delete_refuses_without_yes_when_stdin_is_not_a_terminal(
    cli: CLI, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(seed(store_url))
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))  # an answer is there, but no terminal to ask on
    code, _, err = cli("sessions", "delete", "chat-0", "--store", store_url, "--tenant", "acme")
    assert code == 2
    assert "add --yes" in err
    assert run(count(store_url, SessionKey("acme", "chat-0"))) == 4
    result = cli.json("sessions", "delete", "chat-1", "--store", store_url, "--tenant", "acme", "--yes")
    assert result == {"tenant": "acme", "session_id": "chat-1", "deleted": True, "messages": 4}
    assert run(count(store_url, SessionKey("acme", "chat-1"))) == 0
    code, _, err = cli("sessions", "delete", "chat-1", "--store", store_url, "--tenant", "acme", "--yes")
    assert code == 1
    assert "no session 'chat-1'" in err


# -- export and import ---------------------------------------------------------------------------


def test_export_import_round_trip_is_exact_and_idempotent(cli: CLI, store_url: str, tmp_path: Path) -> None:
    run(seed(store_url))
    exported = tmp_path / "acme.jsonl"
    summary = cli.json("export", "--store", store_url, "--tenant", "acme", "--output", str(exported))
    assert summary == {
        "tenant": "acme",
        "sessions": 3,
        "messages": 12,
        "session_documents": 1,
        "output": str(exported),
        "skipped": [],
    }
    lines = [json.loads(line) for line in exported.read_text(encoding="utf-8").splitlines()]
    assert {line["type"] for line in lines[:-1]} == {"message", "session"}
    end = {"type": "end", "format": "chatkeep-export", "version": 1, "sessions": 3, "messages": 12, "damaged": 0}
    assert lines[-1] == end
    assert all(line["record"]["v"] == 1 for line in lines if line["type"] == "message")
    assert not (tmp_path / "acme.jsonl.partial").exists()

    target = f"sqlite:///{tmp_path / 'target.db'}"
    counts = cli.json("import", "--store", target, "--input", str(exported))
    assert [counts[name] for name in ("sessions", "messages", "new_messages", "session_documents")] == [3, 12, 12, 1]
    assert (counts["complete"], counts["damaged_in_export"]) == (True, [])
    assert run(snapshot(target, "acme")) == run(snapshot(store_url, "acme"))
    again = cli.json("import", "--store", target, "--input", str(exported))
    assert again["new_messages"] == 0
    assert run(snapshot(target, "acme")) == run(snapshot(store_url, "acme"))


def test_export_of_one_session_and_import_into_another_tenant(cli: CLI, memory_url: str, tmp_path: Path) -> None:
    run(seed(memory_url))
    exported = tmp_path / "one.jsonl"
    cli.json("export", "--store", memory_url, "--tenant", "acme", "--session", "chat-1", "-o", str(exported))
    assert {json.loads(line)["session_id"] for line in exported.read_text(encoding="utf-8").splitlines()[:-1]} == {
        "chat-1"
    }
    cli.json("import", "--store", memory_url, "--tenant", "other", "-i", str(exported))
    moved = run(snapshot(memory_url, "other"))
    original = run(snapshot(memory_url, "acme"))["chat-1"]
    assert list(moved) == ["chat-1"]
    assert moved["chat-1"][0] == original[0]
    assert moved["chat-1"][1][0]["tenant"] == "other"
    assert moved["chat-1"][1][1] == "bob"
    code, _, err = cli("export", "--store", memory_url, "--tenant", "acme", "--session", "nope")
    assert code == 2
    assert "no session 'nope'" in err


def test_export_to_stdout_puts_the_summary_on_stderr(cli: CLI, memory_url: str) -> None:
    run(seed(memory_url, sessions=1, document=False))
    code, out, err = cli("export", "--store", memory_url, "--tenant", "acme")
    assert code == 0
    assert len(out.splitlines()) == 5  # four messages and the trailer
    assert err.strip() == "exported 1 session (4 messages) of tenant 'acme'"


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("{not json", "not valid JSON"),
        ('["a list"]', "not a JSON object"),
        ('{"type":"message","tenant":"acme","session_id":"s","record":{"v":1,"role":"robot"}}', "malformed"),
        ('{"type":"message","tenant":"acme","session_id":"s","record":{"v":9,"role":"user","contents":[]}}', "version"),
        ('{"type":"message","tenant":"acme","session_id":"","record":{}}', "session_id"),
        ('{"type":"comment","tenant":"acme","session_id":"s"}', '"type" must be'),
        ('{"type":"session","tenant":"acme","session_id":"s","owner":null,"document":{"v":1}}', "session document"),
    ],
)
def test_a_corrupt_line_is_named_and_nothing_is_imported(
    cli: CLI, memory_url: str, tmp_path: Path, bad: str, why: str
) -> None:
    run(seed(memory_url))
    exported = tmp_path / "x.jsonl"
    cli.json("export", "--store", memory_url, "--tenant", "acme", "-o", str(exported))
    lines = exported.read_text(encoding="utf-8").splitlines()
    lines.insert(9, bad)  # after a few sessions' worth of good lines
    exported.write_text("\n".join(lines) + "\n", encoding="utf-8")
    target = f"memory://cli-{uuid.uuid4().hex}"
    code, out, err = cli("import", "--store", target, "-i", str(exported))
    assert (code, out) == (1, "")
    assert f"line 10 of {exported}" in err
    assert why in err
    assert "Nothing was imported" in err
    assert "Traceback" not in err
    assert run(snapshot(target, "acme")) == {}


def test_import_from_stdin_validates_before_writing(cli: CLI, memory_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    good = '{"type":"message","tenant":"acme","session_id":"s","record":' + Message(role="user", text="hi").to_record()
    data = (good + "}\n" + "garbage\n").encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, _, err = cli("import", "--store", memory_url)
    assert code == 1
    assert "line 2 of stdin" in err
    assert run(count(memory_url, SessionKey("acme", "s"))) == 0
    end = '{"type":"end","format":"chatkeep-export","version":1,"sessions":1,"messages":1,"damaged":0}\n'
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO((good + "}\n" + end).encode())))
    assert cli.json("import", "--store", memory_url)["new_messages"] == 1


def test_import_refuses_a_record_over_the_targets_limit_before_writing_anything(
    cli: CLI, memory_url: str, tmp_path: Path
) -> None:
    keys = run(seed(memory_url, "acme", 2, document=False))
    big = Message(role="assistant", text="\u00e9" * 3000)  # 2 bytes each in UTF-8: the size is counted in bytes

    async def add_big() -> None:
        async with open_store(memory_url) as store:
            await store.append(keys[0], [big])
            await store.append(keys[1], [Message(role="user", text="chat-1 is updated last, so exported first")])

    run(add_big())
    exported = tmp_path / "big.jsonl"
    cli.json("export", "--store", memory_url, "--tenant", "acme", "-o", str(exported))
    lines = exported.read_text(encoding="utf-8").splitlines()
    number = next(i for i, line in enumerate(lines, 1) if big.message_id in line)
    assert number == 10  # after chat-1's five lines (which an import that wrote as it read would store) and four
    size = len(big.to_record().encode())
    target = f"sqlite:///{tmp_path / 'small.db'}"
    code, out, err = cli("import", "--store", f"{target}?max_message_bytes=4096", "-i", str(exported))
    assert (code, out) == (1, "")
    assert f"line {number} of {exported}: the message record is {size:,} bytes" in err
    assert "over the target store's max_message_bytes of 4,096" in err
    assert f"Nothing was imported: add max_message_bytes={size} (or more) to the query of the --store URL" in err
    assert run(snapshot(target, "acme")) == {}
    code, _, err = cli("import", "--store", f"{target}?max_message_bytes=4096", "-i", str(exported), "--json")
    assert json.loads(err)["error"]["type"] == "MessageTooLargeError"
    imported = cli.json("import", "--store", f"{target}?max_message_bytes={size}", "-i", str(exported))
    assert imported["new_messages"] == 10
    assert run(snapshot(target, "acme")) == run(snapshot(memory_url, "acme"))


def test_import_of_a_missing_file_is_an_error(cli: CLI, memory_url: str, tmp_path: Path) -> None:
    code, _, err = cli("import", "--store", memory_url, "-i", str(tmp_path / "missing.jsonl"))
    assert code == 1
    assert "missing.jsonl" in err


# -- copy ----------------------------------------------------------------------------------------


def test_copy_between_backends_verifies_every_session(cli: CLI, memory_url: str, tmp_path: Path) -> None:
    run(seed(memory_url, "acme", 3))
    run(seed(memory_url, "globex", 2, document=False))
    target = f"sqlite:///{tmp_path / 'copy.db'}"
    report = cli.json("copy", "--from", memory_url, "--to", target, "--tenant", "acme", "--tenant", "globex")
    assert report["ok"] is True
    assert (report["sessions"], report["messages"], report["new_messages"]) == (5, 20, 20)
    assert report["mismatches"] == []
    for tenant in ("acme", "globex"):
        assert run(snapshot(target, tenant)) == run(snapshot(memory_url, tenant))
    code, out, _ = cli("copy", "--from", memory_url, "--to", target, "--tenant", "acme")
    assert code == 0
    assert "copied 3 sessions (12 messages, 0 new)" in out
    assert "verified:" in out


def test_a_copy_cut_off_midway_through_a_session_resumes(cli: CLI, memory_url: str, tmp_path: Path) -> None:
    keys = run(seed(memory_url, "acme", 5))
    target = f"sqlite:///{tmp_path / 'resume.db'}"

    async def half_copied() -> None:
        # As if a copy died midway: chat-4 and chat-3 reached the target, and the first two messages of chat-2.
        async with open_store(memory_url) as source, open_store(target) as store:
            for key in keys[4], keys[3]:
                await store.append(key, await source.load(key))
            await store.append(keys[2], (await source.load(keys[2]))[:2])

    run(half_copied())
    resumed = cli.json("copy", "--from", memory_url, "--to", target, "--tenant", "acme")
    assert resumed["ok"] is True
    assert (resumed["sessions"], resumed["messages"]) == (5, 20)
    assert resumed["new_messages"] == 20 - 8 - 2  # chat-2 is completed, chat-1 and chat-0 copied
    assert run(snapshot(target, "acme")) == run(snapshot(memory_url, "acme"))


def test_a_copy_stops_at_a_message_over_the_targets_limit_and_resumes_once_it_is_raised(
    cli: CLI, memory_url: str, tmp_path: Path
) -> None:
    keys = run(seed(memory_url, "acme", 3, document=False))
    big = Message(role="user", text="x" * 5000)

    async def add_big() -> None:
        async with open_store(memory_url) as store:
            await store.append(keys[1], [big])
            await store.append(keys[2], [Message(role="user", text="chat-2 is updated last, so copied first")])

    run(add_big())
    size = len(big.to_record().encode())
    target = f"sqlite:///{tmp_path / 'limit.db'}"
    code, out, err = cli("copy", "--from", memory_url, "--to", f"{target}?max_message_bytes=4096", "--tenant", "acme")
    assert (code, out) == (1, "")
    assert f"copy stopped at session acme/chat-1: message {big.message_id} is {size:,} bytes" in err
    assert "max_message_bytes of 4,096" in err
    assert f"Add max_message_bytes={size} (or more) to the query of the --to URL" in err
    assert "Traceback" not in err
    # Newest first: chat-2 was copied, chat-0 was not reached.
    assert run(count(target, keys[2])) == 5
    assert run(count(target, keys[1])) == 0  # the batch holding the big message was refused whole
    assert run(count(target, keys[0])) == 0
    resumed = cli.json("copy", "--from", memory_url, "--to", f"{target}?max_message_bytes={size}", "--tenant", "acme")
    assert (resumed["ok"], resumed["sessions"], resumed["new_messages"]) == (True, 3, 9)
    assert run(snapshot(target, "acme")) == run(snapshot(memory_url, "acme"))


def test_copy_reports_a_target_that_differs(cli: CLI, memory_url: str, tmp_path: Path) -> None:
    keys = run(seed(memory_url, "acme", 2, document=False))
    target = f"sqlite:///{tmp_path / 'differs.db'}"

    async def stray() -> None:
        async with open_store(target) as store:
            await store.append(keys[0], [Message(role="user", text="only in the target")])

    run(stray())
    code, out, _ = cli("copy", "--from", memory_url, "--to", target, "--tenant", "acme")
    assert code == 1
    assert "MISMATCH acme/chat-0: source 4 messages" in out
    assert "target 5 messages" in out


def test_copy_refuses_the_same_store(cli: CLI, memory_url: str) -> None:
    code, _, err = cli("copy", "--from", memory_url, "--to", memory_url, "--tenant", "acme")
    assert code == 2
    assert "same store" in err


# -- prune and migrate ---------------------------------------------------------------------------


def test_prune_deletes_only_old_sessions_of_the_tenant(cli: CLI, store_url: str) -> None:
    run(seed(store_url, "acme", 2, document=False))
    run(seed(store_url, "globex", 1, document=False))
    time.sleep(1.2)
    run(seed(store_url, "acme", 1, document=False))  # chat-0 again: touched now
    report = cli.json("prune", "--store", store_url, "--tenant", "acme", "--older-than", "1s", "--yes")
    assert report["deleted"] == 1
    assert report["tenant"] == "acme"
    assert run(count(store_url, SessionKey("acme", "chat-0"))) == 8  # kept: a new conversation was appended
    assert run(count(store_url, SessionKey("acme", "chat-1"))) == 0
    assert run(count(store_url, SessionKey("globex", "chat-0"))) == 4
    code, out, _ = cli("prune", "--store", store_url, "--all-tenants", "--older-than", "1s", "--yes")
    assert code == 0
    assert out.startswith("pruned 1 session of every tenant")
    assert run(count(store_url, SessionKey("globex", "chat-0"))) == 0
    code, _, err = cli("prune", "--store", store_url, "--all-tenants", "--tenant", "x", "--older-than", "1d")
    assert code == 2
    assert "not both" in err


def test_prune_asks_first_and_refuses_without_a_terminal_to_ask_on(cli: CLI, memory_url: str) -> None:
    keys = run(seed(memory_url, "acme", 2, document=False))
    time.sleep(1.2)
    for extra in ([], ["--all-tenants"]):
        scope = extra or ["--tenant", "acme"]
        code, out, err = cli("prune", "--store", memory_url, *scope, "--older-than", "1s")
        assert (code, out) == (2, "")
        assert "not pruning: stdin is not a terminal to ask on; add --yes to prune without asking" in err
        assert "--dry-run" in err
    assert [run(count(memory_url, key)) for key in keys] == [4, 4]  # nothing was deleted


def test_prune_dry_run_lists_what_it_would_delete_and_deletes_nothing(cli: CLI, memory_url: str) -> None:
    run(seed(memory_url, "acme", 2, document=False))
    time.sleep(1.2)
    run(seed(memory_url, "acme", 1, document=False))  # chat-0 touched again: not idle
    common = ("prune", "--store", memory_url, "--tenant", "acme", "--older-than", "1s", "--dry-run")
    code, out, err = cli(*common)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("would prune 1 session of tenant 'acme' not updated since ")
    assert lines[0].endswith(" UTC (--dry-run: nothing deleted)")
    assert lines[1].split() == ["SESSION", "MESSAGES", "UPDATED", "(UTC)"]
    assert lines[2].split()[:2] == ["chat-1", "4"]
    assert len(lines) == 3
    report = cli.json(*common)
    assert report["dry_run"] is True
    assert [(s["session_id"], s["message_count"]) for s in report["would_delete"]] == [("chat-1", 4)]
    assert run(count(memory_url, SessionKey("acme", "chat-1"))) == 4  # still there
    run(seed(memory_url, "globex", 1, document=False))  # new: not idle
    code, out, err = cli("prune", "--store", memory_url, "--all-tenants", "--older-than", "1s", "--dry-run")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("would prune 1 session of every tenant not updated since ")
    assert lines[1].split() == ["TENANT", "SESSION", "MESSAGES", "UPDATED", "(UTC)"]
    assert lines[2].split()[:3] == ["acme", "chat-1", "4"]
    assert len(lines) == 3
    report = cli.json("prune", "--store", memory_url, "--all-tenants", "--older-than", "1s", "--dry-run")
    assert [(s["tenant"], s["session_id"]) for s in report["would_delete"]] == [("acme", "chat-1")]
    assert report["tenant"] is None
    assert run(count(memory_url, SessionKey("acme", "chat-1"))) == 4


def test_prune_with_nothing_idle_does_not_ask(cli: CLI, memory_url: str) -> None:
    run(seed(memory_url, "acme", 1, document=False))
    code, out, err = cli("prune", "--store", memory_url, "--tenant", "acme", "--older-than", "1d")
    assert code == 0, err
    assert out.startswith("pruned 0 sessions of tenant 'acme'")


# -- tenants list, erase, copy --all-tenants --------------------------------------------------------


def test_tenants_list_names_every_tenant_holding_a_session(cli: CLI, store_url: str) -> None:
    run(seed(store_url, "globex", 1))  # creates the store: the listing below reads an existing one
    run(delete_tenant(store_url, "globex"))
    code, out, err = cli("tenants", "list", "--store", store_url)
    assert (code, out, err) == (0, f"no tenants in {store_url}\n", "")
    for tenant in ("globex", "acme", "\u00e9t\u00e9"):
        run(seed(store_url, tenant, 1, document=False))
    code, out, err = cli("tenants", "list", "--store", store_url)
    assert (code, out.splitlines(), err) == (0, ["acme", "globex", "\u00e9t\u00e9"], "")
    assert cli.json("tenants", "list", "--store", store_url) == {
        "store": store_url,
        "tenants": ["acme", "globex", "\u00e9t\u00e9"],
    }
    code, _, err = cli("tenants", "list", "--store", store_url, "--tenant", "acme")
    assert code == 2  # it lists every tenant: a --tenant would be a mistake, not a filter
    assert "unrecognized arguments: --tenant" in err


def test_a_store_that_cannot_list_tenants_says_to_name_them(
    cli: CLI, memory_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(seed(memory_url, "acme", 1, document=False))
    monkeypatch.setattr(MemoryHistoryStore, "_list_tenants", HistoryStore._list_tenants)
    target = f"sqlite:///{tmp_path / 'all.db'}"
    for argv in (
        ("tenants", "list", "--store", memory_url),
        ("copy", "--from", memory_url, "--to", target, "--all-tenants"),
    ):
        code, out, err = cli(*argv)
        assert (code, out) == (1, "")
        assert "MemoryHistoryStore cannot list its tenants: name them instead" in err
        assert "Traceback" not in err


def test_copy_takes_named_tenants_or_all_tenants(cli: CLI, memory_url: str, tmp_path: Path) -> None:
    run(seed(memory_url, "acme", 2))
    run(seed(memory_url, "globex", 1, document=False))
    target = f"sqlite:///{tmp_path / 'all.db'}"
    for scope in ((), ("--tenant", "acme", "--all-tenants")):
        code, out, err = cli("copy", "--from", memory_url, "--to", target, *scope)
        assert (code, out) == (2, "")
        assert "--all-tenants" in err
    report = cli.json("copy", "--from", memory_url, "--to", target, "--all-tenants")
    assert (report["ok"], report["tenants"], report["sessions"], report["new_messages"]) == (
        True,
        ["acme", "globex"],
        3,
        12,
    )
    for tenant in ("acme", "globex"):
        assert run(snapshot(target, tenant)) == run(snapshot(memory_url, tenant))
    code, out, err = cli("copy", "--from", memory_url, "--to", target, "--all-tenants")
    assert code == 0, err
    assert out.splitlines()[0] == "copied 3 sessions (12 messages, 0 new) of every tenant (2: 'acme', 'globex')"


def test_erase_says_what_it_removed_and_leaves_other_tenants(cli: CLI, store_url: str) -> None:
    keys = run(seed(store_url, "acme", 3))
    run(seed(store_url, "globex", 1, document=False))
    code, out, err = cli("erase", "--store", store_url, "--tenant", "acme", "--session", "chat-1", "--yes")
    assert (code, err) == (0, "")
    assert out == (
        f"erased session 'chat-1' of tenant 'acme' from {store_url}: 1 session with 4 messages (and its session "
        "document)\n"
    )
    assert run(snapshot(store_url, "acme")).keys() == {"chat-0", "chat-2"}
    code, out, err = cli("erase", "--store", store_url, "--tenant", "acme", "--dry-run")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == (
        f"would erase tenant 'acme' from {store_url}: 2 sessions with 8 messages (and their session documents) "
        "(--dry-run: nothing erased)"
    )
    assert lines[1].split() == ["SESSION", "MESSAGES", "UPDATED", "(UTC)"]
    assert sorted(line.split()[0] for line in lines[2:]) == ["chat-0", "chat-2"]
    assert run(count(store_url, keys[0])) == 4
    report = cli.json("erase", "--store", store_url, "--tenant", "acme", "--yes")
    assert report == {
        "store": store_url,
        "tenant": "acme",
        "session_id": None,
        "dry_run": False,
        "sessions": 2,
        "messages": 8,
        "remaining_sessions": 0,
    }
    assert run(snapshot(store_url, "acme")) == {}
    assert cli.json("tenants", "list", "--store", store_url)["tenants"] == ["globex"]
    assert run(count(store_url, SessionKey("globex", "chat-0"))) == 4
    for scope in ((), ("--session", "chat-0")):
        code, out, err = cli("erase", "--store", store_url, "--tenant", "acme", *scope, "--yes")
        assert (code, err) == (0, "")
        assert out.startswith("nothing to erase: no ")


def test_erase_needs_a_tenant_and_asks_first(cli: CLI, memory_url: str) -> None:
    keys = run(seed(memory_url, "default", 1, document=False))
    code, out, err = cli("erase", "--store", memory_url, "--yes")
    assert (code, out) == (2, "")
    assert "the following arguments are required: --tenant" in err  # never the tenant 'default' by omission
    code, out, err = cli("erase", "--store", memory_url, "--tenant", "default")
    assert (code, out) == (2, "")
    assert "not erasing tenant 'default': stdin is not a terminal to ask on; add --yes to erase without asking" in err
    assert run(count(memory_url, keys[0])) == 4


def test_erase_of_an_encrypted_tenant_and_of_its_data_key(cli: CLI, tmp_path: Path) -> None:
    from chatkeep.core.encryption import KEYS_TENANT, DecryptionError, EncryptedStore

    data_url, keys_url = f"sqlite:///{tmp_path / 'data.db'}", f"sqlite:///{tmp_path / 'keys.db'}"
    kept, erased, document = SessionKey("acme", "kept"), SessionKey("acme", "erased"), SessionKey("acme", "document")

    def encrypted() -> EncryptedStore:
        return EncryptedStore(open_store(data_url), key_store=open_store(keys_url), master_keys={"k": b"k" * 32})

    async def write() -> None:
        async with encrypted() as store:
            for key in kept, erased:
                await store.append(key, [Message(role="user", text="secret")])
            await store.save_session(document, AgentSession(session_id="document", tenant="acme", state={"a": 1}))

    async def read(key: SessionKey) -> list[str]:
        async with encrypted() as store:
            return [m.text for m in await store.load(key)]

    run(write())
    report = cli.json("erase", "--store", data_url, "--tenant", "acme", "--session", "erased", "--yes")
    assert (report["sessions"], report["messages"]) == (1, 1)
    # A sealed document alone: erase reads no contents, so a store without keys erases it as stored.
    report = cli.json("erase", "--store", data_url, "--tenant", "acme", "--session", "document", "--yes")
    assert (report["sessions"], report["messages"]) == (1, 0)
    assert (run(read(erased)), run(read(kept))) == ([], ["secret"])
    # The command line has no master keys: the data key is erased in the key store, where it is a session.
    report = cli.json("erase", "--store", keys_url, "--tenant", KEYS_TENANT, "--session", "acme", "--yes")
    assert report["sessions"] == 1
    with pytest.raises(DecryptionError):
        run(read(kept))


HOSTILE_ID = "evil\x1b[2J\x1b]0;pwned\x07\nchat-9  99  2026-01-01 00:00:00\r\u202e"


async def seed_hostile(url: str) -> SessionKey:
    key = SessionKey("acme", HOSTILE_ID)
    text = "line one\x1b[31m red\x9b2J\nline two\rover\u2028"
    async with open_store(url) as store:
        await store.append(key, [Message(role="user", text=text, author_name="mal\x1b[0mlory")])
    return key


def test_ids_and_texts_are_printed_with_control_characters_escaped(cli: CLI, memory_url: str) -> None:
    key = run(seed_hostile(memory_url))
    common = ("--store", memory_url, "--tenant", "acme")
    escaped_id = "evil\\x1b[2J\\x1b]0;pwned\\x07\\nchat-9  99  2026-01-01 00:00:00\\r\\u202e"
    code, listing, err = cli("sessions", "list", *common)
    assert code == 0, err
    assert len(listing.splitlines()) == 2  # the header and one row: the id forged no line
    assert listing.splitlines()[1].startswith(escaped_id)
    code, shown, err = cli("sessions", "show", HOSTILE_ID, *common)
    assert code == 0, err
    header, message, continued = shown.splitlines()
    assert header == f"session {escaped_id} (tenant acme): 1 message"
    assert message.endswith("user (mal\\x1b[0mlory): line one\\x1b[31m red\\x9b2J")
    assert continued == "    line two\\rover\\u2028"  # the text's own line, indented under its message
    code, deleted, err = cli("sessions", "delete", HOSTILE_ID, *common, "--yes")
    assert code == 0, err
    for out in (listing, shown, deleted):
        assert not any(ch in out for ch in "\x1b\x07\r\x9b\u202e\u2028")
    assert deleted == f"deleted session {escaped_id} (tenant acme, 1 messages)\n"
    assert run(count(memory_url, key)) == 0
    code, out, err = cli("sessions", "show", HOSTILE_ID, *common)
    assert (code, out) == (1, "")
    assert "\x1b" not in err
    assert "\\x1b[2J" in err


class FileBackedStore(MemoryHistoryStore):
    """The memory store, declaring a file as its storage, as a SQLite store would (``filecheck:///path``)."""

    def __init__(self, url: str, **options: Any) -> None:
        self.path = Path(url.removeprefix("filecheck://"))
        super().__init__(f"memory://filecheck-{uuid.uuid5(uuid.NAMESPACE_URL, url).hex}", **options)

    async def missing_storage(self) -> str | None:
        return None if self.path.exists() else f"the file {self.path}"


class FileCheckPlugin:
    @hookimpl
    def chatkeep_register_backends(self, register: Callable[[BackendSpec], None]) -> None:
        register(BackendSpec(name="filecheck", schemes=("filecheck",), open=FileBackedStore, extra=None))


@pytest.fixture
def filecheck() -> Iterator[None]:
    register_plugin(FileCheckPlugin(), name="filecheck-test")
    try:
        yield
    finally:
        default_registry().unregister_plugin("filecheck-test")


@pytest.mark.parametrize(
    "argv",
    [
        ["sessions", "list"],
        ["sessions", "show", "chat-0"],
        ["sessions", "delete", "chat-0", "--yes"],
        ["export", "-o", "out.jsonl"],
        ["prune", "--older-than", "1d", "--yes"],
        ["prune", "--older-than", "1d", "--dry-run"],
        ["erase", "--yes"],
    ],
)
def test_read_commands_report_a_store_that_does_not_exist_and_create_nothing(
    cli: CLI, filecheck: None, tmp_path: Path, argv: list[str]
) -> None:
    missing = tmp_path / "no" / "such" / "dir" / "chat.db"
    url = f"filecheck://{missing}"
    code, out, err = cli(*argv, "--store", url, "--tenant", "acme")
    assert (code, out) == (1, "")
    assert f"chatkeep: the file {missing} does not exist, so {url} holds no sessions and was not created" in err
    assert "check the path in --store" in err
    code, out, err = cli("copy", "--from", url, "--to", f"memory://cli-{uuid.uuid4().hex}", "--tenant", "acme")
    assert code == 1
    assert f"the file {missing} does not exist" in err
    assert issubclass(FileBackedStore, SupportsExistenceCheck)  # the capability is what the command asked


def test_read_commands_work_once_the_storage_exists(cli: CLI, filecheck: None, tmp_path: Path) -> None:
    path = tmp_path / "chat.db"
    path.touch()
    url = f"filecheck://{path}"
    run(seed(url, "acme", 1, document=False))
    code, out, err = cli("sessions", "list", "--store", url, "--tenant", "acme")
    assert code == 0, err
    assert out.splitlines()[1].startswith("chat-0")


@pytest.mark.parametrize("where", ["no/such/dir/chat.db", "missing.db"])
def test_a_misspelled_sqlite_path_in_a_read_command_is_reported_and_not_created(
    cli: CLI, tmp_path: Path, where: str
) -> None:
    missing = tmp_path / where
    code, out, err = cli("sessions", "list", "--store", f"sqlite:///{missing}", "--tenant", "acme")
    assert not missing.exists()
    assert (code, out) == (1, "")
    assert str(missing) in err


def test_migrate_json(cli: CLI, tmp_path: Path, memory_url: str) -> None:
    from chatkeep.sql import SCHEMA_REVISION

    url = f"sqlite:///{tmp_path / 'm.db'}"
    assert cli.json("migrate", "--store", url) == {"store": url, "has_schema": True, "revision": SCHEMA_REVISION}
    assert cli.json("migrate", "--store", memory_url) == {"store": memory_url, "has_schema": False, "revision": None}


# -- real processes ------------------------------------------------------------------------------


def chatkeep(*args: str, cwd: Path, stdin: str | bytes | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    return subprocess.run(
        [sys.executable, "-m", "chatkeep.core.cli", *args],
        cwd=cwd,
        env=env,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_export_piped_into_import_between_two_sqlite_files(tmp_path: Path) -> None:
    source, target = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    run(seed(source))
    exported = chatkeep("export", "--store", source, "--tenant", "acme", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert "exported 3 sessions (12 messages)" in exported.stderr
    imported = chatkeep("import", "--store", target, cwd=tmp_path, stdin=exported.stdout)
    assert imported.returncode == 0, imported.stderr
    assert "imported 12 messages (12 new) in 3 sessions and 1 session document from stdin" in imported.stdout
    assert run(snapshot(target, "acme")) == run(snapshot(source, "acme"))


def test_delete_in_a_process_without_a_terminal_needs_yes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'd.db'}"
    run(seed(url))
    refused = chatkeep("sessions", "delete", "chat-0", "--store", url, "--tenant", "acme", cwd=tmp_path)
    assert refused.returncode == 2
    assert "stdin is not a terminal" in refused.stderr
    assert run(count(url, SessionKey("acme", "chat-0"))) == 4


def test_chat_driven_by_stdin_resumes_in_a_second_process(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'chat.db'}"
    first = chatkeep("chat", "--session", "s1", "--store", url, cwd=tmp_path, stdin="My name is Ada.\n/quit\n")
    assert first.returncode == 0, first.stderr
    assert "a new conversation" in first.stdout
    assert "offline demo model" in first.stdout
    assert "2 messages stored in session s1" in first.stdout
    second = chatkeep("chat", "--session", "s1", "--store", url, "--json", cwd=tmp_path, stdin="What is my name?\n")
    assert second.returncode == 0, second.stderr
    turn = json.loads(second.stdout)
    assert turn["user"] == "What is my name?"
    assert "Earlier you told me: \u201cMy name is Ada.\u201d" in turn["assistant"]
    assert run(count(url, SessionKey("default", "s1"))) == 4
    shown = chatkeep("sessions", "show", "s1", "--store", url, cwd=tmp_path)
    assert shown.stdout.splitlines()[1].endswith("user: My name is Ada.")


def on_a_terminal(*args: str, cwd: Path, answer: bytes = b"") -> tuple[int, str, bytes]:
    """Run chatkeep with stdin and stderr on a pseudo-terminal (stdout a pipe); returns status, stdout, terminal."""
    import pty

    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    if answer:
        os.write(master, answer)
    process = subprocess.run(
        [sys.executable, "-m", "chatkeep.core.cli", *args],
        cwd=cwd,
        env=env,
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=slave,
        timeout=120,
        check=False,
    )
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the terminal's other end is closed: everything was read
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    return process.returncode, process.stdout.decode(), seen


def test_export_shows_a_progress_bar_on_a_terminal_only(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    run(seed(url))
    code, out, terminal = on_a_terminal("export", "--store", url, "--tenant", "acme", "-o", "x.jsonl", cwd=tmp_path)
    assert code == 0
    assert "exported 3 sessions" in out
    assert b"export" in terminal
    assert "\u2501".encode() in terminal  # the bar's line
    piped = chatkeep("export", "--store", url, "--tenant", "acme", "-o", "y.jsonl", cwd=tmp_path)
    assert "\x1b" not in piped.stdout + piped.stderr  # no escape codes in a pipe or a log
    assert (tmp_path / "x.jsonl").read_bytes() == (tmp_path / "y.jsonl").read_bytes()


@pytest.mark.parametrize(("answer", "status", "left"), [(b"y\n", 0, 0), (b"n\n", 1, 4), (b"\n", 1, 4)])
def test_delete_on_a_terminal_asks_first(tmp_path: Path, answer: bytes, status: int, left: int) -> None:
    url = f"sqlite:///{tmp_path / 'ask.db'}"
    run(seed(url))
    code, out, _ = on_a_terminal(
        "sessions", "delete", "chat-0", "--store", url, "--tenant", "acme", cwd=tmp_path, answer=answer
    )
    assert code == status
    assert "Delete session 'chat-0' of tenant 'acme' (4 messages)" in out
    assert run(count(url, SessionKey("acme", "chat-0"))) == left


@pytest.mark.parametrize(("answer", "status", "left"), [(b"y\n", 0, 0), (b"n\n", 1, 4)])
def test_erase_on_a_terminal_asks_first(tmp_path: Path, answer: bytes, status: int, left: int) -> None:
    url = f"sqlite:///{tmp_path / 'ask.db'}"
    run(seed(url, "acme", 2, document=False))
    code, out, _ = on_a_terminal("erase", "--store", url, "--tenant", "acme", cwd=tmp_path, answer=answer)
    assert code == status
    assert f"Erase tenant 'acme' from {url}: 2 sessions with 8 messages (and their session documents), for good?" in out
    assert run(count(url, SessionKey("acme", "chat-0"))) == left


@pytest.mark.parametrize(("answer", "status", "left"), [(b"y\n", 0, 0), (b"n\n", 1, 4)])
def test_prune_on_a_terminal_asks_first(tmp_path: Path, answer: bytes, status: int, left: int) -> None:
    url = f"sqlite:///{tmp_path / 'ask.db'}"
    run(seed(url, "acme", 1, document=False))
    time.sleep(1.2)
    code, out, _ = on_a_terminal(
        "prune", "--older-than", "1s", "--store", url, "--tenant", "acme", cwd=tmp_path, answer=answer
    )
    assert code == status
    assert "Delete 1 session of tenant 'acme' not updated since " in out
    assert run(count(url, SessionKey("acme", "chat-0"))) == left


def test_export_into_a_reader_that_stops_early_ends_quietly(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'pipe.db'}"

    async def many() -> None:
        async with open_store(url) as store:
            for i in range(20):
                await store.append(
                    SessionKey("acme", f"s{i}"), [Message(role="user", text="x" * 500) for _ in range(100)]
                )

    run(many())
    with subprocess.Popen(
        [sys.executable, "-m", "chatkeep.core.cli", "export", "--store", url, "--tenant", "acme"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    ) as process:
        assert process.stdout is not None
        assert process.stderr is not None
        assert process.stdout.readline().startswith(b'{"type":"message"')
        process.stdout.close()  # like `chatkeep export | head -1`
        assert process.wait(timeout=60) == 1
        assert process.stderr.read() == b""


def test_export_and_import_memory_does_not_grow_with_the_history(cli: CLI, tmp_path: Path) -> None:
    import tracemalloc

    def peaks(messages: int) -> tuple[int, int]:
        source, target = f"sqlite:///{tmp_path / f'big{messages}.db'}", f"sqlite:///{tmp_path / f'in{messages}.db'}"

        async def fill() -> None:
            async with open_store(source) as store:
                for start in range(0, messages, 1000):
                    batch = [Message(role="user", text=f"message {n} " + "x" * 200) for n in range(start, start + 1000)]
                    await store.append(SessionKey("acme", "long"), batch)

        run(fill())
        exported = tmp_path / f"big{messages}.jsonl"
        result: list[int] = []
        for argv in (
            ("export", "--store", source, "--tenant", "acme", "-o", str(exported)),
            ("import", "--store", target, "-i", str(exported)),
        ):
            tracemalloc.start()
            try:
                code, _, err = cli(*argv)
                result.append(tracemalloc.get_traced_memory()[1])
            finally:
                tracemalloc.stop()
            assert code == 0, err
        assert run(count(target, SessionKey("acme", "long"))) == messages
        return result[0], result[1]

    small, large = peaks(2_000), peaks(20_000)
    # Ten times the history: a command that held it would peak about ten times higher (20,000 records are ~5 MB).
    assert large[0] < small[0] * 2 + 1_000_000, (small, large)
    assert large[1] < small[1] * 2 + 1_000_000, (small, large)


# -- damaged sessions and incomplete exports ------------------------------------------------------


def damage_record(url: str, key: SessionKey, index: int) -> None:
    """Write a record that is not JSON over message ``index`` of ``key``, behind the store (memory or SQLite)."""
    if url.startswith("memory://"):
        store = MemoryHistoryStore(url)
        stored = store._data.get(key, store._clock())  # where the namespace keeps the records
        assert stored is not None
        stored.records[index] = '{"v":1,"role":"user","contents":[{"type":"text","te'
        return
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        with conn:
            changed = conn.execute(
                "UPDATE chatkeep_messages SET record = ? WHERE seq = ? AND session_ref = "
                "(SELECT id FROM chatkeep_sessions WHERE key_hash = ?)",
                ('{"v":1,"role":"user","contents":[{"type":"text","te', index, key_hash(key.tenant, key.session_id)),
            ).rowcount
        assert changed == 1
    finally:
        conn.close()


def test_a_damaged_record_stops_export_naming_the_session_and_skip_damaged_goes_on(
    cli: CLI, store_url: str, tmp_path: Path
) -> None:
    keys = run(seed(store_url, sessions=3))
    damage_record(store_url, keys[1], 2)  # chat-1, which has a document
    exported = tmp_path / "acme.jsonl"
    code, out, err = cli("export", "--store", store_url, "--tenant", "acme", "-o", str(exported))
    assert (code, out) == (1, "")
    assert "export stopped at session 'chat-1' of tenant 'acme', which is damaged" in err
    assert "holds a damaged message record: stored record" in err
    assert "not valid JSON" in err
    assert "Add --skip-damaged" in err
    assert not exported.exists()

    code, out, err = cli("export", "--store", store_url, "--tenant", "acme", "-o", str(exported), "--skip-damaged")
    assert code == 3
    # Records are read in batches: how many of chat-1's lines precede the damage depends on the batch's decoding.
    assert re.search(r"skipped damaged session 'chat-1' of tenant 'acme' \(\d of its lines written before\)", err)
    assert out.splitlines() == [
        "exported 2 sessions (8 messages) of tenant 'acme'",
        "skipped 1 damaged session (named above); exit status 3",
    ]
    lines = [json.loads(line) for line in exported.read_text(encoding="utf-8").splitlines()]
    damaged = [line["type"] for line in lines if line.get("session_id") == "chat-1"]
    assert (damaged[0], damaged[-1]) == ("session", "damaged")
    assert lines[-1] == {
        "type": "end",
        "format": "chatkeep-export",
        "version": 1,
        "sessions": 3,  # chat-1's document line is in the file too (import leaves it out)
        "messages": 8 + damaged.count("message"),
        "damaged": 1,
    }
    target = f"memory://cli-{uuid.uuid4().hex}"
    code, out, err = cli("import", "--store", target, "-i", str(exported))
    assert code == 0, err
    assert "imported 8 messages (8 new) in 2 sessions and 0 session documents" in out
    assert "left out session 'chat-1' of tenant 'acme': the export found it damaged" in err
    assert sorted(run(snapshot(target, "acme"))) == ["chat-0", "chat-2"]


def test_a_damaged_record_stops_copy_naming_it_and_the_rerun_with_skip_damaged_copies_the_rest(
    cli: CLI, store_url: str, tmp_path: Path
) -> None:
    keys = run(seed(store_url, sessions=3, document=False))
    damage_record(store_url, keys[1], 0)
    target = f"sqlite:///{tmp_path / 'copy.db'}"
    code, out, err = cli("copy", "--from", store_url, "--to", target, "--tenant", "acme")
    assert (code, out) == (1, "")
    assert "copy stopped at session 'chat-1' of tenant 'acme', which is damaged" in err
    assert "The sessions before it are copied and verified, and a rerun resumes where it stopped" in err
    assert run(count(target, keys[2])) == 4  # newest first: chat-2 was copied before it
    code, out, err = cli("copy", "--from", store_url, "--to", target, "--tenant", "acme", "--skip-damaged")
    assert code == 3
    assert "copied 2 sessions (8 messages, 4 new)" in out
    assert "verified the sessions copied; skipped 1 damaged session" in out
    assert "skipped damaged session 'chat-1' of tenant 'acme'" in err
    assert run(count(target, keys[0])) == 4
    assert run(count(target, keys[1])) == 0


def test_a_damaged_record_raises_message_format_error_naming_the_session(store_url: str) -> None:
    keys = run(seed(store_url, sessions=2, document=False))
    damage_record(store_url, keys[1], 3)

    async def read() -> None:
        async with open_store(store_url) as store:
            for call in (store.load(keys[1]), store.load(keys[1], last=1)):
                with pytest.raises(MessageFormatError) as caught:
                    await call
                assert "session 'chat-1' in tenant 'acme' holds a damaged message record" in str(caught.value)
                assert "chatkeep sessions delete chat-1 --tenant acme" in str(caught.value)
            with pytest.raises(MessageFormatError, match="session 'chat-1' in tenant 'acme'"):
                [m async for m in store.iter_messages(keys[1])]
            assert len(await store.load(keys[0])) == 4

    run(read())


def test_an_export_cut_at_a_line_boundary_is_refused_unless_allowed(cli: CLI, memory_url: str, tmp_path: Path) -> None:
    run(seed(memory_url, sessions=3))
    exported = tmp_path / "acme.jsonl"
    cli.json("export", "--store", memory_url, "--tenant", "acme", "-o", str(exported))
    whole = exported.read_text(encoding="utf-8").splitlines(keepends=True)
    target = f"memory://cli-{uuid.uuid4().hex}"
    for name, lines, why in [
        ("cut.jsonl", whole[:6], "does not end with the trailer line"),  # as a transfer or a disk cut it short
        ("no-end.jsonl", whole[:-1], "does not end with the trailer line"),  # as an earlier chatkeep wrote it
        ("missing.jsonl", whole[:3] + whole[4:], "lines are missing"),  # a line lost in the middle
        ("empty.jsonl", [], "it is empty"),
    ]:
        path = tmp_path / name
        path.write_text("".join(lines), encoding="utf-8")
        code, out, err = cli("import", "--store", target, "-i", str(path))
        assert (code, out) == (1, ""), name
        assert f"{path} is not a complete export: " in err, err
        assert why in err, err
        assert "Nothing was imported" in err
        assert "--allow-partial" in err
        assert "earlier chatkeep" in err
        assert run(snapshot(target, "acme")) == {}
    cut = tmp_path / "cut.jsonl"
    code, out, err = cli("import", "--store", target, "-i", str(cut), "--allow-partial")
    assert code == 0, err
    assert out.strip() == f"imported 5 messages (5 new) in 2 sessions and 1 session document from {cut}"
    assert f"--allow-partial: {cut} is not a complete export" in err
    assert sum(len(records) for records, _ in run(snapshot(target, "acme")).values()) == 5
    counts = cli.json("import", "--store", target, "-i", str(tmp_path / "no-end.jsonl"), "--allow-partial")
    assert (counts["complete"], counts["messages"], counts["new_messages"]) == (False, 12, 7)


def test_joined_exports_import_each_checked_against_its_own_trailer(cli: CLI, memory_url: str, tmp_path: Path) -> None:
    run(seed(memory_url, "acme", 2))
    run(seed(memory_url, "globex", 1, document=False))
    first, second = tmp_path / "acme.jsonl", tmp_path / "globex.jsonl"
    cli.json("export", "--store", memory_url, "--tenant", "acme", "-o", str(first))
    cli.json("export", "--store", memory_url, "--tenant", "globex", "-o", str(second))
    joined = tmp_path / "both.jsonl"
    joined.write_bytes(first.read_bytes() + second.read_bytes())
    target = f"memory://cli-{uuid.uuid4().hex}"
    counts = cli.json("import", "--store", target, "-i", str(joined))
    assert (counts["complete"], counts["sessions"], counts["messages"]) == (True, 3, 12)
    assert run(snapshot(target, "globex")) == run(snapshot(memory_url, "globex"))


def test_sessions_list_marks_a_damaged_document_and_exits_1(cli: CLI, memory_url: str) -> None:
    keys = run(seed(memory_url, sessions=3))
    reader = MemoryHistoryStore(memory_url)
    stored = reader._data.get(keys[1], reader._clock())
    assert stored is not None
    stored.document = "[1, 2"
    code, out, err = cli("sessions", "list", "--store", memory_url, "--tenant", "acme")
    assert code == 1
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["chat-2", "chat-1", "chat-0"]
    assert out.splitlines()[2].endswith("DAMAGED")
    assert "session 'chat-1' of tenant 'acme' is damaged: the stored document of session 'chat-1'" in err
    assert "1 damaged session listed (marked DAMAGED); --skip-damaged leaves them out" in err
    listed = json.loads(cli("sessions", "list", "--store", memory_url, "--tenant", "acme", "--json")[1])
    assert [s["damaged"] is not None for s in listed["sessions"]] == [False, True, False]
    code, out, err = cli("sessions", "list", "--store", memory_url, "--tenant", "acme", "--skip-damaged")
    assert code == 3
    assert "chat-1" not in out
    assert "skipped damaged session 'chat-1' of tenant 'acme'" in err


def test_an_interrupted_copy_says_that_a_rerun_resumes(
    cli: CLI, memory_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(seed(memory_url, sessions=3, document=False))
    copied = _transfer._copy_session

    async def stop_at_the_second(source: Any, target: Any, key: SessionKey, bar: Any) -> Any:
        if key.session_id == "chat-1":
            raise KeyboardInterrupt  # what Ctrl-C raises
        return await copied(source, target, key, bar)

    monkeypatch.setattr(_transfer, "_copy_session", stop_at_the_second)
    target = f"sqlite:///{tmp_path / 'copy.db'}"
    code, _, err = cli("copy", "--from", memory_url, "--to", target, "--tenant", "acme")
    assert code == 130
    assert "copy stopped after 1 session; run the same copy again to finish it: it resumes where it stopped" in err
