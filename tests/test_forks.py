"""Forks at the agent level: ``Agent.fork_session`` and the docs page where an agent rewinds and branches off."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from chatkeep.core import (
    Agent,
    AgentConfigurationError,
    InvalidArgumentError,
    SessionKey,
    SessionOwnershipError,
    open_store,
)
from chatkeep.testing.openai_server import FakeOpenAIServer
from chatkeep.testing.scripted import ScriptedChatClient

PAGE = Path(__file__).resolve().parents[1] / "docs" / "forks.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def test_the_forks_page_rewinds_an_agent_and_prints_what_it_shows(tmp_path: Path) -> None:
    blocks = BLOCK.findall(PAGE.read_text(encoding="utf-8"))
    program = next(text for language, text in blocks if language == "python" and "asyncio.run" in text)
    shown = next(text for language, text in blocks if language == "output")
    (tmp_path / "agent.py").write_text(program, encoding="utf-8")
    with FakeOpenAIServer() as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
        env.update(OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY="test-key")
        done = subprocess.run(
            [sys.executable, "agent.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == shown.splitlines()


async def test_fork_session_continues_from_a_message_and_keeps_the_old_branch() -> None:
    store = open_store(f"memory://fork-{uuid.uuid4().hex}")
    client = ScriptedChatClient()
    agent = Agent(client, history=store)
    session = agent.create_session(tenant="acme")
    session.state["mine"] = {"step": 1}
    await agent.run("one", session=session)
    await agent.run("two", session=session)
    await store.save_session(SessionKey.of(session), session, owner="alice")
    first_answer = (await store.load(SessionKey.of(session)))[1]

    branch = await agent.fork_session(session, through=first_answer.message_id, session_id="branch")
    assert (branch.session_id, branch.tenant, branch.state) == ("branch", "acme", {"mine": {"step": 1}})
    branch.state["mine"]["step"] = 2
    assert session.state == {"mine": {"step": 1}}, "the fork shares its state with the old session"
    await agent.run("three", session=branch)
    assert client.requests[-1].texts == ["user: one", "assistant: echo: one", "user: three"]
    assert [m.text for m in await store.load(SessionKey.of(session))] == [
        "one",
        "echo: one",
        "two",
        "echo: two",
    ]
    stored = await store.load_session(SessionKey("acme", "branch"), owner="alice")
    assert stored is not None
    assert stored.owner == "alice"
    with pytest.raises(SessionOwnershipError):
        await store.load_session(SessionKey("acme", "branch"), owner="mallory")
    await store.close()


async def test_fork_session_refuses_what_it_cannot_fork() -> None:
    agent = Agent(ScriptedChatClient())
    with pytest.raises(AgentConfigurationError, match="history="):
        await agent.fork_session(agent.create_session())
    store = open_store(f"memory://fork-{uuid.uuid4().hex}")
    agent = Agent(ScriptedChatClient(), history=store)
    session = agent.create_session()
    with pytest.raises(InvalidArgumentError, match="no messages"):
        await agent.fork_session(session)
    await agent.run("hi", session=session)
    with pytest.raises(InvalidArgumentError, match="not in session"):
        await agent.fork_session(session, through="not-a-message")
    with pytest.raises(AgentConfigurationError, match="service-managed"):
        await agent.fork_session(agent.get_session(service_session_id="resp_1"))
    await store.close()
