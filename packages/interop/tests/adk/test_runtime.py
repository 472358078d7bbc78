"""ADK's own runtime on the adapter: a ``Runner`` with an ``LlmAgent`` and a tool, through ADK's ``LiteLlm`` model
class pointed at the project's local OpenAI-protocol server, for two turns; the second in a new process."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from subprocess import PIPE

import pytest
from google.adk.agents import LlmAgent
from google.adk.models.lite_llm import LiteLlm
from google.adk.runners import Runner
from google.genai import types

from chatkeep.interop.adk import ChatkeepSessionService
from chatkeep.testing.openai_server import FakeOpenAIServer

ServiceFactory = Callable[[], ChatkeepSessionService]

APP, USER = "weather-app", "user-1"
QUESTION = "What is the weather in Paris?"
ANSWER = "Sunny in Paris, 21 degrees."
FOLLOW_UP = "And tomorrow?"
LATER = "Rain tomorrow."


def get_weather(city: str) -> dict[str, str]:
    """The weather in a city.

    Args:
        city: the city's name.
    """
    return {"report": f"tool says: sunny, 21C in {city}"}


def _agent(base_url: str) -> LlmAgent:
    model = LiteLlm(model="openai/fake-model", api_base=base_url, api_key="test-key")
    return LlmAgent(name="weather", model=model, instruction="Answer about the weather.", tools=[get_weather])


async def _run(runner: Runner, session_id: str, text: str) -> str:
    """One turn; the final answer's text."""
    message = types.Content(role="user", parts=[types.Part(text=text)])
    final = ""
    async for event in runner.run_async(user_id=USER, session_id=session_id, new_message=message):
        if event.is_final_response() and event.content and event.content.parts:
            final = "".join(part.text or "" for part in event.content.parts)
    return final


def _sent(server: FakeOpenAIServer) -> str:
    """What the last model call was sent, as JSON text."""
    return json.dumps(server.requests[-1]["messages"], ensure_ascii=False)


def _assert_turn_1_sent_once(server: FakeOpenAIServer) -> None:
    sent = _sent(server)
    for part in (QUESTION, "tool says: sunny, 21C in Paris", ANSWER, FOLLOW_UP):
        assert sent.count(part) == 1, (part, sent)
    assert sent.count("call_paris") == 2, sent  # the call and its result, each once


async def _turn_1(service: ChatkeepSessionService, server: FakeOpenAIServer) -> str:
    server.reply_tool_calls([("call_paris", "get_weather", '{"city": "Paris"}')])
    server.reply_text(ANSWER)
    session = await service.create_session(app_name=APP, user_id=USER, state={"user:units": "metric"})
    runner = Runner(agent=_agent(server.base_url), app_name=APP, session_service=service)
    assert await _run(runner, session.id, QUESTION) == ANSWER
    return session.id


async def test_two_turns_with_a_tool_keep_the_history(
    make_service: ServiceFactory, openai_server: FakeOpenAIServer
) -> None:
    session_id = await _turn_1(make_service(), openai_server)
    # Turn 2 on another service and store object (the same data), as a restarted server would.
    openai_server.reply_text(LATER)
    service = make_service()
    runner = Runner(agent=_agent(openai_server.base_url), app_name=APP, session_service=service)
    assert await _run(runner, session_id, FOLLOW_UP) == LATER
    _assert_turn_1_sent_once(openai_server)
    stored = await service.get_session(app_name=APP, user_id=USER, session_id=session_id)
    assert stored is not None
    authors = [event.author for event in stored.events]
    assert authors == ["user", "weather", "weather", "weather", "user", "weather"]
    assert stored.state["user:units"] == "metric"


