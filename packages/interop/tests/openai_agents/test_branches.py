"""``ChatkeepSession`` as the SDK's ``AdvancedSQLiteSession``: branches (chatkeep forks) and per-turn usage."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest
from agents import Agent, Runner, TResponseInputItem, function_tool
from agents.models.interface import Model
from agents.usage import Usage

from chatkeep.core import InvalidArgumentError, SessionKey
from chatkeep.interop.openai_agents import ChatkeepSession
from chatkeep.testing.openai_server import FakeOpenAIServer

SessionFactory = Callable[..., Awaitable[ChatkeepSession]]


def _forecast(city: str) -> str:
    """The forecast for a city."""
    return f"sunny in {city}"


def _agent(model: Model) -> Agent:
    """A trip planner with one tool, so that a run can make two model requests."""
    return Agent(name="planner", instructions="Plan trips.", tools=[function_tool(_forecast)], model=model)


def _turn(question: str, answer: str) -> list[TResponseInputItem]:
    return cast(
        list[TResponseInputItem], [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    )


def _contents(items: list[TResponseInputItem]) -> list[Any]:
    return [cast(dict[str, Any], item).get("content") for item in items]


def _texts(items: list[TResponseInputItem]) -> list[str]:
    """Each message item's text (a user's string, or an assistant's output_text parts)."""
    texts = []
    for item in cast(list[dict[str, Any]], items):
        content = item.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content)
        if content is not None:
            texts.append(content)
    return texts


def _run_with(usage: Usage) -> Any:
    """What ``store_run_usage`` reads of a run's result: its context's usage."""
    return SimpleNamespace(context_wrapper=SimpleNamespace(usage=usage))


async def _run(session: ChatkeepSession, model: Model, question: str) -> None:
    result = await Runner.run(_agent(model), question, session=session)
    await session.store_run_usage(result)


async def test_a_real_runs_usage_lands_with_its_turn(
    make_session: SessionFactory, model: Model, openai_server: FakeOpenAIServer
) -> None:
    session = await make_session()
    openai_server.reply_text("A weekend in Lisbon: Alfama, then Belem.", usage=(10, 5))
    await _run(session, model, "Plan a weekend in Lisbon.")
    openai_server.reply_tool_calls([("call_1", "_forecast", '{"city": "Lisbon"}')], usage=(20, 3))
    openai_server.reply_text("Sunny: pack light.", usage=(30, 4))
    await _run(session, model, "What will the weather be?")

    per_turn = await session.get_turn_usage()
    assert isinstance(per_turn, list)
    assert [(t["user_turn_number"], t["requests"], t["input_tokens"], t["output_tokens"]) for t in per_turn] == [
        (1, 1, 10, 5),
        (2, 2, 50, 7),
    ]
    assert await session.get_session_usage() == {
        "requests": 3,
        "input_tokens": 60,
        "output_tokens": 12,
        "total_tokens": 72,
        "total_turns": 2,
    }
    # The store's own usage counter saw the same runs, one call per model request, kept by the appends.
    used = await session.store.usage(session.branch_key())
    assert (used.calls, used.input_tokens, used.output_tokens, used.total_tokens) == (3, 60, 12, 72)
    assert await session.get_tool_usage() == [("_forecast", 1, 2)]

    # The model never sees a usage record: the next turn sends the history's items only.
    openai_server.reply_text("Have a good trip.", usage=(40, 4))
    await _run(session, model, "Thanks!")
    sent = json.dumps(openai_server.requests[-1].get("input", openai_server.requests[-1].get("messages")))
    assert "openai-agents.usage" not in sent
    assert "input_tokens_details" not in sent
    assert _texts(await session.get_items())[-2:] == ["Thanks!", "Have a good trip."]


