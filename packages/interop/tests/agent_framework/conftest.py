"""Fixtures for the Agent Framework adapter: a provider on every target store, the OpenAI client on the local server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from chatkeep.interop.agent_framework import ChatkeepHistoryProvider
from chatkeep.testing.openai_server import FakeOpenAIServer


@pytest.fixture
async def provider(store_url: str, tenant: str) -> AsyncIterator[ChatkeepHistoryProvider]:
    """A provider on one of the target stores, in a tenant of the test's own."""
    async with ChatkeepHistoryProvider("memory", store=store_url, tenant=tenant) as made:
        yield made


@pytest.fixture
def openai_env(openai_server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> FakeOpenAIServer:
    """The local server, where the framework's OpenAI clients look (the environment): ``OpenAIChatClient()`` works."""
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.base_url)
    monkeypatch.setenv("OPENAI_MODEL", "fake-model")
    return openai_server
