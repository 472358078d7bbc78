"""The framework's own Agent and OpenAI clients, on the local server, with their history in ChatkeepHistoryProvider.

The Responses client (``OpenAIChatClient``) stores responses on the service by default, and the framework then
chains the service's copy (``previous_response_id``) and sends the provider's history too: the model would see
every earlier message twice. With a history provider, ``store=False`` keeps one history, chatkeep's; these tests
pass it, and check what the server saw on turn 2 (``seen_inputs`` includes any chained history).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from agent_framework import Agent, AgentSession, InMemoryHistoryProvider, tool
from agent_framework.exceptions import ChatClientException
from agent_framework.openai import OpenAIChatClient, OpenAIChatCompletionClient

from chatkeep.interop.agent_framework import ChatkeepHistoryProvider
from chatkeep.testing.openai_server import FakeOpenAIServer

NO_SERVICE_HISTORY = {"store": False}
TURN_1 = ["user: Weather in Paris?", "call call_1", "output call_1", "assistant: It is sunny in Paris."]


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def responses_items(items: list[dict[str, Any]]) -> list[str]:
    """A Responses API input as one line per item: ``user: text``, ``call get_weather``, ``output call_1``."""
    lines = []
    for item in items:
        if item.get("type") == "function_call":
            lines.append(f"call {item['call_id']}")
        elif item.get("type") == "function_call_output":
            lines.append(f"output {item['call_id']}")
        else:
            content = item["content"]
            text = content if isinstance(content, str) else "".join(part.get("text", "") for part in content)
            lines.append(f"{item['role']}: {text}")
    return lines


def chat_messages(messages: list[dict[str, Any]]) -> list[str]:
    """A Chat Completions request's messages in the same one-line form (tool calls as ``call <id>``)."""
    lines = []
    for message in messages:
        for call in message.get("tool_calls") or []:
            lines.append(f"call {call['id']}")
        if message["role"] == "tool":
            lines.append(f"output {message['tool_call_id']}")
        elif message.get("content"):
            lines.append(f"{message['role']}: {message['content']}")
    return lines


def script_turn_1(server: FakeOpenAIServer) -> None:
    server.reply_tool_calls([("call_1", "get_weather", '{"city": "Paris"}')])
    server.reply_text("It is sunny in Paris.")


async def run(agent: Agent, text: str, session: AgentSession, *, stream: bool) -> str:
    if stream:
        response = agent.run(text, session=session, stream=True)
        async for _ in response:
            pass
        return (await response.get_final_response()).text
    return (await agent.run(text, session=session)).text


@pytest.mark.parametrize("stream", [False, True], ids=["json", "streaming"])
async def test_an_agent_with_a_tool_sees_turn_1_once_on_turn_2(
    openai_env: FakeOpenAIServer, store_url: str, tenant: str, stream: bool
) -> None:
    async with ChatkeepHistoryProvider("memory", store=store_url, tenant=tenant) as history:
        agent = OpenAIChatClient().as_agent(
            name="Weather", tools=[get_weather], context_providers=[history], default_options=NO_SERVICE_HISTORY
        )
        session = agent.create_session()
        script_turn_1(openai_env)
        assert await run(agent, "Weather in Paris?", session, stream=stream) == "It is sunny in Paris."
        openai_env.reply_text("Tomorrow too.")
        assert await run(agent, "And tomorrow?", session, stream=stream) == "Tomorrow too."

        seen = responses_items(openai_env.seen_inputs[-1])
        assert seen == [*TURN_1, "user: And tomorrow?"]
        stored = await history.get_messages(session.session_id)
        kinds = ["text", "function_call", "function_result", "text", "text", "text"]
        assert [m.contents[0].type for m in stored] == kinds


async def test_the_chat_completions_client_sees_turn_1_once_on_turn_2(
    openai_env: FakeOpenAIServer, store_url: str, tenant: str
) -> None:
    async with ChatkeepHistoryProvider(store=store_url, tenant=tenant) as history:
        agent = OpenAIChatCompletionClient().as_agent(
            name="Weather", instructions="Be brief.", tools=[get_weather], context_providers=[history]
        )
        session = agent.create_session()
        script_turn_1(openai_env)
        await agent.run("Weather in Paris?", session=session)
        openai_env.reply_text("Tomorrow too.")
        await run(agent, "And tomorrow?", session, stream=True)
        seen = chat_messages(openai_env.requests[-1]["messages"])
        assert seen == ["system: Be brief.", *TURN_1, "user: And tomorrow?"]