async def test_a_branch_from_an_earlier_turn_continues_from_there_and_the_old_branch_stays(
    make_session: SessionFactory, model: Model, openai_server: FakeOpenAIServer, tenant: str
) -> None:
    session = await make_session("trip")
    openai_server.reply_text("Day 1: Alfama.", usage=(10, 2))
    await _run(session, model, "Plan a weekend in Lisbon.")
    openai_server.reply_text("Booked the 7:05 flight.", usage=(20, 3))
    await _run(session, model, "Book the cheapest flight.")

    assert await session.create_branch_from_turn(2, "by-train") == "by-train"
    assert session.current_branch_id == "by-train"
    openai_server.reply_text("Trains leave hourly from Santa Apolonia.", usage=(12, 4))
    await _run(session, model, "Go by train instead.")

    # The model was sent turn 1 and the new question, never the turn the branch left out.
    sent = json.dumps(openai_server.requests[-1].get("input", openai_server.requests[-1].get("messages")))
    assert "Plan a weekend in Lisbon." in sent
    assert "Book the cheapest flight." not in sent
    assert _texts(await session.get_items()) == [
        "Plan a weekend in Lisbon.",
        "Day 1: Alfama.",
        "Go by train instead.",
        "Trains leave hourly from Santa Apolonia.",
    ]
    assert _texts(await session.get_items(branch_id="main"))[2:] == [
        "Book the cheapest flight.",
        "Booked the 7:05 flight.",
    ]

    # The branch is a chatkeep fork of main, not a copy, and is found from any other instance.
    infos = {info.session_id: info for info in (await session.store.list_sessions(tenant)).items}
    branch_info = infos[session.branch_key().session_id]
    assert branch_info.forked_from is not None
    assert branch_info.forked_from.session_id == "trip"
    assert [
        (b["branch_id"], b["message_count"], b["user_turns"], b["is_current"]) for b in await session.list_branches()
    ] == [
        ("main", 4, 2, False),
        ("by-train", 4, 2, True),
    ]
    elsewhere = await make_session("trip")
    assert elsewhere.current_branch_id == "main"
    await elsewhere.switch_to_branch("by-train")
    assert _texts(await elsewhere.get_items())[-1] == "Trains leave hourly from Santa Apolonia."

    # Usage: the branch's turn 1 is main's (taken by the fork), counted once over all branches.
    branch_turns = await session.get_turn_usage()
    assert [(t["user_turn_number"], t["input_tokens"]) for t in cast(list[dict[str, Any]], branch_turns)] == [
        (1, 10),
        (2, 12),
    ]
    main_turn_2 = cast(dict[str, Any], await session.get_turn_usage(2, branch_id="main"))
    assert {name: main_turn_2[name] for name in ("requests", "input_tokens", "output_tokens", "total_tokens")} == {
        "requests": 1,
        "input_tokens": 20,
        "output_tokens": 3,
        "total_tokens": 23,
    }
    assert set(main_turn_2) == {
        "requests",
        "input_tokens",
        "output_tokens",
        "total_tokens",
        "input_tokens_details",
        "output_tokens_details",
    }
    everything = await session.get_session_usage()
    assert everything is not None
    assert (everything["input_tokens"], everything["total_turns"]) == (42, 3)
    assert (await session.store.usage(session.branch_key())).input_tokens == 22


async def test_usage_records_are_never_items(make_session: SessionFactory) -> None:
    session = await make_session()
    for n in (1, 2, 3):
        await session.add_items(_turn(f"question {n}", f"answer {n}"))
        await session.store_run_usage(_run_with(Usage(requests=1, input_tokens=n, output_tokens=1, total_tokens=n + 1)))

    assert _contents(await session.get_items()) == [f"{kind} {n}" for n in (1, 2, 3) for kind in ("question", "answer")]
    # A window counts items: the records between them take no place in it.
    assert _contents(await session.get_items(limit=3)) == ["answer 2", "question 3", "answer 3"]
    # pop_item returns the newest item, and the usage record stored after it goes with it.
    assert cast(dict[str, Any], await session.pop_item())["content"] == "answer 3"
    turns = cast(list[dict[str, Any]], await session.get_turn_usage())
    assert [t["user_turn_number"] for t in turns] == [1, 2]
    assert (await session.store.usage(session.branch_key())).calls == 2
    assert await session.get_turn_usage(3) == {}