def test_the_blocking_runner_runs_each_turn_on_an_event_loop_of_its_own(
    openai_server: FakeOpenAIServer, store_url: str, tenant: str
) -> None:
    # Runner.run runs run_async with asyncio.run in a thread per call: one service serves each new loop in turn.
    service = ChatkeepSessionService(store_url, tenant=tenant)
    try:
        session = asyncio.run(service.create_session(app_name=APP, user_id=USER))
        runner = Runner(agent=_agent(openai_server.base_url), app_name=APP, session_service=service)
        for text, answer in ((QUESTION, ANSWER), (FOLLOW_UP, LATER)):
            openai_server.reply_text(answer)
            message = types.Content(role="user", parts=[types.Part(text=text)])
            events = list(runner.run(user_id=USER, session_id=session.id, new_message=message))
            assert events[-1].content is not None
            assert events[-1].content.parts is not None
            assert events[-1].content.parts[0].text == answer
        sent = _sent(openai_server)
        assert (sent.count(QUESTION), sent.count(ANSWER)) == (1, 1)
        stored = asyncio.run(service.get_session(app_name=APP, user_id=USER, session_id=session.id))
        assert stored is not None
        assert len(stored.events) == 4
    finally:
        asyncio.run(service.store.delete_tenant(tenant))
        asyncio.run(service.close())


TURN_2 = """
import asyncio, json, sys
from google.adk.agents import LlmAgent
from google.adk.models.lite_llm import LiteLlm
from google.adk.runners import Runner
from google.genai import types
from chatkeep.interop.adk import ChatkeepSessionService

def get_weather(city: str) -> dict:
    \"\"\"The weather in a city.\"\"\"
    return {"report": f"tool says: sunny, 21C in {city}"}

async def turn_2(base_url, store_url, tenant, session_id):
    model = LiteLlm(model="openai/fake-model", api_base=base_url, api_key="test-key")
    agent = LlmAgent(name="weather", model=model, instruction="Answer about the weather.", tools=[get_weather])
    async with ChatkeepSessionService(store_url, tenant=tenant) as service:
        runner = Runner(agent=agent, app_name="weather-app", session_service=service)
        message = types.Content(role="user", parts=[types.Part(text="And tomorrow?")])
        final = ""
        async for event in runner.run_async(user_id="user-1", session_id=session_id, new_message=message):
            if event.is_final_response() and event.content and event.content.parts:
                final = "".join(part.text or "" for part in event.content.parts)
        return final

async def main(base_url, tenant, sessions):
    for name, (store_url, session_id) in json.loads(sessions).items():
        print(json.dumps({name: await turn_2(base_url, store_url, tenant, session_id)}), flush=True)

asyncio.run(main(*sys.argv[1:]))
"""


async def test_turn_2_in_a_new_process(
    openai_server: FakeOpenAIServer, store_urls: dict[str, str], tenant: str, tmp_path: Path
) -> None:
    # One new process serves every persistent target in turn (it pays ADK's and LiteLLM's import once); the
    # server's requests arrive in the targets' order, each turn 2 after its turn 1 was stored by this process.
    targets = {name: url for name, url in store_urls.items() if not url.startswith("memory")}
    if not targets:
        pytest.skip("a memory store lives in one process: a new process starts with no history by design")
    services = {name: ChatkeepSessionService(url, tenant=tenant) for name, url in targets.items()}
    try:
        sessions = {name: (targets[name], await _turn_1(service, openai_server)) for name, service in services.items()}
        turn_1_requests = len(openai_server.requests)
        for _ in targets:
            openai_server.reply_text(LATER)
        script = tmp_path / "turn_2.py"
        script.write_text(textwrap.dedent(TURN_2), encoding="utf-8")
        # A process of its own (asyncio's subprocess: the server in this process must keep answering meanwhile).
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(script), openai_server.base_url, tenant, json.dumps(sessions), stdout=PIPE, stderr=PIPE
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=300)
        assert process.returncode == 0, stderr.decode()
        answers = {name: text for line in stdout.decode().splitlines() for name, text in json.loads(line).items()}
        assert answers == dict.fromkeys(targets, LATER)
        for n, (name, service) in enumerate(services.items()):
            sent = json.dumps(openai_server.requests[turn_1_requests + n]["messages"], ensure_ascii=False)
            for part in (QUESTION, "tool says: sunny, 21C in Paris", ANSWER, FOLLOW_UP):
                assert sent.count(part) == 1, (name, part, sent)
            stored = await service.get_session(app_name=APP, user_id=USER, session_id=sessions[name][1])
            assert stored is not None
            texts = [e.content.parts[0].text for e in stored.events if e.content and e.content.parts[0].text]
            assert (len(stored.events), texts) == (6, [QUESTION, ANSWER, FOLLOW_UP, LATER]), name
    finally:
        for service in services.values():
            await service.store.delete_tenant(tenant)
            await service.close()
