"""Reducers: what history a model is sent; none drops a system message or splits a tool call from its results."""

from __future__ import annotations

import socket
from collections.abc import Sequence

import pytest

from chatkeep.core import (
    FunctionCallContent,
    FunctionResultContent,
    Message,
    MessageCountingReducer,
    Reducer,
    SummarizingReducer,
    TextContent,
    TokenBudgetReducer,
)
from chatkeep.core._reducers import approximate_token_count, drop_orphan_tool_results
from chatkeep.testing.scripted import ScriptedChatClient


def user(text: str) -> Message:
    return Message(role="user", text=text)


def assistant(text: str) -> Message:
    return Message(role="assistant", text=text)


def system(text: str) -> Message:
    return Message(role="system", text=text)


def call(*call_ids: str, text: str = "") -> Message:
    contents: list[TextContent | FunctionCallContent] = [TextContent(text=text)] if text else []
    contents += [FunctionCallContent(call_id=c, name=f"tool_{c}", arguments='{"x": 1}') for c in call_ids]
    return Message(role="assistant", contents=contents)


def result(*call_ids: str) -> Message:
    return Message(role="tool", contents=[FunctionResultContent(call_id=c, result=f"result {c}") for c in call_ids])


def texts(messages: Sequence[Message]) -> list[str]:
    """A readable form of a history: the text, or the call/result ids."""
    out = []
    for m in messages:
        if m.function_calls:
            out.append("call:" + ",".join(c.call_id for c in m.function_calls))
        elif m.function_results:
            out.append("result:" + ",".join(r.call_id for r in m.function_results))
        else:
            out.append(m.text)
    return out


def assert_no_split_groups(messages: Sequence[Message]) -> None:
    """Every tool result answers a call earlier in the list, and every kept call has all its results."""
    open_calls: set[str] = set()
    for m in messages:
        for r in m.function_results:
            assert r.call_id in open_calls, f"result {r.call_id} without its call"
            open_calls.discard(r.call_id)
        open_calls |= {c.call_id for c in m.function_calls}
    assert not open_calls, f"calls {open_calls} without their results"


def conversation(turns: int) -> list[Message]:
    return [m for i in range(turns) for m in (user(f"u{i}"), assistant(f"a{i}"))]


# -- drop_orphan_tool_results ---------------------------------------------------------------------


def test_drop_orphan_tool_results_drops_only_leading_results() -> None:
    history = [result("c0"), result("c1", "c2"), user("u"), call("c3"), result("c3")]

    assert texts(drop_orphan_tool_results(history)) == ["u", "call:c3", "result:c3"]
    assert drop_orphan_tool_results([result("c0")]) == []
    assert drop_orphan_tool_results([]) == []
    plain = [user("u"), assistant("a")]
    assert drop_orphan_tool_results(plain) == plain


# -- MessageCountingReducer -----------------------------------------------------------------------


def test_reducers_satisfy_the_protocol() -> None:
    assert isinstance(MessageCountingReducer(1), Reducer)
    assert isinstance(TokenBudgetReducer(10), Reducer)
    assert isinstance(SummarizingReducer(ScriptedChatClient()), Reducer)


async def test_counting_keeps_the_newest_n() -> None:
    history = conversation(5)

    reduced = await MessageCountingReducer(3).reduce(history)

    assert texts(reduced) == ["a3", "u4", "a4"]
    assert reduced == history[-3:]


async def test_counting_below_the_limit_returns_the_history_unchanged() -> None:
    history = [system("be brief"), user("u0"), assistant("a0"), system("now in French"), user("u1")]

    assert await MessageCountingReducer(10).reduce(history) == history


async def test_counting_keeps_every_system_message_beyond_n() -> None:
    history = [system("s0"), *conversation(3), system("s1"), *conversation(2)]

    reduced = await MessageCountingReducer(2).reduce(history)

    assert texts(reduced) == ["s0", "s1", "u1", "a1"]


async def test_counting_never_separates_a_call_from_its_result() -> None:
    history = [user("u0"), call("c1"), result("c1"), assistant("done"), user("u1")]

    # The newest 3 would start with the tool result: the whole group goes instead.
    reduced = await MessageCountingReducer(3).reduce(history)

    assert texts(reduced) == ["done", "u1"]
    assert texts(await MessageCountingReducer(4).reduce(history)) == ["call:c1", "result:c1", "done", "u1"]


