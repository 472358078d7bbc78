"""OpenAIChatClient driving the real openai package against FakeOpenAIServer over loopback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator

import openai
import pytest

from chatkeep.core import (
    AgentConfigurationError,
    ChatClient,
    ChatOptions,
    ChatResponseUpdate,
    DataContent,
    FunctionCallContent,
    FunctionResultContent,
    FunctionTool,
    Message,
    ModelError,
    TextContent,
    UriContent,
    Usage,
    UsageContent,
)
from chatkeep.core.openai import OpenAIChatClient
from chatkeep.testing.openai_server import FakeOpenAIServer

_ENV = ("OPENAI_MODEL", "OPENAI_CHAT_MODEL_ID", "OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_CUSTOM_HEADERS")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's own OpenAI settings must not leak into these tests.
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def client(fake_openai: FakeOpenAIServer) -> AsyncIterator[OpenAIChatClient]:
    async with OpenAIChatClient("fake-model", base_url=fake_openai.base_url) as chat_client:
        yield chat_client


def get_weather(city: str, unit: str = "celsius") -> str:
    """Get the weather in a city."""
    return f"sunny in {city}"


async def _collect(stream: AsyncIterator[ChatResponseUpdate]) -> list[ChatResponseUpdate]:
    return [update async for update in stream]


# -- replies ----------------------------------------------------------------------------------------------


async def test_plain_reply_is_one_assistant_message_with_usage(
    client: OpenAIChatClient, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.reply_text("hello there", usage=(12, 3))

    response = await client.get_response([Message(role="user", text="hi")], options=ChatOptions())

    assert response.text == "hello there"
    [message] = response.messages
    assert message.role == "assistant"
    assert message.author_name is None
    assert message.text == "hello there"
    assert response.usage == Usage(input_tokens=12, output_tokens=3, total_tokens=15)
    # The usage also travels with the message, so a stored history keeps what each call cost.
    used = [c for c in message.contents if isinstance(c, UsageContent)]
    assert used == [UsageContent(usage=response.usage, model="fake-model")]  # the model the server named
    assert response.finish_reason == "stop"
    assert response.response_id is not None
    assert response.response_id.startswith("chatcmpl-")
    assert response.conversation_id is None
    assert client.keeps_history is False
    assert isinstance(client, ChatClient)


async def test_unscripted_server_echoes_the_last_user_text(client: OpenAIChatClient) -> None:
    history = [
        Message(role="user", text="first"),
        Message(role="assistant", text="ok"),
        Message(role="user", text="æ😀"),
    ]

    response = await client.get_response(history, options=ChatOptions())

    assert response.text == "You said: æ😀"


async def test_streamed_text_deltas_concatenate_and_the_last_update_holds_the_response(
    client: OpenAIChatClient, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.reply_text("The quick brown fox jumps", usage=(7, 5))

    updates = await _collect(client.get_streaming_response([Message(role="user", text="go")], options=ChatOptions()))

    *deltas, last = updates
    assert len(deltas) == 5  # one per word, as the server streamed them
    assert all(u.response is None for u in deltas)
    assert "".join(u.text for u in deltas) == "The quick brown fox jumps"
    assert last.text == ""
    assert last.response is not None
    assert last.response.text == "The quick brown fox jumps"
    assert last.response.usage == Usage(input_tokens=7, output_tokens=5, total_tokens=12)
    assert last.response.finish_reason == "stop"
    assert last.response.response_id is not None
    body = fake_openai.requests[0]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


# -- tool calls ---------------------------------------------------------------------------------------------


async def test_tool_calls_come_back_as_function_call_contents(
    client: OpenAIChatClient, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.reply_tool_calls(
        [("call_1", "get_weather", '{"city":"Oslo"}'), ("call_2", "get_weather", '{"city":"Bergen"}')]
    )
    tool = FunctionTool(get_weather)

    response = await client.get_response([Message(role="user", text="weather?")], options=ChatOptions(tools=[tool]))

    assert response.messages[0].function_calls == [
        FunctionCallContent(call_id="call_1", name="get_weather", arguments='{"city":"Oslo"}'),
        FunctionCallContent(call_id="call_2", name="get_weather", arguments='{"city":"Bergen"}'),
    ]
    assert response.finish_reason == "tool_calls"
    assert fake_openai.requests[0]["tools"] == [tool.to_openai()]


async def test_streamed_tool_call_arguments_split_across_chunks_are_reassembled_exactly(
    client: OpenAIChatClient, fake_openai: FakeOpenAIServer
) -> None:
    first = json.dumps({"city": "São Paulo", "nested": {"list": [1, 2.5, None], "quote": 'say "hi"'}})
    second = '{"city": "東京", "unit":"fahrenheit"}'
    fake_openai.reply_tool_calls(
        [("call_a", "get_weather", first), ("call_b", "get_weather", second)], text="Checking.", arguments_chunk_size=3
    )

    updates = await _collect(
        client.get_streaming_response(
            [Message(role="user", text="weather?")], options=ChatOptions(tools=[FunctionTool(get_weather)])
        )
    )

    response = updates[-1].response
    assert response is not None
    assert "".join(u.text for u in updates) == "Checking."
    assert response.messages[0].text == "Checking."
    assert response.messages[0].function_calls == [
        FunctionCallContent(call_id="call_a", name="get_weather", arguments=first),
        FunctionCallContent(call_id="call_b", name="get_weather", arguments=second),
    ]
    assert response.messages[0].function_calls[0].parse_arguments()["nested"]["quote"] == 'say "hi"'
    assert response.finish_reason == "tool_calls"


async def test_a_tool_loop_round_trip_is_accepted_by_the_server(
    client: OpenAIChatClient, fake_openai: FakeOpenAIServer
) -> None:
    # The assistant message a call returned goes back unchanged with its results, as an agent's loop does;
    # the fake refuses (HTTP 400) tool calls left without results, as the real service does.
    fake_openai.reply_tool_calls([("call_1", "get_weather", '{"city":"Oslo"}')])
    fake_openai.reply_text("It is sunny in Oslo.")
    user = Message(role="user", text="weather in Oslo?")
    options = ChatOptions(tools=[FunctionTool(get_weather)])

    first = await client.get_response([user], options=options)
    results = Message(role="tool", contents=[FunctionResultContent(call_id="call_1", result="sunny in Oslo")])
    second = await client.get_response([user, *first.messages, results], options=options)

    assert second.text == "It is sunny in Oslo."
    assert fake_openai.requests[1]["messages"] == [
        {"role": "user", "content": "weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny in Oslo"},
    ]


# -- what the model is sent ---------------------------------------------------------------------------------


async def test_request_body_is_instructions_then_history_once_without_internal_fields(
    client: OpenAIChatClient, fake_openai: FakeOpenAIServer
) -> None:
    history = [
        Message(
            role="user", text="My name is Ada.", author_name="ada", additional_properties={"secret": "s3cr3t-prop"}
        ),
        Message(role="assistant", text="Hello Ada!", author_name="Helper"),
        Message(
            role="assistant",
            contents=[
                TextContent(text="Let me check."),
                FunctionCallContent(call_id="call_9", name="get_weather", arguments='{"city":"Oslo"}'),
                UsageContent(usage=Usage(input_tokens=1, output_tokens=2, total_tokens=3)),
            ],
        ),
        Message(
            role="tool",
            contents=[
                FunctionResultContent(call_id="call_9", result={"temp": 21, "sky": "clear ☀"}),
            ],
        ),
        Message(role="user", text="And tomorrow?", author_name="Ada Lovelace"),  # a name OpenAI would refuse
    ]
    for message in history[:4]:
        message.with_source("history-provider-x")  # the pipeline's in-memory stamp

    await client.get_response(history, options=ChatOptions(instructions="You are terse."))

    body = fake_openai.requests[0]
    assert body["model"] == "fake-model"
    assert body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "My name is Ada.", "name": "ada"},
        {"role": "assistant", "content": "Hello Ada!", "name": "Helper"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "call_9",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_9", "content": '{"temp": 21, "sky": "clear ☀"}'},
        {"role": "user", "content": "And tomorrow?"},
    ]
    raw = json.dumps(body)
    for leaked in ("message_id", "additional_properties", "s3cr3t-prop", "created_at", "history-provider-x", "usage"):
        assert leaked not in raw
    for message in history:
        assert message.message_id not in raw
    assert "tools" not in body  # no tools given: none sent


async def test_each_function_result_becomes_its_own_tool_message(
    client: OpenAIChatClient, fake_openai: FakeOpenAIServer
) -> None:
    calls = Message(
        role="assistant",
        contents=[
            FunctionCallContent(call_id="c1", name="a", arguments="{}"),
            FunctionCallContent(call_id="c2", name="b", arguments="{}"),
            FunctionCallContent(call_id="c3", name="c", arguments="{}"),
        ],
    )
    results = Message(
        role="tool",
        contents=[
            FunctionResultContent(call_id="c1", result="plain text, not JSON-quoted"),
            FunctionResultContent(call_id="c2", result=[1, {"k": None}]),
            FunctionResultContent(call_id="c3", result="division by zero", is_error=True),
        ],
    )

    response = await client.get_response([Message(role="user", text="go"), calls, results], options=ChatOptions())

    assert response.text.startswith("You said:")  # the server accepted the calls as answered
    assert fake_openai.requests[0]["messages"][2:] == [
        {"role": "tool", "tool_call_id": "c1", "content": "plain text, not JSON-quoted"},
        {"role": "tool", "tool_call_id": "c2", "content": '[1, {"k": null}]'},
        {"role": "tool", "tool_call_id": "c3", "content": "Error: division by zero"},
    ]


async def test_results_kept_inside_another_message_still_follow_their_calls(
    client: OpenAIChatClient, fake_openai: FakeOpenAIServer
) -> None:
    # Some histories keep a call and its result in one assistant message, or a result inside the next user turn.
    combined = Message(
        role="assistant",
        contents=[
            FunctionCallContent(call_id="c1", name="a", arguments="{}"),
            FunctionResultContent(call_id="c1", result="r1"),
        ],
    )
    asks = Message(role="assistant", contents=[FunctionCallContent(call_id="c2", name="b", arguments="{}")])
    answer_and_question = Message(
        role="user", contents=[FunctionResultContent(call_id="c2", result="r2"), TextContent(text="next?")]
    )

    await client.get_response(
        [Message(role="user", text="go"), combined, asks, answer_and_question], options=ChatOptions()
    )

    assert [(m["role"], m.get("tool_call_id"), m.get("content")) for m in fake_openai.requests[0]["messages"]] == [
        ("user", None, "go"),
        ("assistant", None, None),
        ("tool", "c1", "r1"),
        ("assistant", None, None),
        ("tool", "c2", "r2"),
        ("user", None, "next?"),
    ]


async def test_images_are_sent_as_image_url_parts(client: OpenAIChatClient, fake_openai: FakeOpenAIServer) -> None:
    message = Message(
        role="user",
        contents=[
            TextContent(text="What is in these?"),
            DataContent(data="iVBORw0KGgo=", media_type="image/png"),
            UriContent(uri="https://example.com/cat.jpg", media_type="image/jpeg"),
        ],
    )

    await client.get_response([message], options=ChatOptions())

    assert fake_openai.requests[0]["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in these?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
            ],
        }
    ]


async def test_content_chat_completions_cannot_take_fails_before_any_request(
    client: OpenAIChatClient, fake_openai: FakeOpenAIServer
) -> None:
    message = Message(role="user", contents=[DataContent(data="AAAA", media_type="video/mp4")])

    with pytest.raises(ModelError, match="video/mp4"):
        await client.get_response([message], options=ChatOptions())
    assert fake_openai.requests == []


async def test_default_options_apply_and_call_options_override_them(fake_openai: FakeOpenAIServer) -> None:
    async with OpenAIChatClient(
        "fake-model", base_url=fake_openai.base_url, temperature=0.2, max_tokens=50, seed=7, instructions="Default."
    ) as client:
        await client.get_response([Message(role="user", text="a")], options=ChatOptions())
        await client.get_response(
            [Message(role="user", text="b")],
            options=ChatOptions(
                instructions="Per call.", model="other-model", temperature=0.9, max_tokens=5, additional={"seed": 8}
            ),
        )

    first, second = fake_openai.requests
    assert (first["temperature"], first["max_completion_tokens"], first["seed"]) == (0.2, 50, 7)
    assert first["messages"][0] == {"role": "system", "content": "Default."}
    assert (second["model"], second["temperature"], second["max_completion_tokens"], second["seed"]) == (
        "other-model",
        0.9,
        5,
        8,
    )
    assert second["messages"][0] == {"role": "system", "content": "Per call."}


async def test_a_service_conversation_id_is_refused(client: OpenAIChatClient, fake_openai: FakeOpenAIServer) -> None:
    with pytest.raises(AgentConfigurationError, match="OpenAIResponsesClient"):
        await client.get_response([Message(role="user", text="hi")], options=ChatOptions(conversation_id="conv_1"))
    assert fake_openai.requests == []


# -- configuration ------------------------------------------------------------------------------------------


async def test_environment_variables_configure_model_url_and_key(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeOpenAIServer(api_key="sk-test-123") as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-123")
        monkeypatch.setenv("OPENAI_MODEL", "env-model")
        server.reply_text("configured")

        async with OpenAIChatClient() as client:
            response = await client.get_response([Message(role="user", text="hi")], options=ChatOptions())

        assert response.text == "configured"
        assert server.requests[0]["model"] == "env-model"
        assert server.log[0].headers["authorization"] == "Bearer sk-test-123"


async def test_openai_chat_model_id_is_the_fallback_model_variable(
    monkeypatch: pytest.MonkeyPatch, fake_openai: FakeOpenAIServer
) -> None:
    monkeypatch.setenv("OPENAI_CHAT_MODEL_ID", "fallback-model")

    async with OpenAIChatClient(base_url=fake_openai.base_url) as client:
        await client.get_response([Message(role="user", text="hi")], options=ChatOptions())

    assert fake_openai.requests[0]["model"] == "fallback-model"


def test_a_missing_model_names_the_variable_to_set() -> None:
    with pytest.raises(AgentConfigurationError, match="OPENAI_MODEL"):
        OpenAIChatClient(base_url="http://127.0.0.1:1/v1")


def test_a_missing_api_key_for_a_remote_server_names_the_variable_to_set() -> None:
    with pytest.raises(AgentConfigurationError, match="OPENAI_API_KEY"):
        OpenAIChatClient("gpt-4o-mini", base_url="https://models.example.com/v1")
    with pytest.raises(AgentConfigurationError, match="OPENAI_API_KEY"):
        OpenAIChatClient("gpt-4o-mini")  # OpenAI's own endpoint


async def test_a_local_server_needs_no_api_key(fake_openai: FakeOpenAIServer) -> None:
    async with OpenAIChatClient("local-model", base_url=fake_openai.base_url) as client:
        response = await client.get_response([Message(role="user", text="hi")], options=ChatOptions())

    assert response.text == "You said: hi"
    assert fake_openai.log[0].headers["authorization"] == "Bearer not-needed"


def test_default_options_the_client_sets_itself_are_refused() -> None:
    with pytest.raises(AgentConfigurationError, match="tools"):
        OpenAIChatClient("m", base_url="http://127.0.0.1:1/v1", tools=[get_weather])


def test_importing_without_the_openai_extra_names_the_install_command() -> None:
    code = "import sys; sys.modules['openai'] = None; import chatkeep.core.openai"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)

    assert result.returncode != 0
    assert "MissingExtraError" in result.stderr
    assert 'pip install "chatkeep-core[openai]"' in result.stderr


# -- errors -------------------------------------------------------------------------------------------------


async def test_a_server_error_is_a_model_error_with_the_cause_chained(
    client: OpenAIChatClient, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.fail(500, times=None)

    with pytest.raises(ModelError, match="HTTP 500") as caught:
        await client.get_response([Message(role="user", text="hi")], options=ChatOptions())

    assert isinstance(caught.value.__cause__, openai.InternalServerError)
    assert fake_openai.base_url in str(caught.value)


async def test_a_transient_server_error_is_retried(client: OpenAIChatClient, fake_openai: FakeOpenAIServer) -> None:
    fake_openai.fail(503)
    fake_openai.reply_text("recovered")

    response = await client.get_response([Message(role="user", text="hi")], options=ChatOptions())

    assert response.text == "recovered"
    assert len(fake_openai.requests) == 2


async def test_a_rejected_api_key_says_to_check_the_key() -> None:
    with FakeOpenAIServer(api_key="sk-right") as server:
        async with OpenAIChatClient("m", base_url=server.base_url, api_key="sk-wrong") as client:
            with pytest.raises(ModelError, match="OPENAI_API_KEY") as caught:
                await client.get_response([Message(role="user", text="hi")], options=ChatOptions())

    assert isinstance(caught.value.__cause__, openai.AuthenticationError)


async def test_a_server_error_while_streaming_is_a_model_error(
    client: OpenAIChatClient, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.fail(400, message="model does not support tools")

    with pytest.raises(ModelError, match="model does not support tools") as caught:
        await _collect(client.get_streaming_response([Message(role="user", text="hi")], options=ChatOptions()))

    assert isinstance(caught.value.__cause__, openai.BadRequestError)


async def test_an_unreachable_server_is_a_model_error_naming_the_url() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base_url = f"http://127.0.0.1:{port}/v1"
    sdk = openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
    try:
        client = OpenAIChatClient("m", client=sdk)
        with pytest.raises(ModelError, match=f"could not connect to {base_url}") as caught:
            await client.get_response([Message(role="user", text="hi")], options=ChatOptions())
        assert isinstance(caught.value.__cause__, openai.APIConnectionError)
        await client.close()
        assert not sdk.is_closed()  # a client passed in belongs to the caller
    finally:
        await sdk.close()


async def test_close_closes_the_sdk_client_it_created(fake_openai: FakeOpenAIServer) -> None:
    client = OpenAIChatClient("m", base_url=fake_openai.base_url)
    async with client:
        await client.get_response([Message(role="user", text="hi")], options=ChatOptions())

    assert client.client.is_closed()
    await client.close()  # idempotent


# -- with the agent -----------------------------------------------------------------------------------------


async def test_as_agent_sends_the_session_history_once_per_turn(
    client: OpenAIChatClient, fake_openai: FakeOpenAIServer
) -> None:
    agent = client.as_agent(name="Helper", instructions="Be brief.")
    session = agent.create_session()

    await agent.run("I like pasta.", session=session)
    second = await agent.run("What do I like?", session=session)

    assert second.text == "You said: What do I like?"
    assert fake_openai.requests[1]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "I like pasta."},
        {"role": "assistant", "content": "You said: I like pasta.", "name": "Helper"},
        {"role": "user", "content": "What do I like?"},
    ]
