"""A backend's bare name, or a bare scheme, opens the same store wherever a URL is taken (real discovery)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chatkeep.core import Agent, SessionKey, history_provider, open_store
from chatkeep.core.plugins import default_registry
from chatkeep.testing.scripted import ScriptedChatClient


@pytest.mark.parametrize(
    ("name", "url"),
    [
        ("redis", "redis://localhost:6379/0"),
        ("memory", "memory://"),
        ("sql", "sqlite://"),
        ("sqlite", "sqlite://"),
        ("blob", "azblob://chatkeep"),
    ],
)
def test_a_bare_word_stands_for_one_url_everywhere(name: str, url: str) -> None:
    spec = default_registry().resolve(name)

    assert spec.url_for(name) == url
    assert spec is default_registry().resolve(url)


async def test_open_store_redis_opens_the_default_local_server_without_connecting() -> None:
    store = open_store("redis")

    assert type(store).__name__ == "RedisHistoryStore"
    assert "localhost:6379" in repr(store.describe())
    await store.close()


async def test_an_agent_with_history_sqlite_keeps_its_conversation_in_the_default_sqlite_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))  # where sqlite:// keeps its file
    client = ScriptedChatClient()
    client.reply_text("noted")
    async with Agent(client, name="a", history="sqlite") as agent:
        session = agent.create_session()
        await agent.run("I like Italian food.", session=session)
    assert (tmp_path / "chatkeep" / "history.db").exists()
    async with open_store("sqlite://") as store:
        stored = await store.load(SessionKey(session.tenant, session.session_id))
    assert [m.text for m in stored] == ["I like Italian food.", "noted"]


async def test_history_provider_takes_a_bare_backend_name() -> None:
    provider = history_provider("memory", max_messages=5)
    try:
        assert type(provider.store).__name__ == "MemoryHistoryStore"
    finally:
        await provider.close()


def test_the_cli_takes_a_bare_backend_name_as_store(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
    default_file = tmp_path / "chatkeep" / "history.db"

    def chatkeep(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "chatkeep.core.cli", *args, "--store", "sqlite"]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)

    # A read command names the default file it did not find, and creates nothing.
    missing = chatkeep("sessions", "list", "--json")
    assert missing.returncode == 1
    assert str(default_file) in missing.stderr
    assert not default_file.exists()

    assert chatkeep("migrate").returncode == 0  # a command that writes creates it
    listed = chatkeep("sessions", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["sessions"] == []
    assert default_file.exists()
