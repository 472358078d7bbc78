"""OpenAIResponsesClient driving the real openai package against FakeOpenAIServer's Responses protocol."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from chatkeep.core import (
    AgentConfigurationError,
    ChatClient,
    ChatOptions,
    ChatResponseUpdate,
    FunctionCallContent,
    FunctionResultContent,
    FunctionTool,
    Message,
    ModelError,
    SessionKey,
    TextContent,
    Usage,
    UsageContent,
    open_store,
)
from chatkeep.core.openai import OpenAIResponsesClient
from chatkeep.testing.openai_server import FakeHTTPResponse, FakeOpenAIServer, FakeRequest

_ENV = ("OPENAI_MODEL", "OPENAI_RESPONSES_MODEL_ID", "OPENAI_BASE_URL", "OPENAI_API_KEY")
INTERNAL = ("message_id", "created_at", "additional_properties", "_source", "author_name", '"v"', "usage")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's own OpenAI settings must not leak into these tests.
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def client(fake_openai: FakeOpenAIServer) -> AsyncIterator[OpenAIResponsesClient]:
    async with OpenAIResponsesClient("fake-model", base_url=fake_openai.base_url) as responses_client:
        yield responses_client


def get_weather(city: str, unit: str = "celsius") -> str:
    """Get the weather in a city."""
    return f"sunny in {city}"


def step(n: int) -> dict[str, Any]:
    """Do step n of the plan."""
    return {"step": n, "done": True}


async def _collect(stream: AsyncIterator[ChatResponseUpdate]) -> list[ChatResponseUpdate]:
    return [update async for update in stream]


def responses_bodies(server: FakeOpenAIServer) -> list[dict[str, Any]]:
    """The bodies of the POST /v1/responses requests, in order."""
    return [r.body for r in server.log if r.method == "POST" and r.path == "/v1/responses"]


def assert_never_seen_twice(server: FakeOpenAIServer) -> None:
    for seen in server.seen_inputs:
        keys = [json.dumps(item, sort_keys=True) for item in seen]
        assert len(keys) == len(set(keys)), f"the model saw an item twice: {keys}"


# -- one call -----------------------------------------------------------------------------------------------


async def test_plain_reply_carries_the_response_id_that_continues_the_conversation(
    client: OpenAIResponsesClient, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.reply_text("hello there", usage=(12, 3))

    response = await client.get_response(
        [Message(role="user", text="hi")], options=ChatOptions(instructions="Be brief.")
    )

    assert response.text == "hello there"
    [message] = response.messages
    assert message.role == "assistant"
    assert response.usage == Usage(input_tokens=12, output_tokens=3, total_tokens=15)
    used = [c for c in message.contents if isinstance(c, UsageContent)]
    assert used == [UsageContent(usage=response.usage, model="fake-model")]  # the model the server named
    assert response.finish_reason == "stop"
    assert response.response_id is not None
    assert response.response_id.startswith("resp_")
    assert response.conversation_id == response.response_id
    assert client.keeps_history is True
    assert isinstance(client, ChatClient)
    [body] = responses_bodies(fake_openai)
    assert body == {
        "model": "fake-model",
        "input": [{"type": "message", "role": "user", "content": "hi"}],
        "instructions": "Be brief.",
        "store": True,
    }
    assert fake_openai.stored_response(response.response_id) is not None


async def test_unscripted_server_echoes_the_last_user_text(client: OpenAIResponsesClient) -> None:
    response = await client.get_response([Message(role="user", text="æ😀")], options=ChatOptions())

    assert response.text == "You said: æ😀"


async def test_streamed_text_deltas_concatenate_and_the_last_update_holds_the_response(
    client: OpenAIResponsesClient, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.reply_text("The quick brown fox jumps", usage=(7, 5))

    updates = await _collect(client.get_streaming_response([Message(role="user", text="go")], options=ChatOptions()))

    *deltas, last = updates
    assert len(deltas) == 5  # one per word, as the server streamed them
    assert "".join(u.text for u in deltas) == "The quick brown fox jumps"
    assert all(u.response is None for u in deltas)
    assert last.text == ""
    assert last.response is not None
    assert last.response.text == "The quick brown fox jumps"
    assert last.response.usage == Usage(input_tokens=7, output_tokens=5, total_tokens=12)
    assert last.response.response_id is not None
    assert last.response.conversation_id == last.response.response_id
    assert responses_bodies(fake_openai)[0]["stream"] is True


async def test_tool_calls_come_back_as_function_call_contents_and_tools_use_the_responses_format(
    client: OpenAIResponsesClient, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.reply_tool_calls(
        [("call_1", "get_weather", '{"city":"Oslo"}'), ("call_2", "get_weather", '{"city":"Bergen"}')],
        text="Checking.",
    )
    tool = FunctionTool(get_weather)

    response = await client.get_response([Message(role="user", text="weather?")], options=ChatOptions(tools=[tool]))

    assert response.messages[0].text == "Checking."
    assert response.messages[0].function_calls == [
        FunctionCallContent(call_id="call_1", name="get_weather", arguments='{"city":"Oslo"}'),
        FunctionCallContent(call_id="call_2", name="get_weather", arguments='{"city":"Bergen"}'),
    ]
    assert response.finish_reason == "tool_calls"
    assert responses_bodies(fake_openai)[0]["tools"] == [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Get the weather in a city.",
            "parameters": tool.parameters,
            "strict": False,
        }
    ]


async def test_streamed_function_call_arguments_split_across_deltas_are_reassembled_exactly(
    client: OpenAIResponsesClient, fake_openai: FakeOpenAIServer
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
    assert response.messages[0].function_calls == [
        FunctionCallContent(call_id="call_a", name="get_weather", arguments=first),
        FunctionCallContent(call_id="call_b", name="get_weather", arguments=second),
    ]
    assert response.finish_reason == "tool_calls"


async def test_streamed_calls_are_assembled_from_deltas_when_the_completed_response_lists_no_output(
    client: OpenAIResponsesClient, fake_openai: FakeOpenAIServer
) -> None:
    # Some compatible servers end with a response.completed whose output is empty: the deltas are the truth.
    arguments = '{"city": "Oslo", "unit": "celsius"}'

    def handler(request: FakeRequest) -> FakeHTTPResponse:
        response = {"id": "resp_partial", "object": "response", "created_at": 0, "model": "fake-model", "output": []}
        call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather", "arguments": ""}
        events: list[dict[str, Any]] = [
            {"type": "response.created", "sequence_number": 0, "response": response},
            {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0, "item": call},
        ]
        for i in range(0, len(arguments), 4):
            events.append(
                {
                    "type": "response.function_call_arguments.delta",
                    "sequence_number": 2 + i,
                    "item_id": "fc_1",
                    "output_index": 0,
                    "delta": arguments[i : i + 4],
                }
            )
        events.append({"type": "response.completed", "sequence_number": 99, "response": response})
        return FakeHTTPResponse(events=events, named_events=True)

    fake_openai.add_route("POST", "/v1/responses", handler)

    updates = await _collect(client.get_streaming_response([Message(role="user", text="hi")], options=ChatOptions()))

    response = updates[-1].response
    assert response is not None
    assert response.messages[0].function_calls == [
        FunctionCallContent(call_id="call_1", name="get_weather", arguments=arguments)
    ]
    assert response.finish_reason == "tool_calls"


# -- what the model is sent ---------------------------------------------------------------------------------


async def test_messages_map_to_input_items_without_internal_fields(
    fake_openai: FakeOpenAIServer,
) -> None:
    history = [
        Message(role="system", text="Extra rules."),
        Message(role="user", text="My name is Ada.", author_name="ada", additional_properties={"secret": "s3cr3t"}),
        Message(
            role="assistant",
            contents=[
                TextContent(text="Let me check."),
                FunctionCallContent(call_id="call_9", name="get_weather", arguments='{"city":"Oslo"}'),
                UsageContent(usage=Usage(input_tokens=1, output_tokens=2, total_tokens=3)),
            ],
            author_name="Helper",
        ),
        Message(
            role="tool",
            contents=[
                FunctionResultContent(call_id="call_9", result={"temp": 21, "sky": "clear ☀"}),
            ],
        ),
        Message(role="assistant", contents=[FunctionCallContent(call_id="call_10", name="nope", arguments="{}")]),
        Message(role="tool", contents=[FunctionResultContent(call_id="call_10", result="no tool", is_error=True)]),
        Message(role="user", text="And tomorrow?"),
    ]
    for message in history[:4]:
        message.with_source("history-provider-x")  # the pipeline's in-memory stamp

    async with OpenAIResponsesClient("fake-model", base_url=fake_openai.base_url, store=False) as stateless:
        await stateless.get_response(history, options=ChatOptions())

    body = responses_bodies(fake_openai)[0]
    assert body["store"] is False
    assert body["input"] == [
        {"type": "message", "role": "system", "content": "Extra rules."},
        {"type": "message", "role": "user", "content": "My name is Ada."},
        {"type": "message", "role": "assistant", "content": "Let me check."},
        {"type": "function_call", "call_id": "call_9", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
        {"type": "function_call_output", "call_id": "call_9", "output": '{"temp": 21, "sky": "clear ☀"}'},
        {"type": "function_call", "call_id": "call_10", "name": "nope", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_10", "output": "Error: no tool"},
        {"type": "message", "role": "user", "content": "And tomorrow?"},
    ]
    raw = json.dumps(body)
    for word in (*INTERNAL, "s3cr3t", "history-provider-x", "Helper"):
        assert word not in raw


async def test_default_options_apply_and_call_options_override_them(fake_openai: FakeOpenAIServer) -> None:
    async with OpenAIResponsesClient(
        "fake-model", base_url=fake_openai.base_url, instructions="Default.", temperature=0.1, max_tokens=50, top_p=0.5
    ) as configured:
        await configured.get_response([Message(role="user", text="a")], options=ChatOptions())
        await configured.get_response(
            [Message(role="user", text="b")],
            options=ChatOptions(instructions="Call.", temperature=0.9, model="other", additional={"top_p": 0.7}),
        )

    first, second = responses_bodies(fake_openai)
    assert (first["instructions"], first["temperature"], first["max_output_tokens"], first["top_p"]) == (
        "Default.",
        0.1,
        50,
        0.5,
    )
    assert (second["instructions"], second["temperature"], second["model"], second["top_p"]) == (
        "Call.",
        0.9,
        "other",
        0.7,
    )


async def test_resp_and_conv_ids_choose_how_the_conversation_continues(
    client: OpenAIResponsesClient, fake_openai: FakeOpenAIServer
) -> None:
    first = await client.get_response([Message(role="user", text="one")], options=ChatOptions())
    conversation = await client.client.conversations.create()

    await client.get_response(
        [Message(role="user", text="two")], options=ChatOptions(conversation_id=first.response_id)
    )
    in_conversation = await client.get_response(
        [Message(role="user", text="three")], options=ChatOptions(conversation_id=conversation.id)
    )

    _, chained, continued = responses_bodies(fake_openai)
    assert chained["previous_response_id"] == first.response_id
    assert "conversation" not in chained
    assert continued["conversation"] == conversation.id
    assert "previous_response_id" not in continued
    assert in_conversation.conversation_id == conversation.id


# -- configuration and errors -------------------------------------------------------------------------------


async def test_environment_variables_configure_model_url_and_key(
    monkeypatch: pytest.MonkeyPatch, fake_openai: FakeOpenAIServer
) -> None:
    monkeypatch.setenv("OPENAI_RESPONSES_MODEL_ID", "env-model")
    monkeypatch.setenv("OPENAI_BASE_URL", fake_openai.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    async with OpenAIResponsesClient() as configured:
        await configured.get_response([Message(role="user", text="hi")], options=ChatOptions())
    assert responses_bodies(fake_openai)[0]["model"] == "env-model"
    assert fake_openai.log[0].headers["authorization"] == "Bearer sk-env"


def test_a_missing_model_or_remote_key_names_what_to_set() -> None:
    with pytest.raises(AgentConfigurationError, match="OPENAI_MODEL"):
        OpenAIResponsesClient()
    with pytest.raises(AgentConfigurationError, match="OPENAI_API_KEY"):
        OpenAIResponsesClient("m", base_url="https://api.example.com/v1")


async def test_a_local_server_needs_no_api_key(fake_openai: FakeOpenAIServer) -> None:
    async with OpenAIResponsesClient("m", base_url=fake_openai.base_url) as local:
        await local.get_response([Message(role="user", text="hi")], options=ChatOptions())
    assert fake_openai.log[0].headers["authorization"] == "Bearer not-needed"


def test_options_the_client_sets_itself_are_refused() -> None:
    with pytest.raises(AgentConfigurationError, match="previous_response_id"):
        OpenAIResponsesClient("m", api_key="k", previous_response_id="resp_1")
    with pytest.raises(AgentConfigurationError, match="use_conversations"):
        OpenAIResponsesClient("m", api_key="k", store=False, use_conversations=True)


async def test_a_server_error_is_a_model_error_with_the_cause_chained(
    client: OpenAIResponsesClient, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.fail(500, times=None)

    with pytest.raises(ModelError, match="HTTP 500") as caught:
        await client.get_response([Message(role="user", text="hi")], options=ChatOptions())
    assert isinstance(caught.value.__cause__, openai.InternalServerError)

    with pytest.raises(ModelError, match="HTTP 500"):
        await _collect(client.get_streaming_response([Message(role="user", text="hi")], options=ChatOptions()))


async def test_an_unknown_previous_response_is_a_model_error_that_says_to_start_a_new_session(
    client: OpenAIResponsesClient,
) -> None:
    with pytest.raises(ModelError, match=r"does not know 'resp_gone'.*new session") as caught:
        await client.get_response([Message(role="user", text="hi")], options=ChatOptions(conversation_id="resp_gone"))
    assert isinstance(caught.value.__cause__, openai.BadRequestError)


async def test_a_failed_response_in_the_stream_is_a_model_error(
    client: OpenAIResponsesClient, fake_openai: FakeOpenAIServer
) -> None:
    def handler(request: FakeRequest) -> FakeHTTPResponse:
        response = {
            "id": "resp_failed",
            "object": "response",
            "created_at": 0,
            "model": "fake-model",
            "output": [],
            "status": "failed",
            "error": {"code": "server_error", "message": "the model crashed"},
        }
        return FakeHTTPResponse(
            events=[{"type": "response.failed", "sequence_number": 0, "response": response}], named_events=True
        )

    fake_openai.add_route("POST", "/v1/responses", handler)

    with pytest.raises(ModelError, match="the model crashed"):
        await _collect(client.get_streaming_response([Message(role="user", text="hi")], options=ChatOptions()))


async def test_a_stream_cut_before_completion_is_a_model_error(
    client: OpenAIResponsesClient, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.add_route(
        "POST",
        "/v1/responses",
        lambda request: FakeHTTPResponse(
            events=[
                {
                    "type": "response.output_text.delta",
                    "sequence_number": 0,
                    "item_id": "m",
                    "output_index": 0,
                    "content_index": 0,
                    "delta": "par",
                    "logprobs": [],
                }
            ],
            named_events=True,
        ),
    )

    with pytest.raises(ModelError, match=r"ended before response\.completed"):
        await _collect(client.get_streaming_response([Message(role="user", text="hi")], options=ChatOptions()))


async def test_an_unreachable_server_is_a_model_error_naming_the_url() -> None:
    async with OpenAIResponsesClient("m", base_url="http://127.0.0.1:9/v1") as unreachable:
        unreachable.client.max_retries = 0
        with pytest.raises(ModelError, match=re.escape("could not connect to http://127.0.0.1:9")):
            await unreachable.get_response([Message(role="user", text="hi")], options=ChatOptions())


async def test_close_closes_only_the_sdk_client_it_created(fake_openai: FakeOpenAIServer) -> None:
    own = OpenAIResponsesClient("m", base_url=fake_openai.base_url)
    await own.close()
    await own.close()
    assert own.client.is_closed()
    async with openai.AsyncOpenAI(base_url=fake_openai.base_url, api_key="k") as sdk:
        async with OpenAIResponsesClient("m", client=sdk):
            pass
        assert not sdk.is_closed()


async def test_store_false_refuses_a_service_conversation_before_any_request(fake_openai: FakeOpenAIServer) -> None:
    async with OpenAIResponsesClient("m", base_url=fake_openai.base_url, store=False) as stateless:
        assert stateless.keeps_history is False
        with pytest.raises(AgentConfigurationError, match="store=False"):
            await stateless.get_response(
                [Message(role="user", text="hi")], options=ChatOptions(conversation_id="resp_1")
            )
    assert fake_openai.log == []


# -- the fake server keeps the protocol's rules ------------------------------------------------------------


async def test_fake_refuses_what_the_service_refuses(fake_openai: FakeOpenAIServer) -> None:
    async with openai.AsyncOpenAI(base_url=fake_openai.base_url, api_key="k", max_retries=0) as sdk:
        unstored = await sdk.responses.create(model="m", input="hi", store=False)
        with pytest.raises(openai.BadRequestError, match="not found"):
            await sdk.responses.create(model="m", input="again", previous_response_id=unstored.id)
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.retrieve(unstored.id)
        fake_openai.reply_tool_calls([("call_1", "get_weather", "{}")])
        called = await sdk.responses.create(model="m", input="weather?")
        with pytest.raises(openai.BadRequestError, match="No tool output found for function call call_1"):
            await sdk.responses.create(model="m", input="ignore it", previous_response_id=called.id)
        with pytest.raises(openai.BadRequestError, match="No tool call found"):
            await sdk.responses.create(
                model="m", input=[{"type": "function_call_output", "call_id": "call_x", "output": "1"}]
            )
        conversation = await sdk.conversations.create()
        with pytest.raises(openai.BadRequestError, match="Mutually exclusive"):
            await sdk.responses.create(
                model="m", input="x", previous_response_id=called.id, conversation=conversation.id
            )
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.create(model="m", input="x", conversation="conv_unknown")
        with pytest.raises(openai.NotFoundError):
            await sdk.conversations.items.list("conv_unknown")
        with pytest.raises(openai.BadRequestError, match="Unknown parameter"):
            await sdk.responses.create(
                model="m",
                input=[{"role": "user", "content": "x", "name": "ada"}],  # type: ignore[typeddict-unknown-key]
            )


async def test_fake_reasoning_items_must_come_back_whole_before_the_items_that_need_them(
    fake_openai: FakeOpenAIServer,
) -> None:
    async with openai.AsyncOpenAI(base_url=fake_openai.base_url, api_key="k", max_retries=0) as sdk:
        fake_openai.reply_tool_calls([("call_1", "get_weather", "{}")], reasoning="Look the weather up.")
        called = await sdk.responses.create(model="m", input="weather?", store=False)
        reasoning, call = (item.model_dump(exclude_none=True) for item in called.output)
        assert reasoning["type"] == "reasoning"
        assert reasoning["summary"] == [{"type": "summary_text", "text": "Look the weather up."}]
        assert reasoning["encrypted_content"]
        assert called.usage is not None
        assert called.usage.output_tokens_details.reasoning_tokens == 4
        output = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}

        with pytest.raises(openai.BadRequestError, match=f"without its required 'reasoning' item: '{reasoning['id']}'"):
            await sdk.responses.create(model="m", input=[call, output], store=False)  # type: ignore[list-item]
        forged = {**reasoning, "encrypted_content": reasoning["encrypted_content"][:-4]}
        with pytest.raises(openai.BadRequestError, match="could not be verified"):
            await sdk.responses.create(model="m", input=[forged, call, output], store=False)  # type: ignore[list-item]
        fake_openai.reply_text("Sunny.")
        answered = await sdk.responses.create(model="m", input=[reasoning, call, output], store=False)  # type: ignore[list-item]
        assert answered.output_text == "Sunny."
        # Without their ids, items are new input: nothing ties them to a reasoning item.
        fake_openai.reply_text("Sunny again.")
        bare = [{k: v for k, v in item.items() if k not in ("id", "status")} for item in (call, output)]
        assert (await sdk.responses.create(model="m", input=bare, store=False)).output_text == "Sunny again."  # type: ignore[arg-type]

        fake_openai.reply_text("Streamed.", reasoning="Think first.")
        stream = await sdk.responses.create(model="m", input="hi", stream=True)
        kinds = [(event.type, getattr(getattr(event, "item", None), "type", None)) async for event in stream]
        assert kinds[2:4] == [("response.output_item.added", "reasoning"), ("response.output_item.done", "reasoning")]


async def test_fake_lists_conversation_items_in_either_order_with_paging(fake_openai: FakeOpenAIServer) -> None:
    async with openai.AsyncOpenAI(base_url=fake_openai.base_url, api_key="k", max_retries=0) as sdk:
        conversation = await sdk.conversations.create()
        for text in ("a", "b", "c"):
            fake_openai.reply_text(text.upper())
            await sdk.responses.create(model="m", input=text, conversation=conversation.id)
        newest = await sdk.conversations.items.list(conversation.id, limit=2)
        everything = [item async for item in sdk.conversations.items.list(conversation.id, order="asc", limit=4)]

    assert [(i.role, i.content[0].text) for i in newest.data if i.type == "message"] == [  # type: ignore[union-attr]
        ("assistant", "C"),
        ("user", "c"),
    ]
    assert newest.has_more is True
    texts = [i.content[0].text for i in everything if i.type == "message"]  # type: ignore[union-attr]
    assert texts == ["a", "A", "b", "B", "c", "C"]
    assert fake_openai.conversation_items(conversation.id)[0] == {"type": "message", "role": "user", "content": "a"}


# -- with the agent: service-managed history ----------------------------------------------------------------


def script_three_step_loop(server: FakeOpenAIServer, *, final: str = "All three steps done.") -> None:
    server.reply_tool_calls([("call_1", "step", '{"n": 1}')], arguments_chunk_size=2)
    server.reply_tool_calls([("call_2", "step", '{"n": 2}')], arguments_chunk_size=2)
    server.reply_tool_calls([("call_3", "step", '{"n": 3}')], arguments_chunk_size=2)
    server.reply_text(final)


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_stream"])
async def test_a_tool_loop_sends_only_each_new_tool_result_with_the_previous_response_id(
    client: OpenAIResponsesClient, fake_openai: FakeOpenAIServer, stream: bool
) -> None:
    script_three_step_loop(fake_openai)
    agent = client.as_agent(name="Planner", instructions="Follow the plan.", tools=[step])
    session = agent.create_session()

    if stream:
        updates = [u async for u in agent.run_stream("Run the plan.", session=session)]
        response = updates[-1].response
        assert response is not None
        assert "".join(u.text for u in updates) == "All three steps done."
    else:
        response = await agent.run("Run the plan.", session=session)

    assert response.text == "All three steps done."
    bodies = responses_bodies(fake_openai)
    assert len(bodies) == 4
    assert bodies[0]["input"] == [{"type": "message", "role": "user", "content": "Run the plan."}]
    assert "previous_response_id" not in bodies[0]
    for n, body in enumerate(bodies[1:], start=1):
        # Each follow-up call carries only the new function call output, chained to the response that asked.
        assert body["input"] == [
            {"type": "function_call_output", "call_id": f"call_{n}", "output": json.dumps({"step": n, "done": True})}
        ]
        previous = fake_openai.stored_response(body["previous_response_id"])
        assert previous is not None
        assert [item["call_id"] for item in previous["output"]] == [f"call_{n}"]
        assert body["instructions"] == "Follow the plan."
        assert body["tools"][0]["name"] == "step"
    # The model saw the whole conversation on the last call, each item once.
    assert [item["type"] for item in fake_openai.seen_inputs[-1]] == [
        "message",
        *["function_call", "function_call_output"] * 3,
    ]
    assert_never_seen_twice(fake_openai)
    assert session.service_session_id == response.response_id
    assert session.service_session_id is not None
    assert session.service_session_id.startswith("resp_")
    assert session.state == {}  # the service keeps the history: no default in-session provider
    assert [m.role for m in response.messages] == ["assistant", "tool"] * 3 + ["assistant"]


async def test_each_run_moves_service_session_id_to_the_newest_response_streaming_included(
    client: OpenAIResponsesClient, fake_openai: FakeOpenAIServer
) -> None:
    agent = client.as_agent()
    session = agent.create_session()

    await agent.run("one", session=session)
    after_first = session.service_session_id
    [_ async for _ in agent.run_stream("two", session=session)]
    after_second = session.service_session_id
    await agent.run("three", session=session)

    bodies = responses_bodies(fake_openai)
    assert after_first is not None
    assert after_second is not None
    assert after_first != after_second != session.service_session_id
    assert bodies[1]["previous_response_id"] == after_first
    assert bodies[2]["previous_response_id"] == after_second
    assert [b["input"] for b in bodies] == [
        [{"type": "message", "role": "user", "content": t}] for t in ("one", "two", "three")
    ]
    assert [i["content"] for i in fake_openai.seen_inputs[-1] if i["type"] == "message"] == [
        "one",
        "You said: one",
        "two",
        "You said: two",
        "three",
    ]


async def test_use_conversations_keeps_the_whole_run_in_one_conversation(fake_openai: FakeOpenAIServer) -> None:
    script_three_step_loop(fake_openai, final="Done in a conversation.")
    async with OpenAIResponsesClient("fake-model", base_url=fake_openai.base_url, use_conversations=True) as conv:
        agent = conv.as_agent(tools=[step])
        session = agent.create_session()
        updates = [u async for u in agent.run_stream("Run the plan.", session=session)]
        await agent.run("Thanks!", session=session)
        listed = [
            item async for item in conv.client.conversations.items.list(session.service_session_id or "", order="asc")
        ]

    assert "".join(u.text for u in updates) == "Done in a conversation."
    conversation_id = session.service_session_id
    assert conversation_id is not None
    assert conversation_id.startswith("conv_")
    creates = [r for r in fake_openai.log if r.path == "/v1/conversations"]
    assert len(creates) == 1  # created once, for the session's first call
    bodies = responses_bodies(fake_openai)
    assert [b["conversation"] for b in bodies] == [conversation_id] * 5
    assert all("previous_response_id" not in b for b in bodies)
    assert [b["input"][0]["type"] for b in bodies] == ["message", *["function_call_output"] * 3, "message"]
    assert [item.type for item in listed] == [
        "message",
        *["function_call", "function_call_output"] * 3,
        "message",
        "message",
        "message",
    ]
    assert_never_seen_twice(fake_openai)


@pytest.mark.parametrize("use_conversations", [False, True], ids=["previous_response", "conversation"])
async def test_get_session_rehydrates_a_conversation_the_service_holds(
    fake_openai: FakeOpenAIServer, use_conversations: bool
) -> None:
    fake_openai.reply_text("Noted: you like Italian food.")
    async with OpenAIResponsesClient(
        "fake-model", base_url=fake_openai.base_url, use_conversations=use_conversations
    ) as first_client:
        first_agent = first_client.as_agent()
        first_session = first_agent.create_session()
        await first_agent.run("I like Italian food.", session=first_session)
    service_id = first_session.service_session_id
    assert service_id is not None
    assert service_id.startswith("conv_" if use_conversations else "resp_")

    # A new process would only have the id: a fresh client (default settings) and a rehydrated session.
    fake_openai.reply_text("Italian food.")
    async with OpenAIResponsesClient("fake-model", base_url=fake_openai.base_url) as second_client:
        agent = second_client.as_agent()
        session = agent.get_session(service_session_id=service_id)
        response = await agent.run("What food do I like?", session=session)

    assert response.text == "Italian food."
    body = responses_bodies(fake_openai)[-1]
    assert body["input"] == [{"type": "message", "role": "user", "content": "What food do I like?"}]
    if use_conversations:
        assert body["conversation"] == service_id
        assert session.service_session_id == service_id
    else:
        assert body["previous_response_id"] == service_id
        assert session.service_session_id == response.response_id
    assert [i["content"] for i in fake_openai.seen_inputs[-1]] == [
        "I like Italian food.",
        "Noted: you like Italian food.",
        "What food do I like?",
    ]


async def test_store_false_keeps_history_locally_and_sends_it_in_full(fake_openai: FakeOpenAIServer) -> None:
    store_url = f"memory://responses-{uuid.uuid4().hex}"
    fake_openai.reply_tool_calls([("call_1", "get_weather", '{"city": "Oslo"}')])
    fake_openai.reply_text("Sunny in Oslo.")
    fake_openai.reply_text("It was Oslo.")
    async with (
        OpenAIResponsesClient("fake-model", base_url=fake_openai.base_url, store=False) as stateless,
        stateless.as_agent(tools=[get_weather], history=store_url) as agent,
    ):
        session = agent.create_session()
        first = await agent.run("Weather in Oslo?", session=session)
        await agent.run("Which city was it?", session=session)

    assert first.conversation_id is None
    assert session.service_session_id is None
    bodies = responses_bodies(fake_openai)
    assert all(b["store"] is False and "previous_response_id" not in b for b in bodies)
    assert [i["type"] for i in bodies[1]["input"]] == ["message", "function_call", "function_call_output"]
    assert [i["type"] for i in bodies[2]["input"]] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
        "message",
    ]
    assert first.response_id is not None
    assert fake_openai.stored_response(first.response_id) is None  # store=False: the service kept nothing
    async with open_store(store_url) as store:
        stored = await store.load(SessionKey("default", session.session_id))
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert stored[-1].text == "It was Oslo."