async def test_a_turns_usage_is_its_newest_report(make_session: SessionFactory) -> None:
    session = await make_session()
    await session.add_items(_turn("q", "a"))
    await session.store_run_usage(_run_with(Usage(requests=1, input_tokens=10, output_tokens=2, total_tokens=12)))
    # A run resumed from its RunState (after a tool approval) reports the usage of the whole turn again.
    await session.store_run_usage(_run_with(Usage(requests=2, input_tokens=25, output_tokens=5, total_tokens=30)))
    turn = cast(dict[str, Any], await session.get_turn_usage(1))
    assert (turn["requests"], turn["input_tokens"], turn["output_tokens"]) == (2, 25, 5)
    assert await session.get_session_usage() == {
        "requests": 2,
        "input_tokens": 25,
        "output_tokens": 5,
        "total_tokens": 30,
        "total_turns": 1,
    }
    used = await session.store.usage(session.branch_key())
    assert (used.input_tokens, used.output_tokens, used.total_tokens) == (25, 5, 30)


async def test_an_empty_session_stores_no_usage(make_session: SessionFactory) -> None:
    session = await make_session()
    await session.store_run_usage(_run_with(Usage(requests=1, input_tokens=5, output_tokens=1, total_tokens=6)))
    assert await session.get_session_usage() is None
    assert await session.store.count(session.branch_key()) == 0


async def test_turns_of_a_branch(make_session: SessionFactory) -> None:
    session = await make_session()
    await session.add_items(_turn("Tell me about cats", "Cats purr."))
    await session.add_items(
        cast(
            list[TResponseInputItem],
            [
                {"role": "user", "content": [{"type": "input_text", "text": "And DOGS?"}]},
                {"type": "function_call", "name": "lookup", "namespace": "wiki", "call_id": "c1", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "Dogs bark."},
                {"role": "assistant", "content": "Dogs bark."},
            ],
        )
    )
    turns = await session.get_conversation_turns()
    assert [(t["turn"], t["content"], t["can_branch"]) for t in turns] == [
        (1, "Tell me about cats", True),
        (2, '[{"type": "input_text", "text": "And DOGS?"}]', True),
    ]
    assert [t["turn"] for t in await session.find_turns_by_content("dogs")] == [2]
    assert await session.get_conversation_by_turns() == {
        1: [{"type": "user", "tool_name": None}, {"type": "assistant", "tool_name": None}],
        2: [
            {"type": "user", "tool_name": None},
            {"type": "function_call", "tool_name": "wiki.lookup"},
            {"type": "function_call_output", "tool_name": None},
            {"type": "assistant", "tool_name": None},
        ],
    }
    assert await session.get_tool_usage() == [("wiki.lookup", 1, 2)]

    assert await session.create_branch_from_content("dogs", "dogs") == "dogs"
    assert _contents(await session.get_items()) == ["Tell me about cats", "Cats purr."]


async def test_a_branch_from_turn_1_is_empty_until_its_first_items(make_session: SessionFactory, tenant: str) -> None:
    session = await make_session("s")
    await session.add_items(_turn("first", "one"))
    assert await session.create_branch_from_turn(1, "fresh") == "fresh"
    assert await session.get_items() == []
    assert [b["branch_id"] for b in await session.list_branches()] == ["main"]  # nothing stored yet
    await session.add_items(_turn("another first", "two"))
    assert [b["branch_id"] for b in await session.list_branches()] == ["main", "fresh"]
    assert _contents(await session.get_items(branch_id="main")) == ["first", "one"]
    fresh = {i.session_id: i for i in (await session.store.list_sessions(tenant)).items}[
        session.branch_key().session_id
    ]
    assert fresh.forked_from is None


