"""The built-in offline model: it quotes the history it was sent, streams, and keeps no conversations."""

from __future__ import annotations

import pytest

from chatkeep.core import AgentConfigurationError
from chatkeep.core.offline import OfflineChatClient


async def test_it_answers_from_the_history_it_was_sent() -> None:
    agent = OfflineChatClient().as_agent(name="demo")
    session = agent.create_session()
    first = await agent.run("I like Italian food.", session=session)
    assert first.text.startswith("[offline demo model")
    assert "start of our conversation" in first.text
    second = await agent.run("What do I like?", session=session)
    assert "\u201cI like Italian food.\u201d" in second.text
    assert "2 earlier messages" in second.text


async def test_it_streams_word_by_word_then_the_whole_answer() -> None:
    agent = OfflineChatClient().as_agent(name="demo")
    chunks = []
    response = None
    async for update in agent.run_stream("hello there", session=agent.create_session()):
        if update.response is not None:
            response = update.response
        else:
            chunks.append(update.text)
    assert response is not None
    assert len(chunks) > 3
    assert "".join(chunks) == response.text


async def test_a_session_kept_by_a_model_service_is_refused_not_silently_forgotten() -> None:
    agent = OfflineChatClient().as_agent(name="demo")
    session = agent.get_session(service_session_id="conv_123")
    with pytest.raises(AgentConfigurationError, match="conv_123") as caught:
        await agent.run("hi", session=session)
    assert "service_session_id" in str(caught.value)
    assert session.service_session_id == "conv_123"
