"""The SDK's own runtime (``Runner.run``, ``Runner.run_streamed``) with ``ChatkeepSession``, on the local server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, TResponseInputItem, function_tool
from agents.memory import SessionSettings
from agents.models.interface import Model
from openai import AsyncOpenAI

from chatkeep.interop.openai_agents import ChatkeepSession
from chatkeep.testing.openai_server import FakeOpenAIServer

SessionFactory = Callable[..., Awaitable[ChatkeepSession]]

QUESTION = "What is the weather in Paris?"
ANSWER = "Sunny in Paris, 21 degrees."
# A reasoning model's thought before its tool call (the Responses API only): the server refuses a later request
# that sends the call back without this reasoning item, or with its encrypted content changed.
REASONING = "The user asks about Paris: call get_weather."


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: the city's name.
    """
    return f"tool says: sunny, 21°C in {city}"


def _agent(model: Model) -> Agent:
    return Agent(name="weather", instructions="Answer about the weather.", tools=[get_weather], model=model)


def _script_turn_1(server: FakeOpenAIServer) -> None:
    server.reply_tool_calls([("call_paris", "get_weather", '{"city": "Paris"}')], reasoning=REASONING)
    server.reply_text(ANSWER)


def _assert_turn_1_exactly_once(body: dict[str, Any]) -> None:
    """The request of a later turn holds each part of turn 1 once: question, reasoning, call, tool output, answer."""
    sent = json.dumps(body.get("input", body.get("messages")), ensure_ascii=False)
    parts = (QUESTION, "tool says: sunny, 21°C in Paris", ANSWER) + ((REASONING,) if "input" in body else ())
    for part in parts:
        assert sent.count(part) == 1, (part, sent)
    assert sent.count('{\\"city\\": \\"Paris\\"}') == 1, sent


def _kinds(items: list[TResponseInputItem]) -> list[str]:
    return [str(dict(item).get("type", "message")) for item in items]


def _turn_1_kinds(model: Model) -> list[str]:
    """What turn 1 stores: a Responses model's reasoning item comes before its call (Chat Completions has none)."""
    reasoning = ["reasoning"] if isinstance(model, OpenAIResponsesModel) else []
    return ["message", *reasoning, "function_call", "function_call_output", "message"]


async def test_a_tool_run_is_kept_and_the_next_turn_sends_it_once(
    make_session: SessionFactory, model: Model, openai_server: FakeOpenAIServer
) -> None:
    _script_turn_1(openai_server)
    result = await Runner.run(_agent(model), QUESTION, session=await make_session())
    assert result.final_output == ANSWER
    stored = await (await make_session()).get_items()
    assert _kinds(stored) == _turn_1_kinds(model)

    openai_server.reply_text("Rain tomorrow.")
    again = await Runner.run(_agent(model), "And tomorrow?", session=await make_session())
    assert again.final_output == "Rain tomorrow."
    _assert_turn_1_exactly_once(openai_server.requests[-1])
    assert len(await (await make_session()).get_items()) == len(_turn_1_kinds(model)) + 2


async def test_a_streamed_run_is_kept_like_a_plain_one(
    make_session: SessionFactory, model: Model, openai_server: FakeOpenAIServer
) -> None:
    _script_turn_1(openai_server)
    streamed = Runner.run_streamed(_agent(model), QUESTION, session=await make_session())
    async for _ in streamed.stream_events():
        pass
    assert streamed.final_output == ANSWER
    stored = await (await make_session()).get_items()
    assert _kinds(stored) == _turn_1_kinds(model)

    openai_server.reply_text("Rain tomorrow.")
    second = Runner.run_streamed(_agent(model), "And tomorrow?", session=await make_session())
    async for _ in second.stream_events():
        pass
    assert second.final_output == "Rain tomorrow."
    _assert_turn_1_exactly_once(openai_server.requests[-1])


TURN_2 = """
import asyncio, sys
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI
from chatkeep.interop.openai_agents import ChatkeepSession

@function_tool
def get_weather(city: str) -> str:
    \"\"\"The weather in a city.\"\"\"
    return f"tool says: sunny, 21°C in {city}"

async def main(base_url, store_url, tenant):
    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=base_url, api_key="test-key", max_retries=0)
    agent = Agent(name="weather", instructions="Answer about the weather.", tools=[get_weather],
                  model=OpenAIResponsesModel(model="fake-model", openai_client=client))
    session = ChatkeepSession("s1", store=store_url, tenant=tenant)
    result = await Runner.run(agent, "And tomorrow?", session=session)
    print(result.final_output)
    await session.close()
    await client.close()

asyncio.run(main(*sys.argv[1:]))
"""


async def test_history_survives_a_new_process(
    make_session: SessionFactory,
    responses_model: Model,
    openai_server: FakeOpenAIServer,
    store_url: str,
    tenant: str,
    new_process: Callable[..., Awaitable[str]],
) -> None:
    if store_url.startswith("memory"):
        pytest.skip("the memory store lives in one process: a new process starts with no history by design")
    _script_turn_1(openai_server)
    await Runner.run(_agent(responses_model), QUESTION, session=await make_session())

    openai_server.reply_text("Rain tomorrow.")
    assert await new_process(TURN_2, openai_server.base_url, store_url, tenant) == "Rain tomorrow."
    _assert_turn_1_exactly_once(openai_server.requests[-1])
    assert _kinds(await (await make_session()).get_items())[-2:] == ["message", "message"]


