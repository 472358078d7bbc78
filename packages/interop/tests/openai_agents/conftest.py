"""The Agents SDK pointed at the local OpenAI-protocol server, and sessions on each target store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from agents import OpenAIChatCompletionsModel, OpenAIResponsesModel, set_tracing_disabled
from agents.models.interface import Model
from openai import AsyncOpenAI

from chatkeep.interop.openai_agents import ChatkeepSession
from chatkeep.testing.openai_server import FakeOpenAIServer

SessionFactory = Callable[..., Awaitable[ChatkeepSession]]


@pytest.fixture(autouse=True, scope="session")
def _no_tracing() -> None:
    # The SDK exports traces to api.openai.com by default; the tests never reach the network.
    set_tracing_disabled(True)


@pytest.fixture
async def openai_client(openai_server: FakeOpenAIServer) -> AsyncIterator[AsyncOpenAI]:
    """The real ``openai`` client, talking to the local server."""
    client = AsyncOpenAI(base_url=openai_server.base_url, api_key="test-key", max_retries=0)
    yield client
    await client.close()


@pytest.fixture(params=["responses", "chat_completions"])
def model(request: pytest.FixtureRequest, openai_client: AsyncOpenAI) -> Model:
    """The SDK's model for each API the server speaks."""
    if request.param == "responses":
        return OpenAIResponsesModel(model="fake-model", openai_client=openai_client)
    return OpenAIChatCompletionsModel(model="fake-model", openai_client=openai_client)


@pytest.fixture
def responses_model(openai_client: AsyncOpenAI) -> Model:
    """The SDK's Responses API model (the SDK's default API)."""
    return OpenAIResponsesModel(model="fake-model", openai_client=openai_client)


@pytest.fixture
async def make_session(store_url: str, tenant: str) -> AsyncIterator[SessionFactory]:
    """Open sessions on the test's store (each opens the URL, as a user would); all are closed at the end."""
    opened: list[ChatkeepSession] = []

    async def make(session_id: str = "s1", **options: Any) -> ChatkeepSession:
        session = ChatkeepSession(session_id, store=store_url, tenant=tenant, **options)
        opened.append(session)
        return session

    yield make
    for session in opened:
        if not session.store.closed:
            await session.clear_session()
            await session.close()
