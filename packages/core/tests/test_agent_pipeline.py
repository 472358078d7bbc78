"""The agent pipeline with local history: load before, store after, nothing on failure, the modes table."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from chatkeep.core import (
    Agent,
    AgentConfigurationError,
    AgentSession,
    ChatOptions,
    ContextProvider,
    HistoryModeConflictError,
    HistoryProvider,
    InMemoryHistoryProvider,
    Message,
    MessageCountingReducer,
    ModelError,
    SessionContext,
    ToolError,
)
from chatkeep.testing.scripted import ScriptedChatClient


class DictHistoryProvider(HistoryProvider):
    """A simple provider: overrides only get_messages / save_messages."""

    def __init__(self, source_id: str = "dict", **options: Any) -> None:
        super().__init__(source_id, **options)
        self.data: dict[str, list[Message]] = {}
        self.saves: list[list[Message]] = []

    async def get_messages(
        self, session_id: str, *, state: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Message]:
        return [m.model_copy() for m in self.data.get(session_id, [])]

    async def save_messages(
        self, session_id: str, messages: Sequence[Message], *, state: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        self.saves.append(list(messages))
        self.data.setdefault(session_id, []).extend(m.model_copy() for m in messages)


class RagProvider(ContextProvider):
    async def before_run(
        self, *, agent: Agent, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        context.extend_messages(self, [Message(role="user", text="[fact] the sky is blue")])
        context.extend_instructions(self, "Use the facts given.")


async def test_default_history_lives_in_the_session_and_is_sent_exactly_once() -> None:
    client = ScriptedChatClient()
    agent = Agent(client, name="A", instructions="Be brief.")
    session = agent.create_session()
    await agent.run("one", session=session)
    await agent.run("two", session=session)
    assert client.requests[1].texts == ["user: one", "assistant: echo: one", "user: two"]
    # Instructions go as options, never as a stored or sent history message.
    assert client.requests[1].options.instructions == "Be brief."
    assert agent.context_providers == []  # the default provider was used for the run only
    stored = InMemoryHistoryProvider().messages(session)
    assert [m.text for m in stored] == ["one", "echo: one", "two", "echo: two"]
    assert all(m.source is None for m in stored)


async def test_session_resumes_after_serialization_in_a_new_agent() -> None:
    first = Agent(ScriptedChatClient())
    session = first.create_session(tenant="acme")
    await first.run("I like Italian food.", session=session)
    payload = json.loads(json.dumps(session.to_dict()))

    client = ScriptedChatClient()
    second = Agent(client)
    resumed = AgentSession.from_dict(payload, tenant="acme")
    await second.run("What do I like?", session=resumed)
    assert client.requests[0].texts == [
        "user: I like Italian food.",
        "assistant: echo: I like Italian food.",
        "user: What do I like?",
    ]


async def test_failed_run_stores_nothing_and_the_next_run_works() -> None:
    client = ScriptedChatClient()
    provider = DictHistoryProvider()
    agent = Agent(client, context_providers=[provider])
    session = agent.create_session()
    await agent.run("kept", session=session)
    client.fail_with(ModelError("boom"))
    with pytest.raises(ModelError):
        await agent.run("lost", session=session)
    assert [m.text for m in provider.data[session.session_id]] == ["kept", "echo: kept"]
    await agent.run("again", session=session)
    assert client.requests[-1].texts == ["user: kept", "assistant: echo: kept", "user: again"]


async def test_loaded_history_is_stamped_in_memory_only_and_never_stored_again() -> None:
    client = ScriptedChatClient()
    provider = DictHistoryProvider()
    agent = Agent(client, context_providers=[provider])
    session = agent.create_session()
    await agent.run("a", session=session)
    await agent.run("b", session=session)
    sent = client.requests[1].messages
    assert [m.source for m in sent] == ["dict", "dict", None]
    # Each save holds only that run's new messages.
    assert [[m.text for m in batch] for batch in provider.saves] == [["a", "echo: a"], ["b", "echo: b"]]
    for batch in provider.saves:
        for message in batch:
            record = json.loads(message.to_record())
            assert set(record) == {
                "v",
                "message_id",
                "role",
                "contents",
                "author_name",
                "created_at",
                "additional_properties",
            }


async def test_two_loading_providers_are_refused_at_construction() -> None:
    with pytest.raises(AgentConfigurationError, match="only one history provider"):
        Agent(ScriptedChatClient(), context_providers=[DictHistoryProvider("a"), DictHistoryProvider("b")])
    with pytest.raises(AgentConfigurationError, match="source_id"):
        Agent(
            ScriptedChatClient(),
            context_providers=[DictHistoryProvider("a"), DictHistoryProvider("a", load_messages=False)],
        )


async def test_audit_provider_records_inputs_context_and_outputs_but_not_loaded_history() -> None:
    client = ScriptedChatClient()
    history = DictHistoryProvider("history")
    audit = DictHistoryProvider("audit", load_messages=False, store_context_messages=True)
    agent = Agent(client, context_providers=[RagProvider("rag"), history, audit])
    session = agent.create_session()
    await agent.run("q1", session=session)
    await agent.run("q2", session=session)
    assert [[m.text for m in batch] for batch in audit.saves] == [
        ["[fact] the sky is blue", "q1", "echo: q1"],
        ["[fact] the sky is blue", "q2", "echo: q2"],
    ]
    # The loading provider stores no context messages by default.
    assert [m.text for m in history.data[session.session_id]] == ["q1", "echo: q1", "q2", "echo: q2"]
    assert client.requests[1].options.instructions == "Use the facts given."
    assert client.requests[1].texts == ["user: [fact] the sky is blue", "user: q1", "assistant: echo: q1", "user: q2"]


async def test_store_context_from_limits_the_sources() -> None:
    audit = DictHistoryProvider("audit", load_messages=False, store_context_messages=True, store_context_from=["other"])
    agent = Agent(ScriptedChatClient(), context_providers=[RagProvider("rag"), audit])
    await agent.run("q", session=agent.create_session())
    assert [m.text for m in audit.saves[0]] == ["q", "echo: q"]


async def test_store_inputs_and_outputs_flags_and_filters() -> None:
    only_out = DictHistoryProvider("out", load_messages=False, store_inputs=False)
    filtered = DictHistoryProvider(
        "filtered", store_filter=lambda ms: [m for m in ms if m.role == "user"], provide_filter=lambda ms: ms[-1:]
    )
    client = ScriptedChatClient()
    agent = Agent(client, context_providers=[filtered, only_out])
    session = agent.create_session()
    await agent.run("x", session=session)
    await agent.run("y", session=session)
    assert [m.text for m in only_out.data[session.session_id]] == ["echo: x", "echo: y"]
    assert [m.text for m in filtered.data[session.session_id]] == ["x", "y"]
    assert client.requests[1].texts == ["user: x", "user: y"]  # provide_filter kept the last stored message


async def test_reducer_shapes_what_is_sent_but_keeps_everything_stored() -> None:
    client = ScriptedChatClient()
    provider = DictHistoryProvider(reducer=MessageCountingReducer(2))
    agent = Agent(client, context_providers=[provider])
    session = agent.create_session()
    for text in ("1", "2", "3"):
        await agent.run(text, session=session)
    assert client.requests[2].texts == ["user: 2", "assistant: echo: 2", "user: 3"]
    assert len(provider.data[session.session_id]) == 6


def get_weather(city: str, unit: str = "C") -> dict[str, Any]:
    """Return the weather in a city."""
    return {"city": city, "temperature": 21, "unit": unit}


async def test_tool_loop_calls_python_functions_and_stores_the_whole_exchange() -> None:
    client = ScriptedChatClient()
    client.reply_tool_calls(("call_1", "get_weather", '{"city": "Oslo"}'))
    client.reply_text("It is 21 degrees in Oslo.")
    provider = DictHistoryProvider()
    agent = Agent(client, name="W", tools=[get_weather], context_providers=[provider])
    session = agent.create_session()
    response = await agent.run("Weather in Oslo?", session=session)
    assert response.text == "It is 21 degrees in Oslo."
    assert [m.role for m in response.messages] == ["assistant", "tool", "assistant"]
    result = response.messages[1].function_results[0]
    assert result.call_id == "call_1"
    assert result.result == {"city": "Oslo", "temperature": 21, "unit": "C"}
    # The second call was sent the tool call and its result after the input.
    assert [m.role for m in client.requests[1].messages] == ["user", "assistant", "tool"]
    assert client.requests[0].options.tools[0].name == "get_weather"
    assert client.requests[0].options.tools[0].parameters["required"] == ["city"]
    stored = provider.data[session.session_id]
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[1].author_name == "W"


async def test_bad_tool_arguments_are_reported_to_the_model() -> None:
    client = ScriptedChatClient()
    client.reply_tool_calls(("c1", "get_weather", '{"town": "Oslo"}'), ("c2", "nope", "{}"))
    client.reply_text("sorry")
    agent = Agent(client, tools=[get_weather])
    response = await agent.run("go")
    results = response.messages[1].function_results
    assert all(r.is_error for r in results)
    assert "city" in str(results[0].result)
    assert "no tool named 'nope'" in str(results[1].result)


async def test_endless_tool_loop_is_bounded_and_stores_nothing() -> None:
    client = ScriptedChatClient()
    for i in range(5):
        client.reply_tool_calls((f"c{i}", "get_weather", '{"city": "Oslo"}'))
    provider = DictHistoryProvider()
    agent = Agent(client, tools=[get_weather], context_providers=[provider], max_tool_iterations=3)
    with pytest.raises(ToolError, match="max_tool_iterations"):
        await agent.run("loop", session=agent.create_session())
    assert len(client.requests) == 4
    assert provider.saves == []


async def test_tool_exception_fails_the_run_and_stores_nothing() -> None:
    def explode() -> str:
        raise RuntimeError("tool broke")

    client = ScriptedChatClient()
    client.reply_tool_calls(("c1", "explode", "{}"))
    provider = DictHistoryProvider()
    agent = Agent(client, tools=[explode], context_providers=[provider])
    with pytest.raises(RuntimeError, match="tool broke"):
        await agent.run("go", session=agent.create_session())
    assert provider.saves == []


async def test_streaming_yields_text_and_stores_after_the_stream() -> None:
    client = ScriptedChatClient()
    client.reply_text("Hello there, friend.")
    provider = DictHistoryProvider()
    agent = Agent(client, context_providers=[provider])
    session = agent.create_session()
    updates = [u async for u in agent.run_stream("hi", session=session)]
    assert "".join(u.text for u in updates) == "Hello there, friend."
    assert updates[-1].response is not None
    assert updates[-1].response.text == "Hello there, friend."
    assert client.requests[0].streamed
    assert [m.text for m in provider.data[session.session_id]] == ["hi", "Hello there, friend."]


async def test_input_forms() -> None:
    client = ScriptedChatClient()
    agent = Agent(client)
    await agent.run(["a", Message(role="user", text="b")])
    await agent.run(Message(role="user", text="c"))
    assert client.requests[0].texts == ["user: a", "user: b"]
    assert client.requests[1].texts == ["user: c"]
    with pytest.raises(TypeError):
        await agent.run([42])  # type: ignore[list-item]


# -- the two storage modes -------------------------------------------------------------------------


async def test_service_managed_session_skips_loading_providers_but_recorders_still_record() -> None:
    client = ScriptedChatClient(keeps_history=True)
    history = DictHistoryProvider("history")
    audit = DictHistoryProvider("audit", load_messages=False)
    agent = Agent(client, context_providers=[history, audit])
    session = agent.create_session()
    await agent.run("one", session=session)
    assert session.service_session_id == "conv_1"
    await agent.run("two", session=session)
    assert client.requests[1].texts == ["user: two"]  # the service holds the history: sent once, not twice
    assert client.requests[1].options.conversation_id == "conv_1"
    assert history.saves == []
    assert [m.text for batch in audit.saves for m in batch] == ["one", "echo: one", "two", "echo: two"]
    assert "in_memory" not in session.state  # no default provider in service mode


async def test_get_session_rehydrates_a_service_conversation() -> None:
    client = ScriptedChatClient()
    agent = Agent(client)
    session = agent.get_session(service_session_id="conv_abc")
    await agent.run("continue", session=session)
    assert client.requests[0].options.conversation_id == "conv_abc"
    assert client.requests[0].texts == ["user: continue"]
    assert "in_memory" not in session.state


async def test_explicit_conversation_id_with_a_loading_provider_conflicts() -> None:
    agent = Agent(ScriptedChatClient(), context_providers=[DictHistoryProvider()])
    with pytest.raises(HistoryModeConflictError, match="conversation_id"):
        await agent.run("x", options=ChatOptions(conversation_id="conv_1"))


async def test_per_call_persistence_conflicts_with_service_managed_history() -> None:
    agent = Agent(ScriptedChatClient(keeps_history=True), require_per_service_call_history_persistence=True)
    with pytest.raises(HistoryModeConflictError, match="require_per_service_call_history_persistence"):
        await agent.run("x")


async def test_per_call_persistence_keeps_completed_calls_when_a_later_tool_fails() -> None:
    calls = {"n": 0}

    def step() -> str:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("third tool call failed")
        return f"done {calls['n']}"

    def script() -> ScriptedChatClient:
        client = ScriptedChatClient()
        for i in range(3):
            client.reply_tool_calls((f"c{i}", "step", "{}"))
        client.reply_text("finished")
        return client

    with_flag = DictHistoryProvider()
    agent = Agent(
        script(), tools=[step], context_providers=[with_flag], require_per_service_call_history_persistence=True
    )
    session = agent.create_session()
    with pytest.raises(RuntimeError):
        await agent.run("go", session=session)
    stored = with_flag.data[session.session_id]
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant", "tool"]
    assert [len(batch) for batch in with_flag.saves] == [3, 2]  # each call appended with its results
    assert stored[-1].role == "tool"  # never a dangling call

    calls["n"] = 0
    without_flag = DictHistoryProvider()
    agent = Agent(script(), tools=[step], context_providers=[without_flag])
    with pytest.raises(RuntimeError):
        await agent.run("go", session=agent.create_session())
    assert without_flag.saves == []


async def test_per_call_persistence_stores_a_successful_three_call_loop_once() -> None:
    client = ScriptedChatClient()
    client.reply_tool_calls(("c1", "get_weather", '{"city": "A"}'))
    client.reply_tool_calls(("c2", "get_weather", '{"city": "B"}'))
    client.reply_text("done")
    provider = DictHistoryProvider()
    agent = Agent(
        client, tools=[get_weather], context_providers=[provider], require_per_service_call_history_persistence=True
    )
    session = agent.create_session()
    await agent.run("go", session=session)
    assert [m.role for m in provider.data[session.session_id]] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    await agent.run("next", session=session)
    assert [m.role for m in client.requests[-1].messages][:6] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]


async def test_provider_state_slices_are_created_only_when_used() -> None:
    from pydantic import BaseModel

    from chatkeep.core import ProviderSessionState

    class Counter(BaseModel):
        runs: int

    class CountingProvider(ContextProvider):
        def __init__(self) -> None:
            super().__init__("counter")
            self.helper = ProviderSessionState(Counter, state_key="counter", initializer=lambda _s: Counter(runs=0))

        async def after_run(
            self, *, agent: Agent, session: AgentSession, context: SessionContext, state: dict[str, Any]
        ) -> None:
            counter = self.helper.get_or_initialize(session)
            counter.runs += 1
            self.helper.save(session, counter)

    agent = Agent(ScriptedChatClient(), context_providers=[CountingProvider(), RagProvider("rag")])
    session = agent.create_session()
    await agent.run("a", session=session)
    await agent.run("b", session=session)
    assert session.to_dict()["state"]["counter"] == {"runs": 2}
    assert "rag" not in session.state  # a provider that keeps no state leaves no trace in the session