async def _turn_2_through_a_window(session: ChatkeepSession, model: Model, server: FakeOpenAIServer) -> str:
    """Turn 1 (a tool call), then turn 2 sent with the session's window as it is; what turn 2 sent, as JSON.

    With a session_input_callback the SDK sends the window as the session returned it (its own pruning is off),
    so what is sent is the session's rule at work; the local server, like the service, refuses an output
    without its call and an item without the reasoning it came with.
    """
    _script_turn_1(server)
    await Runner.run(_agent(model), QUESTION, session=session)
    server.reply_text("Rain tomorrow.")
    config = RunConfig(session_input_callback=lambda history, new: history + new)
    result = await Runner.run(_agent(model), "And tomorrow?", session=session, run_config=config)
    assert result.final_output == "Rain tomorrow."
    body = server.requests[-1]
    sent = json.dumps(body.get("input", body.get("messages")), ensure_ascii=False)
    assert ANSWER in sent
    assert QUESTION not in sent
    return sent


async def test_a_limit_never_sends_a_tool_output_without_its_call(
    make_session: SessionFactory, model: Model, openai_server: FakeOpenAIServer
) -> None:
    # As the SDK's own test_session_limit_drops_unmatched_history_function_call_output: a window of 2 cuts
    # between the call and its output.
    session = await make_session(session_settings=SessionSettings(limit=2))
    sent = await _turn_2_through_a_window(session, model, openai_server)
    assert "tool says" not in sent


@pytest.mark.parametrize("limit", [3, 4])
async def test_a_limit_never_sends_an_item_without_the_reasoning_it_came_with(
    make_session: SessionFactory, responses_model: Model, openai_server: FakeOpenAIServer, limit: int
) -> None:
    # Turn 1 stores: question, reasoning, call, output, answer. A window of 3 starts at the call, of 4 at the
    # reasoning item: the first would send the call without its reasoning, which the service refuses.
    session = await make_session(session_settings=SessionSettings(limit=limit))
    sent = await _turn_2_through_a_window(session, responses_model, openai_server)
    if limit == 3:  # the call and its output went with the reasoning they needed
        assert "tool says" not in sent
        assert REASONING not in sent
    else:  # the window starts at the reasoning item: all of it is sent, once
        for part in (REASONING, "tool says: sunny, 21°C in Paris"):
            assert sent.count(part) == 1, (part, sent)


# run_sync calls loop.shutdown_asyncgens() after each run but keeps the loop for the next one, where the
# openai client's httpx auth flow (an async generator) then warns; it does so with any session, or none.
@pytest.mark.filterwarnings(
    "ignore:asynchronous generator .* was scheduled after loop.shutdown_asyncgens:ResourceWarning"
)
def test_run_sync_keeps_the_history_across_calls(openai_server: FakeOpenAIServer, store_url: str, tenant: str) -> None:
    # run_sync runs on the thread's default event loop and leaves it open between calls; the session's store
    # binds to that loop on the first call and is closed on it at the end.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    client = AsyncOpenAI(base_url=openai_server.base_url, api_key="test-key", max_retries=0)
    agent = _agent(OpenAIResponsesModel(model="fake-model", openai_client=client))
    session = ChatkeepSession("s1", store=store_url, tenant=tenant)
    try:
        _script_turn_1(openai_server)
        assert Runner.run_sync(agent, QUESTION, session=session).final_output == ANSWER
        openai_server.reply_text("Rain tomorrow.")
        assert Runner.run_sync(agent, "And tomorrow?", session=session).final_output == "Rain tomorrow."
        _assert_turn_1_exactly_once(openai_server.requests[-1])
    finally:
        loop.run_until_complete(session.clear_session())
        loop.run_until_complete(session.close())
        loop.run_until_complete(client.close())
        asyncio.set_event_loop(None)
        loop.close()


@pytest.mark.filterwarnings(
    "ignore:asynchronous generator .* was scheduled after loop.shutdown_asyncgens:ResourceWarning"
)
async def test_run_sync_in_a_worker_thread_shares_the_session_with_the_apps_loop(
    openai_server: FakeOpenAIServer, store_url: str, tenant: str
) -> None:
    # The app's loop keeps using the session while Runner.run_sync, in a worker thread, runs on a loop of its own.
    session = ChatkeepSession("s1", store=store_url, tenant=tenant)
    await session.add_items([{"role": "user", "content": "from the app's loop"}])

    def in_a_worker() -> str:
        loop = asyncio.new_event_loop()  # run_sync runs on the thread's event loop and leaves it open
        asyncio.set_event_loop(loop)
        client = AsyncOpenAI(base_url=openai_server.base_url, api_key="test-key", max_retries=0)
        agent = _agent(OpenAIResponsesModel(model="fake-model", openai_client=client))
        try:
            return str(Runner.run_sync(agent, QUESTION, session=session).final_output)
        finally:
            loop.run_until_complete(client.close())
            asyncio.set_event_loop(None)
            loop.close()

    _script_turn_1(openai_server)
    try:
        assert await asyncio.to_thread(in_a_worker) == ANSWER
        items = await session.get_items()
        assert _kinds(items)[0] == "message"
        assert cast(dict[str, Any], items[0])["content"] == "from the app's loop"
        assert len(items) > 2
    finally:
        await session.clear_session()
        await session.close()