async def test_the_framework_does_not_add_its_in_memory_provider_beside_it(
    openai_env: FakeOpenAIServer, tenant: str
) -> None:
    async with ChatkeepHistoryProvider(store="memory", tenant=tenant) as history:
        agent = OpenAIChatClient().as_agent(context_providers=[history], default_options=NO_SERVICE_HISTORY)
        await agent.run("hi", session=agent.create_session())
        assert agent.context_providers == [history]
        assert not any(isinstance(p, InMemoryHistoryProvider) for p in agent.context_providers)


# -- the reference documentation's Python samples, with ChatkeepHistoryProvider and the local server -------


async def test_sample_in_memory_storage_swapped_for_chatkeep(
    openai_env: FakeOpenAIServer, store_url: str, tenant: str
) -> None:
    # The storage page's sample, with InMemoryHistoryProvider("memory", load_messages=True) swapped.
    agent = OpenAIChatClient().as_agent(
        name="StorageAgent",
        instructions="You are a helpful assistant.",
        context_providers=[ChatkeepHistoryProvider("memory", store=store_url, tenant=tenant, load_messages=True)],
        default_options=NO_SERVICE_HISTORY,
    )

    session = agent.create_session()
    await agent.run("Remember that I like Italian food.", session=session)
    await agent.run("What kind of food do I like?", session=session)

    assert responses_items(openai_env.seen_inputs[-1]) == [
        "user: Remember that I like Italian food.",
        "assistant: You said: Remember that I like Italian food.",
        "user: What kind of food do I like?",
    ]
    await agent.context_providers[0].aclose()  # type: ignore[attr-defined]


async def test_sample_database_history_provider(openai_env: FakeOpenAIServer, store_url: str, tenant: str) -> None:
    # The "third-party storage" sample: DatabaseHistoryProvider(db_client) is this provider on a chatkeep store.
    history = ChatkeepHistoryProvider(store=store_url, tenant=tenant)
    agent = OpenAIChatClient().as_agent(
        name="StorageAgent",
        instructions="You are a helpful assistant.",
        context_providers=[history],
        default_options=NO_SERVICE_HISTORY,
    )

    session = agent.create_session()
    await agent.run("Store this conversation.", session=session)

    stored = await history.store.load(history.session_key(session.session_id))
    assert [(m.role, m.text) for m in stored] == [
        ("user", "Store this conversation."),
        ("assistant", "You said: Store this conversation."),
    ]
    await history.aclose()


async def test_sample_session_serialization_resumes(openai_env: FakeOpenAIServer, store_url: str, tenant: str) -> None:
    async with ChatkeepHistoryProvider(store=store_url, tenant=tenant) as history:
        agent = OpenAIChatClient().as_agent(context_providers=[history], default_options=NO_SERVICE_HISTORY)
        session = agent.create_session()
        await agent.run("My name is Ada.", session=session)

        serialized = session.to_dict()
        # Store serialized payload in durable storage.
        resumed = AgentSession.from_dict(json.loads(json.dumps(serialized)))

        await agent.run("What is my name?", session=resumed)
        assert responses_items(openai_env.seen_inputs[-1]) == [
            "user: My name is Ada.",
            "assistant: You said: My name is Ada.",
            "user: What is my name?",
        ]


