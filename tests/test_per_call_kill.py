"""Per-call persistence survives a SIGKILL in the middle of a tool loop, and a new process resumes from there.

A child process runs an agent (OpenAIChatClient against a FakeOpenAIServer this test runs) through a tool loop
of model calls; the third tool blocks, and the test kills the child with SIGKILL while it waits. With
``require_per_service_call_history_persistence=True`` the two completed calls and their tool results are
already stored, and a second process continues the run without repeating them; without it nothing is stored.

History lives where a killed process cannot take it along: the SQL backend's SQLite file when ``chatkeep.sql``
is installed, and always a small JSON-lines provider defined here (a test helper, not a backend).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chatkeep.core import Message, SessionKey, open_store
from chatkeep.testing.openai_server import FakeOpenAIServer

pytestmark = pytest.mark.reliability

SESSION_ID = "kill-test"

# The child's program. JsonLinesHistoryProvider is a test helper: one write and one fsync per append, so an
# append is on disk when save_messages returns, and a killed process never leaves half of one behind.
CHILD = '''
import asyncio, json, os, sys, time
from pathlib import Path

from chatkeep.core import HistoryProvider
from chatkeep.core.backend import decode_records
from chatkeep.core.openai import OpenAIChatClient


class JsonLinesHistoryProvider(HistoryProvider):
    """Test helper: a session's history as JSON lines in a file."""

    def __init__(self, directory):
        super().__init__("jsonl")
        self.directory = Path(directory)

    async def get_messages(self, session_id, *, state=None, **kwargs):
        path = self.directory / f"{session_id}.jsonl"
        if not path.exists():
            return []
        *complete, _torn = path.read_text("utf-8").split("\\n")  # text after the last newline is not a record
        return decode_records([line for line in complete if line])

    async def save_messages(self, session_id, messages, *, state=None, **kwargs):
        data = "".join(m.to_record() + "\\n" for m in messages).encode()
        fd = os.open(self.directory / f"{session_id}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)


MODE, BASE_URL, HISTORY, PER_CALL, WORKDIR = sys.argv[1:]
WORK = Path(WORKDIR)


def step(n: int) -> dict:
    """Do step n of the plan."""
    with open(WORK / "tools.log", "a") as log:
        log.write(f"{n} {MODE}\\n")
        log.flush()
        os.fsync(log.fileno())
    if n == 3 and MODE == "run":
        (WORK / "ready").write_text(str(os.getpid()))
        time.sleep(120)  # the parent kills the process here
    return {"step": n, "done": True}


async def main():
    history = JsonLinesHistoryProvider(HISTORY[len("jsonl:"):]) if HISTORY.startswith("jsonl:") else HISTORY
    async with OpenAIChatClient("fake-model", base_url=BASE_URL) as client:
        async with client.as_agent(
            name="Worker",
            instructions="Do the plan.",
            tools=[step],
            history=history,
            require_per_service_call_history_persistence=PER_CALL == "1",
        ) as agent:
            session = agent.create_session(session_id="kill-test")
            response = await agent.run("Run steps 1 to 3." if MODE == "run" else None, session=session)
            print(json.dumps({"text": response.text}))


asyncio.run(main())
'''


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as fake:
        yield fake


@pytest.fixture(params=["jsonl", "sqlite"])
def history(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the child keeps history: ``jsonl:<dir>`` (the helper above) or a SQLite file URL."""
    if request.param == "sqlite":
        if importlib.util.find_spec("chatkeep.sql") is None:
            pytest.skip("chatkeep.sql is not installed, so the SQLite file store is not available")
        return f"sqlite:///{tmp_path / 'h.db'}"
    directory = tmp_path / "jsonl"
    directory.mkdir()
    return f"jsonl:{directory}"


async def load_history(history: str) -> list[Message]:
    if history.startswith("jsonl:"):
        path = Path(history[len("jsonl:") :]) / f"{SESSION_ID}.jsonl"
        if not path.exists():
            return []
        return [Message.from_record(line) for line in path.read_text("utf-8").splitlines() if line]
    async with open_store(history) as store:
        return await store.load(SessionKey("default", SESSION_ID))


def child_command(mode: str, server: FakeOpenAIServer, history: str, per_call: bool, workdir: Path) -> list[str]:
    script = workdir / "child.py"
    script.write_text(CHILD, "utf-8")
    return [sys.executable, str(script), mode, server.base_url, history, "1" if per_call else "0", str(workdir)]


def child_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}


async def run_and_kill_at_the_third_tool(server: FakeOpenAIServer, history: str, per_call: bool, workdir: Path) -> None:
    """Start the child, wait until it blocks in the third tool, SIGKILL it."""
    with (workdir / "run.out").open("w") as out, (workdir / "run.err").open("w") as err:
        child = await asyncio.create_subprocess_exec(
            *child_command("run", server, history, per_call, workdir), stdout=out, stderr=err, env=child_env()
        )
        try:
            deadline = time.monotonic() + 60
            while not (workdir / "ready").exists():
                if child.returncode is not None:
                    pytest.fail(f"the child exited ({child.returncode}) early: {(workdir / 'run.err').read_text()}")
                if time.monotonic() > deadline:
                    pytest.fail("the child never reached the third tool")
                await asyncio.sleep(0.02)
        finally:
            if child.returncode is None:
                child.send_signal(signal.SIGKILL)
            returncode = await asyncio.wait_for(child.wait(), 30)
    assert returncode == -signal.SIGKILL


def script_loop(server: FakeOpenAIServer) -> None:
    for n in (1, 2, 3):
        server.reply_tool_calls([(f"call_{n}", "step", json.dumps({"n": n}))])


def call_ids(body: dict[str, Any]) -> list[str]:
    return [c["id"] for m in body["messages"] for c in m.get("tool_calls") or []]


def tool_log(workdir: Path) -> list[str]:
    return (workdir / "tools.log").read_text().splitlines()


def describe(messages: list[Message]) -> list[str]:
    result = []
    for m in messages:
        calls = [c.call_id for c in m.function_calls]
        results = [r.call_id for r in m.function_results]
        result.append(f"{m.role} {' '.join(calls + results) or m.text}")
    return result


async def test_a_killed_tool_loop_keeps_its_completed_calls_and_a_new_process_resumes_without_repeating_them(
    server: FakeOpenAIServer, history: str, tmp_path: Path
) -> None:
    script_loop(server)
    await run_and_kill_at_the_third_tool(server, history, per_call=True, workdir=tmp_path)

    # Two model calls completed with their tool results; the third call's tool never finished.
    after_kill = await load_history(history)
    assert describe(after_kill) == [
        "user Run steps 1 to 3.",
        "assistant call_1",
        "tool call_1",
        "assistant call_2",
        "tool call_2",
    ]
    answered = {r.call_id for m in after_kill for r in m.function_results}
    assert all(c.call_id in answered for m in after_kill for c in m.function_calls), "a dangling tool call"
    assert tool_log(tmp_path) == ["1 run", "2 run", "3 run"]
    assert len(server.requests) == 3

    # A new process continues the same session from the stored history.
    server.reply_tool_calls([("call_3b", "step", '{"n": 3}')])
    server.reply_text("All three steps done.")
    resumed = await asyncio.create_subprocess_exec(
        *child_command("resume", server, history, True, tmp_path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=child_env(),
    )
    stdout, stderr = await asyncio.wait_for(resumed.communicate(), 120)
    assert resumed.returncode == 0, stderr.decode()
    assert json.loads(stdout) == {"text": "All three steps done."}

    resume_call = server.requests[3]
    assert [m["role"] for m in resume_call["messages"]] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert call_ids(resume_call) == ["call_1", "call_2"]  # the completed calls, once each
    assert [m["tool_call_id"] for m in resume_call["messages"] if m["role"] == "tool"] == ["call_1", "call_2"]
    assert len(server.requests) == 5
    # Steps 1 and 2 ran once, in the killed process; only step 3 ran again.
    assert tool_log(tmp_path) == ["1 run", "2 run", "3 run", "3 resume"]
    assert describe(await load_history(history)) == [
        "user Run steps 1 to 3.",
        "assistant call_1",
        "tool call_1",
        "assistant call_2",
        "tool call_2",
        "assistant call_3b",
        "tool call_3b",
        "assistant All three steps done.",
    ]


async def test_without_per_call_persistence_a_killed_tool_loop_stores_nothing(
    server: FakeOpenAIServer, history: str, tmp_path: Path
) -> None:
    script_loop(server)
    await run_and_kill_at_the_third_tool(server, history, per_call=False, workdir=tmp_path)

    assert tool_log(tmp_path) == ["1 run", "2 run", "3 run"]
    assert len(server.requests) == 3
    assert await load_history(history) == []