async def test_counting_keeps_parallel_results_with_their_call() -> None:
    history = [
        user("u0"),
        call("c1", "c2", "c3", text="checking three things"),
        result("c1"),
        result("c2", "c3"),
        assistant("all done"),
    ]

    for n in range(1, 7):
        reduced = await MessageCountingReducer(n).reduce(history)
        assert len(reduced) <= n
        assert_no_split_groups(reduced)
    assert texts(await MessageCountingReducer(4).reduce(history)) == [
        "call:c1,c2,c3",
        "result:c1",
        "result:c2,c3",
        "all done",
    ]
    assert texts(await MessageCountingReducer(3).reduce(history)) == ["all done"]


async def test_counting_drops_orphan_leading_tool_results() -> None:
    # A window that starts inside a call/result group.
    history = [result("c0"), result("c1"), user("u1"), assistant("a1")]

    assert texts(await MessageCountingReducer(10).reduce(history)) == ["u1", "a1"]


async def test_counting_drops_a_result_whose_call_is_absent() -> None:
    history = [user("u0"), result("ghost"), assistant("a0")]

    assert texts(await MessageCountingReducer(10).reduce(history)) == ["u0", "a0"]


def test_counting_refuses_n_below_one() -> None:
    with pytest.raises(ValueError, match="n >= 1"):
        MessageCountingReducer(0)


async def test_counting_does_not_change_its_input() -> None:
    history = conversation(4)
    before = list(history)

    await MessageCountingReducer(2).reduce(history)

    assert history == before


# -- TokenBudgetReducer ---------------------------------------------------------------------------


def test_default_tokenizer_counts_words_and_punctuation_deterministically() -> None:
    assert approximate_token_count("") == 0
    assert approximate_token_count("a b c") == 3
    assert approximate_token_count("Hi, you!") == 4  # punctuation counts
    assert approximate_token_count("internationalization") == 5  # long words count as several tokens
    assert approximate_token_count("日本語のテキスト") >= 1
    text = "The quick brown fox — jumps over 13 lazy dogs! " * 50
    assert approximate_token_count(text) == approximate_token_count(text)


async def test_default_tokenizer_needs_no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the default tokenizer tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    reducer = TokenBudgetReducer(50)

    reduced = await reducer.reduce(conversation(20))

    assert 0 < len(reduced) < 40


async def test_token_budget_is_respected_and_newest_kept() -> None:
    history = conversation(30)
    reducer = TokenBudgetReducer(60)

    reduced = await reducer.reduce(history)

    cost = sum(reducer.count(m) for m in reduced)
    assert cost <= 60
    assert reduced == history[-len(reduced) :]
    # The next older message would not have fit.
    assert cost + reducer.count(history[-len(reduced) - 1]) > 60


async def test_token_budget_always_keeps_system_messages() -> None:
    big_system = system("rule " * 500)
    history = [big_system, *conversation(3)]

    reduced = await TokenBudgetReducer(10).reduce(history)

    assert reduced == [big_system]


async def test_token_budget_counts_system_messages_first() -> None:
    reducer = TokenBudgetReducer(100, tokenizer=len, per_message_overhead=0)
    history = [system("s" * 60), user("u" * 30), assistant("a" * 30)]

    assert await reducer.reduce(history) == [history[0], history[2]]


async def test_token_budget_uses_a_custom_tokenizer() -> None:
    seen: list[str] = []

    def one_token_per_character(text: str) -> int:
        seen.append(text)
        return len(text)

    reducer = TokenBudgetReducer(25, tokenizer=one_token_per_character, per_message_overhead=0)
    history = [user("x" * 10), assistant("y" * 10), user("z" * 10)]

    reduced = await reducer.reduce(history)

    assert reduced == history[1:]
    assert "z" * 10 in seen
    assert reducer.count(user("abc")) == 3


async def test_token_budget_counts_tool_calls_and_results() -> None:
    reducer = TokenBudgetReducer(1000, tokenizer=len, per_message_overhead=0)
    call_message = Message(
        role="assistant",
        contents=[FunctionCallContent(call_id="c", name="lookup", arguments='{"q": "' + "x" * 100 + '"}')],
    )
    result_message = Message(role="tool", contents=[FunctionResultContent(call_id="c", result={"rows": ["y" * 200]})])

    assert reducer.count(call_message) > 100
    assert reducer.count(result_message) > 200


async def test_token_budget_keeps_groups_whole() -> None:
    reducer = TokenBudgetReducer(3, tokenizer=lambda _text: 0, per_message_overhead=1)  # one token a message
    history = [user("u0"), call("c1", "c2"), result("c1"), result("c2"), assistant("done"), user("u1")]

    reduced = await reducer.reduce(history)

    assert texts(reduced) == ["done", "u1"]
    for budget in range(1, 8):
        assert_no_split_groups(await TokenBudgetReducer(budget, tokenizer=lambda _t: 0).reduce(history))