async def test_generated_branch_names_never_meet(make_session: SessionFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("time.time", lambda: 1_700_000_000.0)
    session = await make_session()
    await session.add_items(_turn("q1", "a1") + _turn("q2", "a2"))
    first = await session.create_branch_from_turn(2)
    await session.switch_to_branch("main")
    second = await session.create_branch_from_turn(2)
    assert (first, second) == ("branch_from_turn_2_1700000000", "branch_from_turn_2_1700000000_2")


async def test_branch_refusals_say_what_to_pass(make_session: SessionFactory) -> None:
    session = await make_session()
    await session.add_items(_turn("q1", "a1") + _turn("q2", "a2"))
    await session.create_branch_from_turn(2, "b")
    await session.switch_to_branch("main")
    refusals = [
        (session.create_branch_from_turn(5, "x"), "Turn 5 does not contain a user message"),
        (session.create_branch_from_turn(2, "b"), "already been used"),
        (session.create_branch_from_turn(2, "main"), "already been used"),
        (session.create_branch_from_turn(2, "  "), "cannot be empty"),
        (session.create_branch_from_turn(2, "a#branch:b"), "holds '#branch:'"),
        (session.create_branch_from_content("nothing like it"), "No user turns found containing"),
        (session.switch_to_branch("nonexistent"), "Branch 'nonexistent' does not exist"),
        (session.delete_branch("nonexistent"), "Branch 'nonexistent' does not exist"),
        (session.delete_branch("main"), "Cannot delete the 'main' branch"),
        (session.delete_branch(" "), "Branch ID cannot be empty"),
    ]
    for call, expected in refusals:
        with pytest.raises(InvalidArgumentError, match=expected) as raised:
            await call
        assert "Pass " in str(raised.value)
    await session.switch_to_branch("b")
    with pytest.raises(InvalidArgumentError, match="Cannot delete current branch 'b'"):
        await session.delete_branch("b")
    await session.delete_branch("b", force=True)
    assert session.current_branch_id == "main"
    assert [b["branch_id"] for b in await session.list_branches()] == ["main"]


async def test_deleting_a_branch_keeps_the_branches_made_from_it(make_session: SessionFactory) -> None:
    session = await make_session()
    await session.add_items(_turn("q1", "a1") + _turn("q2", "a2"))
    await session.create_branch_from_turn(2, "a")
    await session.add_items(_turn("qa2", "aa2") + _turn("qa3", "aa3"))
    await session.create_branch_from_turn(3, "b")
    await session.switch_to_branch("main")
    await session.delete_branch("a")
    assert _contents(await session.get_items(branch_id="b")) == ["q1", "a1", "qa2", "aa2"]
    assert [b["branch_id"] for b in await session.list_branches()] == ["main", "b"]


async def test_clear_session_deletes_every_branch(make_session: SessionFactory, tenant: str) -> None:
    session = await make_session("s")
    await session.add_items(_turn("q1", "a1") + _turn("q2", "a2"))
    await session.create_branch_from_turn(2, "a")
    await session.add_items(_turn("qa", "aa"))
    await session.clear_session()
    assert session.current_branch_id == "main"
    assert (await session.store.list_sessions(tenant)).items == []
    assert await session.list_branches() == []


async def test_branches_of_two_sessions_never_meet(make_session: SessionFactory) -> None:
    one, two = await make_session("one"), await make_session("one#branch:x")
    await one.add_items(_turn("q1", "a1") + _turn("q2", "a2"))
    await one.create_branch_from_turn(2, "y")
    await two.add_items(_turn("other", "conversation"))
    assert [b["branch_id"] for b in await one.list_branches()] == ["main", "y"]
    assert [b["branch_id"] for b in await two.list_branches()] == ["main"]
    # Session "one#branch:x" is where one's branch "x" would be: refused, never merged into it.
    await one.switch_to_branch("main")
    with pytest.raises(InvalidArgumentError, match="already been used"):
        await one.create_branch_from_turn(2, "x")
    assert _contents(await two.get_items()) == ["other", "conversation"]
    assert one.branch_key("y") == SessionKey(one.tenant, "one#branch:y")