async def test_sample_per_service_call_persistence_stores_each_model_call(
    openai_env: FakeOpenAIServer, store_url: str, tenant: str
) -> None:
    # The sample with require_per_service_call_history_persistence=True: history is stored after each model
    # call, so what the first call produced is kept even when the run fails on the second.
    async with ChatkeepHistoryProvider("memory", store=store_url, tenant=tenant, load_messages=True) as history:
        agent = Agent(
            client=OpenAIChatClient(),
            name="StorageAgent",
            instructions="You are a helpful assistant.",
            tools=[get_weather],
            context_providers=[history],
            require_per_service_call_history_persistence=True,
            default_options=NO_SERVICE_HISTORY,
        )
        failing = agent.create_session()
        openai_env.reply_tool_calls([("call_1", "get_weather", '{"city": "Paris"}')])
        openai_env.fail(400, message="the model is gone")
        with pytest.raises(ChatClientException, match="the model is gone"):
            await agent.run("Weather in Paris?", session=failing)
        kept = await history.get_messages(failing.session_id)
        assert [(m.role, m.contents[0].type) for m in kept] == [("user", "text"), ("assistant", "function_call")]

        session = agent.create_session()
        script_turn_1(openai_env)
        await agent.run("Weather in Paris?", session=session)
        openai_env.reply_text("Tomorrow too.")
        await agent.run("And tomorrow?", session=session)
        assert responses_items(openai_env.seen_inputs[-1]) == [*TURN_1, "user: And tomorrow?"]
        assert len(await history.get_messages(session.session_id)) == 6  # each message stored once


async def test_sample_audit_provider_stores_what_the_frameworks_audit_provider_stores(
    openai_env: FakeOpenAIServer, store_url: str, tenant: str
) -> None:
    # The tip: an audit provider (load_messages=False, store_context_messages=True) beside the primary one.
    reference = InMemoryHistoryProvider("audit-reference", load_messages=False, store_context_messages=True)
    async with ChatkeepHistoryProvider(
        "audit", store=store_url, tenant=tenant, load_messages=False, store_context_messages=True
    ) as audit:
        agent = OpenAIChatClient().as_agent(
            context_providers=[InMemoryHistoryProvider("memory", load_messages=True), reference, audit],
            default_options=NO_SERVICE_HISTORY,
        )
        session = agent.create_session()
        await agent.run("first", session=session)
        await agent.run("second", session=session)
        ours = [m.to_dict() for m in await audit.get_messages(session.session_id)]
        theirs = [m.to_dict() for m in await reference.get_messages(None, state=session.state["audit-reference"])]
        assert ours == theirs
        assert len(ours) == 4


# -- a session resumed in a new process ---------------------------------------------------------------------

RESUME = textwrap.dedent(
    """
    import asyncio, json, os, sys
    from agent_framework import AgentSession, tool
    from agent_framework.openai import OpenAIChatClient
    from chatkeep.interop.agent_framework import ChatkeepHistoryProvider

    @tool
    def get_weather(city: str) -> str:
        \"\"\"The weather in a city.\"\"\"
        return f"sunny in {city}"

    async def main() -> None:
        async with ChatkeepHistoryProvider("memory", store=os.environ["STORE_URL"], tenant=os.environ["TENANT"]) as h:
            agent = OpenAIChatClient().as_agent(
                name="Weather", tools=[get_weather], context_providers=[h], default_options={"store": False}
            )
            session = AgentSession.from_dict(json.loads(sys.stdin.read()))
            print((await agent.run("And tomorrow?", session=session)).text)

    asyncio.run(main())
    """
)


async def test_a_session_resumed_in_a_new_process_sends_turn_1_once(
    openai_env: FakeOpenAIServer, store_url: str, tenant: str, tmp_path: Path
) -> None:
    if store_url.startswith("memory"):
        pytest.skip("a memory:// store lives in one process")
    async with ChatkeepHistoryProvider("memory", store=store_url, tenant=tenant) as history:
        agent = OpenAIChatClient().as_agent(
            name="Weather", tools=[get_weather], context_providers=[history], default_options=NO_SERVICE_HISTORY
        )
        session = agent.create_session()
        script_turn_1(openai_env)
        await agent.run("Weather in Paris?", session=session)

    openai_env.reply_text("Tomorrow too.")
    env = {**os.environ, "STORE_URL": store_url, "TENANT": tenant}
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        RESUME,
        env=env,
        cwd=tmp_path,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(child.communicate(json.dumps(session.to_dict()).encode()), timeout=120)
    assert child.returncode == 0, err.decode()
    assert out.decode().strip() == "Tomorrow too."
    seen = responses_items(openai_env.seen_inputs[-1])
    assert seen == [*TURN_1, "user: And tomorrow?"]
    assert Counter(seen)["user: Weather in Paris?"] == 1