def test_token_budget_refuses_a_budget_below_one() -> None:
    with pytest.raises(ValueError, match="max_tokens >= 1"):
        TokenBudgetReducer(0)


# -- SummarizingReducer ---------------------------------------------------------------------------


def summary_text(message: Message) -> str:
    assert message.role == "system"
    assert message.text.startswith("Summary of the earlier conversation:\n")
    return message.text.split("\n", 1)[1]


async def test_summarizing_below_threshold_changes_nothing_and_calls_no_model() -> None:
    client = ScriptedChatClient()
    reducer = SummarizingReducer(client, keep_last=2, summarize_after=6)
    history = [system("be brief"), *conversation(3)]

    assert await reducer.reduce(history) == history
    assert client.requests == []


async def test_summarizing_above_threshold_sends_older_messages_and_keeps_the_newest() -> None:
    client = ScriptedChatClient()
    client.reply_text("  The user is Zoë and likes Italian food.  ")
    reducer = SummarizingReducer(client, keep_last=2, summarize_after=4)
    instructions = system("be brief")
    history = [instructions, *conversation(3)]  # 6 non-system messages

    reduced = await reducer.reduce(history)

    assert reduced[0] is instructions
    assert summary_text(reduced[1]) == "The user is Zoë and likes Italian food."
    assert reduced[2:] == history[-2:]
    assert len(client.requests) == 1
    (sent,) = client.requests[0].messages
    for older in ("u0", "a0", "u1", "a1"):
        assert older in sent.text
    for newer in ("u2", "a2"):
        assert newer not in sent.text
    assert client.requests[0].options.instructions  # the summarizing prompt


async def test_summarizing_the_same_history_again_uses_the_cache() -> None:
    client = ScriptedChatClient()
    client.reply_text("summary one")
    reducer = SummarizingReducer(client, keep_last=2, summarize_after=4)
    history = conversation(4)

    first = await reducer.reduce(history)
    second = await reducer.reduce(list(history))

    assert len(client.requests) == 1
    assert summary_text(first[0]) == summary_text(second[0]) == "summary one"
    assert second[1:] == first[1:] == history[-2:]


async def test_summarizing_a_grown_history_reuses_the_summary_until_it_grew_enough() -> None:
    client = ScriptedChatClient()
    client.reply_text("summary one")
    client.reply_text("summary two")
    reducer = SummarizingReducer(client, keep_last=2, summarize_after=4)
    history = conversation(3)  # 6 messages: u0..a1 summarized, u2 a2 kept

    await reducer.reduce(history)
    history += [user("u3")]
    grown = await reducer.reduce(history)

    # Grown by one message: the summary is reused and the messages after it are sent as they are.
    assert len(client.requests) == 1
    assert summary_text(grown[0]) == "summary one"
    assert texts(grown[1:]) == ["u2", "a2", "u3"]

    history += [assistant("a3"), user("u4")]  # now 5 messages after the summary: more than summarize_after
    regrown = await reducer.reduce(history)
    assert len(client.requests) == 2
    assert summary_text(regrown[0]) == "summary two"
    assert texts(regrown[1:]) == ["a3", "u4"]


async def test_summarizing_never_splits_a_call_from_its_results() -> None:
    client = ScriptedChatClient()
    client.reply_text("earlier stuff")
    reducer = SummarizingReducer(client, keep_last=2, summarize_after=3)
    history = [user("u0"), assistant("a0"), user("u1"), call("c1", "c2"), result("c1"), result("c2"), user("u2")]

    reduced = await reducer.reduce(history)

    # Keeping 2 would split the call group, so it goes to the summary whole.
    assert texts(reduced[1:]) == ["u2"]
    (sent,) = client.requests[0].messages
    assert "tool_c1" in sent.text
    assert "result c1" in sent.text
    assert "result c2" in sent.text


async def test_summarizing_keeps_a_call_group_larger_than_keep_last_whole() -> None:
    client = ScriptedChatClient()
    client.reply_text("earlier stuff")
    reducer = SummarizingReducer(client, keep_last=1, summarize_after=2)
    history = [user("u0"), assistant("a0"), call("c1", "c2"), result("c1"), result("c2")]

    reduced = await reducer.reduce(history)

    assert texts(reduced[1:]) == ["call:c1,c2", "result:c1", "result:c2"]
    assert_no_split_groups(reduced)


def test_summarizing_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="keep_last >= 1"):
        SummarizingReducer(ScriptedChatClient(), keep_last=0)
    with pytest.raises(ValueError, match="at least keep_last"):
        SummarizingReducer(ScriptedChatClient(), keep_last=5, summarize_after=4)
