"""ChatkeepHistoryProvider against the checks the framework runs on its own history providers, on every target store.

The framework's tests for ``HistoryProvider``, ``InMemoryHistoryProvider`` and the Redis provider drive
``before_run``/``after_run`` with a real ``SessionContext`` and ``AgentResponse``; these do the same, and
where the framework's in-memory provider defines the expected behaviour (what is stored, what a replay
drops) they compare with it directly.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any, cast

import pytest
from agent_framework import (
    AgentResponse,
    AgentSession,
    Content,
    HistoryProvider,
    InMemoryHistoryProvider,
    Message,
    SessionContext,
    SupportsAgentRun,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatkeep.core import (
    InvalidArgumentError,
    InvalidSessionKeyError,
    MessageFormatError,
    SessionKey,
    open_store,
)
from chatkeep.core import Message as ChatkeepMessage
from chatkeep.interop._envelope import wrap
from chatkeep.interop.agent_framework import FORMAT, ChatkeepHistoryProvider

AGENT = cast(SupportsAgentRun, None)  # the base class's hooks never touch the agent


async def run_turn(
    provider: HistoryProvider,
    session: AgentSession,
    inputs: Sequence[Message],
    outputs: Sequence[Message] = (),
    *,
    context: dict[str, list[Message]] | None = None,
) -> list[Message]:
    """What the agent does around a model call: before_run (when it loads), then after_run; returns what was loaded."""
    ctx = SessionContext(session_id=session.session_id, input_messages=list(inputs))
    for source, messages in (context or {}).items():
        ctx.extend_messages(source, messages)
    state = session.state.setdefault(provider.source_id, {})
    if provider.load_messages:
        await provider.before_run(agent=AGENT, session=session, context=ctx, state=state)
    loaded = list(ctx.context_messages.get(provider.source_id, []))
    ctx._response = AgentResponse(messages=list(outputs))
    await provider.after_run(agent=AGENT, session=session, context=ctx, state=state)
    return loaded


async def history(provider: HistoryProvider, session: AgentSession) -> list[dict[str, Any]]:
    loaded = await provider.get_messages(session.session_id, state=session.state.setdefault(provider.source_id, {}))
    return [m.to_dict() for m in loaded]


def user(text: str) -> Message:
    return Message("user", [text])


def assistant(text: str, message_id: str | None = None) -> Message:
    return Message("assistant", [text], message_id=message_id)


# -- the HistoryProvider flags, as the framework's base-class tests check them --------------------------------


def test_default_flags_are_the_frameworks() -> None:
    provider = ChatkeepHistoryProvider(store="memory")
    reference = InMemoryHistoryProvider()
    flags = ("load_messages", "store_inputs", "store_outputs", "store_context_messages", "store_context_from")
    assert {f: getattr(provider, f) for f in flags} == {f: getattr(reference, f) for f in flags}
    assert provider.source_id == "chatkeep"
    assert provider.load_last is None


def test_custom_flags_are_kept() -> None:
    provider = ChatkeepHistoryProvider(
        "audit",
        store="memory",
        load_messages=False,
        store_inputs=False,
        store_outputs=False,
        store_context_messages=True,
        store_context_from={"rag"},
        load_last=20,
    )
    assert (provider.source_id, provider.load_messages, provider.store_inputs, provider.store_outputs) == (
        "audit",
        False,
        False,
        False,
    )
    assert (provider.store_context_messages, provider.store_context_from, provider.load_last) == (True, {"rag"}, 20)


@pytest.mark.parametrize("load_last", [0, -1, 2.5, True, "20"])
def test_a_bad_window_says_what_it_takes(load_last: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="load_last must be a positive number"):
        ChatkeepHistoryProvider(store="memory", load_last=load_last)


def test_a_bad_tenant_fails_at_construction() -> None:
    with pytest.raises(InvalidSessionKeyError):
        ChatkeepHistoryProvider(store="memory", tenant="")


# -- loading and storing through before_run / after_run ----------------------------------------------------


async def test_an_empty_session_loads_nothing(provider: ChatkeepHistoryProvider) -> None:
    assert await run_turn(provider, AgentSession(), [user("hi")]) == []


async def test_stores_and_loads_messages(provider: ChatkeepHistoryProvider) -> None:
    session = AgentSession()
    await run_turn(provider, session, [user("hello")], [assistant("hi there")])
    loaded = await run_turn(provider, session, [user("again")])
    assert [(m.role, m.text) for m in loaded] == [("user", "hello"), ("assistant", "hi there")]
    # the framework stamps what a provider loaded with its source, so it is not stored again
    assert all(m.additional_properties["_attribution"]["source_id"] == "memory" for m in loaded)
    assert [m["contents"][0]["text"] for m in await history(provider, session)] == ["hello", "hi there", "again"]


@pytest.mark.parametrize(
    "flags",
    [
        {},
        {"store_inputs": False},
        {"store_outputs": False},
        {"load_messages": False, "store_context_messages": True},
        {"load_messages": False, "store_context_messages": True, "store_context_from": {"rag"}},
    ],
    ids=["default", "no-inputs", "no-outputs", "context", "context-from-rag"],
)
async def test_stores_what_the_frameworks_provider_stores(store_url: str, tenant: str, flags: dict[str, Any]) -> None:
    context = {"rag": [Message("system", ["rag-context"])], "other": [Message("system", ["other-context"])]}
    reference, session_ref = InMemoryHistoryProvider("memory", **flags), AgentSession()
    async with ChatkeepHistoryProvider("memory", store=store_url, tenant=tenant, **flags) as provider:
        session = AgentSession()
        for turn in range(2):
            for p, s in ((reference, session_ref), (provider, session)):
                await run_turn(p, s, [user(f"hello {turn}")], [assistant(f"hi {turn}")], context=context)
        assert await history(provider, session) == await history(reference, session_ref)


@pytest.mark.parametrize(
    "batches",
    [
        # a caller that replays the whole transcript each run, then adds one turn
        [[user("a"), assistant("b", "m1")], [user("a"), assistant("b", "m1"), user("c"), assistant("d", "m2")]],
        # a tool loop persisted after each model call: each call hands over what the last one stored
        [[user("q"), assistant("call", "m1")], [assistant("call", "m1"), Message("tool", ["r"]), assistant("ok")]],
        # a user who says the same thing twice is heard twice
        [[user("yes")], [user("yes")]],
        # the newest stored message repeated at the head of a longer batch, in a long history
        [[user(f"u{i}"), assistant(f"a{i}", f"id{i}")] for i in range(6)] + [[assistant("a5", "id5"), user("next")]],
        # a batch that holds the newest stored message but does not continue from it keeps all of it
        [
            [user("u0"), assistant("x", "m1"), assistant("b", "m2")],
            [assistant("a", "m3"), assistant("b", "m2"), user("c")],
        ],
        # nothing new at all
        [[user("x"), assistant("y", "m9")], [user("x"), assistant("y", "m9")]],
    ],
    ids=[
        "transcript-replay",
        "per-call-tool-loop",
        "repeated-input",
        "overlap-in-long-history",
        "no-continuation",
        "nothing-new",
    ],
)
async def test_drops_replayed_messages_as_the_frameworks_provider_does(
    provider: ChatkeepHistoryProvider, batches: list[list[Message]]
) -> None:
    reference, session_ref, session = InMemoryHistoryProvider("memory"), AgentSession(), AgentSession()
    for batch in batches:
        for p, s in ((reference, session_ref), (provider, session)):
            await p.save_messages(s.session_id, batch, state=s.state.setdefault(p.source_id, {}))
    assert await history(provider, session) == await history(reference, session_ref)


# Messages from a tiny alphabet, so that batches repeat stored messages often: by id, or by role and text
# alone (an id-less message repeats by its contents), or by text under another role or another id.
_MESSAGES = st.builds(
    lambda role, text, message_id: Message(role, [text], message_id=message_id),
    st.sampled_from(["user", "assistant"]),
    st.sampled_from(["a", "b"]),
    st.sampled_from([None, None, "m1", "m2"]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(_MESSAGES, min_size=1, max_size=4), min_size=1, max_size=5))
async def test_any_sequence_of_batches_is_stored_as_the_frameworks_provider_stores_it(
    batches: list[list[Message]],
) -> None:
    # The replay filter is skipped when no message can repeat: whatever the batches, what is kept must be what
    # the framework's own provider keeps.
    reference, session_ref, session = InMemoryHistoryProvider("memory"), AgentSession(), AgentSession()
    async with ChatkeepHistoryProvider("memory", store="memory://") as provider:
        for batch in batches:
            for p, s in ((reference, session_ref), (provider, session)):
                await p.save_messages(s.session_id, batch, state=s.state.setdefault(p.source_id, {}))
        assert await history(provider, session) == await history(reference, session_ref)


@pytest.mark.parametrize("load_last", [None, 1, 3], ids=["whole", "window-too-short", "window"])
async def test_a_run_that_replays_its_transcript_stores_what_the_frameworks_provider_stores(
    store_url: str, tenant: str, load_last: int | None
) -> None:
    # A caller that sends the whole transcript as the run's input (what some front ends do): the run compares it
    # with what it loaded before the model call, or reads the store when that window is too short to tell.
    reference, session_ref = InMemoryHistoryProvider("memory"), AgentSession()
    async with ChatkeepHistoryProvider("memory", store=store_url, tenant=tenant, load_last=load_last) as provider:
        session = AgentSession()
        transcript: list[Message] = []
        for turn in range(3):
            transcript = [*transcript, user(f"q{turn}")]
            answer = assistant(f"a{turn}")
            for p, s in ((reference, session_ref), (provider, session)):
                await run_turn(p, s, transcript, [answer])
            transcript.append(answer)
        stored = await provider.store.load(provider.session_key(session.session_id))  # all of it, whatever load_last
        items = [m.additional_properties["chatkeep.interop"]["item"] for m in stored]
        assert items == await history(reference, session_ref)
        assert len(items) == 6


async def test_a_window_too_short_to_tell_reads_the_store(store_url: str, tenant: str) -> None:
    # The run loaded only [b]; b is in the new batch but the history does not end with [a, b], so all is new.
    turns = [
        ([user("u0")], [assistant("x", "m1"), assistant("b", "m2")]),
        ([assistant("a", "m3"), assistant("b", "m2"), user("c")], [assistant("d")]),
    ]
    reference, session_ref = InMemoryHistoryProvider("memory"), AgentSession()
    async with ChatkeepHistoryProvider("memory", store=store_url, tenant=tenant, load_last=1) as provider:
        session = AgentSession()
        for inputs, outputs in turns:
            for p, s in ((reference, session_ref), (provider, session)):
                await run_turn(p, s, inputs, outputs)
        stored = await provider.store.load(provider.session_key(session.session_id))
        assert [m.text for m in stored] == ["u0", "x", "b", "a", "b", "c", "d"]
        assert [m.additional_properties["chatkeep.interop"]["item"] for m in stored] == await history(
            reference, session_ref
        )


async def test_a_run_reads_the_store_once(provider: ChatkeepHistoryProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    session = AgentSession()
    await run_turn(provider, session, [user("hello")], [assistant("hi")])
    reads: list[int | None] = []
    load = provider.store.load

    async def counted(key: SessionKey, *, last: int | None = None) -> list[ChatkeepMessage]:
        reads.append(last)
        return await load(key, last=last)

    monkeypatch.setattr(provider.store, "load", counted)
    await run_turn(provider, session, [user("again")], [assistant("hi again")])
    assert reads == [None]  # the history before the model call; the append compares with it
    await provider.save_messages(session.session_id, [user("outside a run")])
    assert reads == [None, 1]  # outside a run the newest stored messages are read


async def test_a_write_during_the_model_call_is_kept(provider: ChatkeepHistoryProvider) -> None:
    session = AgentSession()
    await run_turn(provider, session, [user("hello")], [assistant("hi")])
    ctx = SessionContext(session_id=session.session_id, input_messages=[user("slow question")])
    state = session.state.setdefault(provider.source_id, {})
    await provider.before_run(agent=AGENT, session=session, context=ctx, state=state)
    await provider.save_messages(session.session_id, [user("from another worker")])  # while the model thinks
    ctx._response = AgentResponse(messages=[assistant("slow answer")])
    await provider.after_run(agent=AGENT, session=session, context=ctx, state=state)
    texts = [m["contents"][0]["text"] for m in await history(provider, session)]
    assert texts == ["hello", "hi", "from another worker", "slow question", "slow answer"]


# -- ordering, limits, clearing -----------------------------------------------------------------------------


async def test_history_keeps_the_order_it_was_stored_in(provider: ChatkeepHistoryProvider) -> None:
    session = AgentSession()
    for i in range(30):
        await run_turn(provider, session, [user(f"q{i}")], [assistant(f"a{i}")])
    texts = [m["contents"][0]["text"] for m in await history(provider, session)]
    assert texts == [t for i in range(30) for t in (f"q{i}", f"a{i}")]


@pytest.mark.parametrize("load_last", [1, 5, 60, 100])
async def test_load_last_loads_the_newest_messages_in_order(store_url: str, tenant: str, load_last: int) -> None:
    async with ChatkeepHistoryProvider(store=store_url, tenant=tenant, load_last=load_last) as provider:
        session = AgentSession()
        for i in range(30):
            await run_turn(provider, session, [user(f"q{i}")], [assistant(f"a{i}")])
        all_texts = [t for i in range(30) for t in (f"q{i}", f"a{i}")]
        assert [m["contents"][0]["text"] for m in await history(provider, session)] == all_texts[-load_last:]


async def test_a_window_never_starts_with_tool_results_whose_call_it_cut_off(store_url: str, tenant: str) -> None:
    call = Message("assistant", [Content.from_function_call(call_id="c1", name="lookup", arguments="{}")])
    results = [Message("tool", [Content.from_function_result(call_id="c1", result=f"r{i}")]) for i in range(2)]
    async with ChatkeepHistoryProvider(store=store_url, tenant=tenant, load_last=3) as provider:
        session = AgentSession()
        await run_turn(provider, session, [user("look it up")], [call, *results, assistant("found")])
        loaded = await provider.get_messages(session.session_id)
        assert [m.text for m in loaded] == ["found"]
        provider.load_last = 4
        assert [m.contents[0].type for m in await provider.get_messages(session.session_id)] == [
            "function_call",
            "function_result",
            "function_result",
            "text",
        ]


async def test_clear_deletes_one_sessions_history(provider: ChatkeepHistoryProvider) -> None:
    kept, cleared, by_id = AgentSession(), AgentSession(), AgentSession()
    for session in (kept, cleared, by_id):
        await run_turn(provider, session, [user("hello")], [assistant("hi")])
    await provider.clear(cleared)
    await provider.clear(by_id.session_id)
    assert await history(provider, cleared) == []
    assert await history(provider, by_id) == []
    assert len(await history(provider, kept)) == 2
    await run_turn(provider, cleared, [user("fresh start")])
    assert [m["contents"][0]["text"] for m in await history(provider, cleared)] == ["fresh start"]


async def test_concurrent_stores_from_8_tasks_lose_nothing(provider: ChatkeepHistoryProvider) -> None:
    session = AgentSession()
    session_id = session.session_id

    async def writer(task: int) -> None:
        for i in range(5):
            await provider.save_messages(session_id, [user(f"t{task}-m{i}")])

    await asyncio.gather(*(writer(task) for task in range(8)))
    texts = [m.text for m in await provider.get_messages(session_id)]
    assert sorted(texts) == sorted(f"t{t}-m{i}" for t in range(8) for i in range(5))
    for task in range(8):
        assert [t for t in texts if t.startswith(f"t{task}-")] == [f"t{task}-m{i}" for i in range(5)]


async def test_unicode_and_large_messages_round_trip(provider: ChatkeepHistoryProvider) -> None:
    session = AgentSession()
    texts = ["héllo 🌍 — مرحبا — こんにちは — \u0000 nul — \ud7ff", "x" * 300_000, "🚀" * 20_000]
    await run_turn(provider, session, [user(t) for t in texts])
    assert [m["contents"][0]["text"] for m in await history(provider, session)] == texts


async def test_every_field_round_trips_exactly(provider: ChatkeepHistoryProvider) -> None:
    written = [
        Message("system", ["You are terse."], additional_properties={"tags": ["a", {"b": None}], "n": 1.5}),
        Message(
            "assistant",
            [
                Content.from_text_reasoning(text="thinking…", protected_data="opaque-encrypted-blob"),
                Content.from_text("calling", additional_properties={"openai": {"logprobs": []}}),
                Content.from_function_call(call_id="call_1", name="get_weather", arguments={"city": "Zürich"}),
            ],
            author_name="Assistant",
            message_id="msg_1",
        ),
        Message("tool", [Content.from_function_result(call_id="call_1", result={"temp": 21, "unit": "°C"})]),
        Message(
            "user",
            [
                Content.from_data(b"\x00\x01\xff binary", "application/octet-stream"),
                Content.from_uri("https://example.com/cat.png", media_type="image/png"),
            ],
        ),
        Message("assistant", [Content.from_usage({"input_token_count": 3, "output_token_count": 4})]),
    ]
    session = AgentSession()
    await run_turn(provider, session, written[:1], written[1:])
    assert await history(provider, session) == [m.to_dict() for m in written]


# -- the session's key lives in the session's state ---------------------------------------------------------


async def test_the_session_key_lives_in_the_session_state(provider: ChatkeepHistoryProvider) -> None:
    session = AgentSession()
    await run_turn(provider, session, [user("remember me")])
    assert session.state["memory"] == {ChatkeepHistoryProvider.STATE_KEY: session.session_id}
    restored = AgentSession.from_dict(json.loads(json.dumps(session.to_dict())))
    assert [m.text for m in await run_turn(provider, restored, [user("who am I?")])] == ["remember me"]


async def test_a_session_state_naming_another_history_reads_that_one(provider: ChatkeepHistoryProvider) -> None:
    first = AgentSession()
    await run_turn(provider, first, [user("from the first session")])
    other = AgentSession()
    other.state["memory"] = {ChatkeepHistoryProvider.STATE_KEY: first.session_id}
    assert [m.text for m in await run_turn(provider, other, [user("hi")])] == ["from the first session"]


async def test_no_session_at_all_says_what_to_pass(provider: ChatkeepHistoryProvider) -> None:
    with pytest.raises(InvalidSessionKeyError, match=r"agent\.create_session"):
        await provider.get_messages(None)


async def test_tenants_do_not_see_each_other(store_url: str, tenant: str) -> None:
    async with (
        ChatkeepHistoryProvider(store=store_url, tenant=tenant) as a,
        ChatkeepHistoryProvider(store=store_url, tenant=f"{tenant}-b") as b,
    ):
        await a.save_messages("shared-id", [user("only for tenant a")])
        assert await b.get_messages("shared-id") == []
        assert [m.text for m in await a.get_messages("shared-id")] == ["only for tenant a"]


async def test_a_store_you_pass_stays_yours(tenant: str) -> None:
    async with open_store("memory://") as store:
        provider = ChatkeepHistoryProvider(store=store, tenant=tenant)
        await provider.save_messages("s1", [user("hi")])
        await provider.aclose()
        assert not store.closed
        assert [m.text for m in await store.load(SessionKey(tenant, "s1"))] == ["hi"]


async def test_the_stored_message_keeps_the_frameworks_dict_and_a_readable_rendering(tenant: str) -> None:
    async with open_store("memory://") as store:
        provider = ChatkeepHistoryProvider(store=store, tenant=tenant)
        message = Message("assistant", ["Bonjour"], author_name="A", message_id="resp_1")
        await provider.save_messages("s1", [message])
        (stored,) = await store.load(SessionKey(tenant, "s1"))
    assert (stored.role, stored.text) == ("assistant", "Bonjour")
    assert stored.message_id != "resp_1"  # chatkeep's own id: framework ids do not identify appends
    assert stored.additional_properties["chatkeep.interop"] == {"format": FORMAT, "item": message.to_dict()}


# -- what the provider refuses to read ----------------------------------------------------------------------


async def test_a_message_no_adapter_wrote_is_named(provider: ChatkeepHistoryProvider) -> None:
    key = provider.session_key("s1")
    plain = ChatkeepMessage(role="user", text="written by chatkeep itself")
    await provider.store.append(key, [plain])
    with pytest.raises(MessageFormatError, match=f"message {plain.message_id} was not written through"):
        await provider.get_messages("s1")


async def test_a_field_this_version_does_not_know_asks_for_an_upgrade(provider: ChatkeepHistoryProvider) -> None:
    key = provider.session_key("s1")
    newer = dict(Message("user", ["hi"]).to_dict(), field_from_the_future={"x": 1})
    await provider.store.append(key, [wrap(newer, format=FORMAT, role="user", text="hi")])
    with pytest.raises(MessageFormatError, match="newer agent-framework-core: upgrade"):
        await provider.get_messages("s1")
    (stored,) = await provider.store.load(key)
    assert stored.additional_properties["chatkeep.interop"]["item"] == newer  # kept as written
