"""A real Pydantic AI ``Agent`` with a tool, on the local OpenAI-protocol server, its history in the store."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.conversation import Conversation
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from chatkeep.interop.pydantic_ai import ChatkeepConversationStore
from chatkeep.testing.openai_server import FakeOpenAIServer

StoreFactory = Callable[[], ChatkeepConversationStore]
NewProcess = Callable[..., Awaitable[str]]

QUESTION = "What is the weather in Paris?"
TOOL_SAYS = "tool says: sunny, 21 degrees in Paris"
ANSWER = "Sunny in Paris, 21 degrees."


def _agent(base_url: str) -> Agent[None, str]:
    model = OpenAIChatModel("fake-model", provider=OpenAIProvider(base_url=base_url, api_key="test-key"))
    agent = Agent(model, instructions="Answer about the weather.")

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"tool says: sunny, 21 degrees in {city}"

    return agent


async def _turn(store: ChatkeepConversationStore, agent: Agent[None, str], prompt: str) -> str:
    """One turn as the issue puts it: ``message_history=`` loaded through the store, ``new_messages()`` saved."""
    conversation = await store.load("c1") or Conversation(conversation_id="c1")
    result = await agent.run(prompt, message_history=conversation.messages)
    conversation.messages += result.new_messages()
    conversation.usage = conversation.usage + result.usage
    await store.save(conversation)
    return result.output


def _turn_1_once(body: dict[str, Any]) -> None:
    """A later turn's request holds each part of turn 1 once: the question, the call, the tool's answer, the answer."""
    sent = json.dumps(body["messages"], ensure_ascii=False)
    for part in (QUESTION, TOOL_SAYS, ANSWER, "call_paris"):
        assert sent.count(part) == (2 if part == "call_paris" else 1), (part, sent)  # the call and its result


def _script_turn_1(server: FakeOpenAIServer) -> None:
    server.reply_tool_calls([("call_paris", "get_weather", '{"city": "Paris"}')])
    server.reply_text(ANSWER)


async def test_a_tool_run_is_kept_and_the_next_turn_sends_it_once(
    make_store: StoreFactory, openai_server: FakeOpenAIServer
) -> None:
    agent = _agent(openai_server.base_url)
    _script_turn_1(openai_server)
    assert await _turn(make_store(), agent, QUESTION) == ANSWER
    openai_server.reply_text("Rain tomorrow.")
    assert await _turn(make_store(), agent, "And tomorrow?") == "Rain tomorrow."
    _turn_1_once(openai_server.requests[-1])
    stored = await make_store().load("c1")
    assert stored is not None
    # request, response with the call, the tool's return, the answer; then the second question and answer
    assert [m.kind for m in stored.messages] == ["request", "response", "request", "response", "request", "response"]
    assert stored.usage.requests == 3


async def test_a_conversation_carried_whole_through_runs(
    make_store: StoreFactory, openai_server: FakeOpenAIServer
) -> None:
    # Pydantic AI's own way: conversation= in, store.save(result) out (the run tells the store what is new).
    agent, store = _agent(openai_server.base_url), make_store()
    _script_turn_1(openai_server)
    result = await agent.run(QUESTION, conversation=Conversation(conversation_id="c1"))
    await store.save(result)
    openai_server.reply_text("Rain tomorrow.")
    loaded = await make_store().load("c1")
    assert loaded is not None
    again = await agent.run("And tomorrow?", conversation=loaded)
    new = await store.save(again)
    assert again.output == "Rain tomorrow."
    assert len(new) == 2
    _turn_1_once(openai_server.requests[-1])


TURN_2 = """
import asyncio, sys
from pydantic_ai import Agent
from pydantic_ai.conversation import Conversation
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from chatkeep.interop.pydantic_ai import ChatkeepConversationStore

async def main(base_url, store_url, tenant):
    model = OpenAIChatModel("fake-model", provider=OpenAIProvider(base_url=base_url, api_key="test-key"))
    agent = Agent(model, instructions="Answer about the weather.")

    @agent.tool_plain
    def get_weather(city: str) -> str:
        \"\"\"The weather in a city.\"\"\"
        return f"tool says: sunny, 21 degrees in {city}"

    async with ChatkeepConversationStore(store_url, tenant=tenant) as store:
        conversation = await store.load("c1") or Conversation(conversation_id="c1")
        result = await agent.run("And tomorrow?", message_history=conversation.messages)
        conversation.messages += result.new_messages()
        await store.save(conversation)
    print(result.output)

asyncio.run(main(*sys.argv[1:]))
"""


async def test_history_survives_a_new_process(
    make_store: StoreFactory, openai_server: FakeOpenAIServer, store_url: str, tenant: str, new_process: NewProcess
) -> None:
    if store_url.startswith("memory"):
        pytest.skip("the memory store lives in one process: a new process starts with no history by design")
    _script_turn_1(openai_server)
    await _turn(make_store(), _agent(openai_server.base_url), QUESTION)
    openai_server.reply_text("Rain tomorrow.")
    assert await new_process(TURN_2, openai_server.base_url, store_url, tenant) == "Rain tomorrow."
    _turn_1_once(openai_server.requests[-1])
    stored = await make_store().load("c1")
    assert stored is not None
    assert len(stored.messages) == 6
