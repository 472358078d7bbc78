"""``ChatkeepConversationStore`` beside Pydantic AI's ``InMemoryConversationStore``: each scenario runs on both.

Entry ids and revisions are minted per save, so a scenario returns what a user sees (texts, counts, which
calls conflict), and the two stores must agree; chatkeep-specific checks (forks by reference, one chatkeep
message per entry, concurrent writers across instances) follow on the adapter alone.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pydantic_ai.conversation import Conversation
from pydantic_ai.conversation_store import (
    ConversationConflict,
    ConversationRecord,
    ConversationStore,
    InMemoryConversationStore,
)
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.usage import RunUsage

from chatkeep.core import AgentSession, MessageFormatError, SessionKey
from chatkeep.interop.pydantic_ai import ChatkeepConversationStore

StoreFactory = Callable[[], ChatkeepConversationStore]
Scenario = Callable[[ConversationStore], Awaitable[Any]]

TURNS: list[list[ModelMessage]] = [
    [ModelRequest(parts=[UserPromptPart(content=f"question {n}")]), ModelResponse(parts=[TextPart(f"answer {n}")])]
    for n in range(6)
]


def texts(messages: list[ModelMessage]) -> list[str]:
    return [str(p.content) for m in messages for p in m.parts if isinstance(p, (UserPromptPart, TextPart))]


async def agree(make_store: StoreFactory, scenario: Scenario) -> Any:
    """Run ``scenario`` on the reference store and on the adapter; both must give the same outcome."""
    reference = await scenario(InMemoryConversationStore())
    ours = await scenario(make_store())
    assert ours == reference
    return ours


async def conflicts(call: Awaitable[object]) -> bool:
    try:
        await call
    except ConversationConflict:
        return True
    return False


async def saved(store: ConversationStore, conversation_id: str, *turns: int, **options: Any) -> Conversation:
    """A conversation saved turn by turn (a save per turn, as after each run), loaded back."""
    for n in turns:
        conversation = await store.load(conversation_id) or Conversation(conversation_id=conversation_id)
        conversation.messages += TURNS[n]
        conversation.usage = conversation.usage + RunUsage(requests=1, input_tokens=3, output_tokens=2)
        await store.save(conversation, **options)
    loaded = await store.load(conversation_id, scope=options.get("scope"))
    assert loaded is not None
    return loaded


async def with_record(store: ConversationStore, conversation_id: str) -> tuple[Conversation, ConversationRecord]:
    """The stored conversation and its record."""
    conversation, record = await store.load(conversation_id), await store.read_record(conversation_id)
    assert conversation is not None
    assert record is not None
    return conversation, record


async def test_a_save_appends_only_the_new_messages_and_a_load_returns_them(make_store: StoreFactory) -> None:
    async def scenario(store: ConversationStore) -> Any:
        first = await store.save(Conversation(conversation_id="c1", messages=list(TURNS[0])))
        conversation = await store.load("c1")
        assert conversation is not None
        conversation.messages += TURNS[1]
        second = await store.save(conversation)
        again = await store.save(conversation)  # nothing new
        entries = await store.load_entries("c1")
        assert entries is not None
        chained = all(e.parent_id == p.id for p, e in itertools.pairwise(entries))
        loaded = await store.load("c1", limit=3)
        assert loaded is not None
        return len(first), len(second), len(again), chained, texts(loaded.messages), await store.load("nope")

    outcome = await agree(make_store, scenario)
    assert outcome[:4] == (2, 2, 0, True)


async def test_usage_deferred_state_and_revision_travel_with_the_record(make_store: StoreFactory) -> None:
    async def scenario(store: ConversationStore) -> Any:
        loaded = await saved(store, "c1", 0, 1, 2)
        record = await store.read_record("c1")
        assert record is not None
        assert loaded.revision == record.revision
        return loaded.usage, record.head_id == (await store.load_entries("c1") or [None])[-1].id  # type: ignore[union-attr]

    usage, head_is_last = await agree(make_store, scenario)
    assert usage == RunUsage(requests=3, input_tokens=9, output_tokens=6)
    assert head_is_last


async def test_stale_or_duplicate_saves_conflict(make_store: StoreFactory) -> None:
    async def scenario(store: ConversationStore) -> Any:
        await saved(store, "c1", 0)
        a, b = await store.load("c1"), await store.load("c1")
        assert a is not None
        assert b is not None
        a.messages += TURNS[1]
        b.messages += TURNS[2]
        outcomes = [await conflicts(store.save(a)), await conflicts(store.save(b))]
        outcomes.append(await conflicts(store.save(Conversation(conversation_id="c1", messages=list(TURNS[3])))))
        loaded = await store.load("c1")
        assert loaded is not None
        return outcomes, texts(loaded.messages)

    outcomes, stored = await agree(make_store, scenario)
    assert outcomes == [False, True, True]
    assert stored == ["question 0", "answer 0", "question 1", "answer 1"]


async def test_a_branch_keeps_the_history_it_leaves_and_can_return_to_it(make_store: StoreFactory) -> None:
    async def scenario(store: ConversationStore) -> Any:
        loaded = await saved(store, "c1", 0, 1, 2)
        stale = loaded.revision
        branched = await store.branch("c1", at=2, expected_revision=loaded.revision)
        branched.messages += TURNS[3]
        await store.save(branched)
        on_branch, record = await with_record(store, "c1")
        back = await store.branch("c1", from_entry=record.branches[0], expected_revision=on_branch.revision)
        back_texts = texts(back.messages)
        back.messages += TURNS[4]
        await store.save(back)
        final, final_record = await with_record(store, "c1")
        stale_branch = await conflicts(store.branch("c1", at=0, expected_revision=stale))
        return texts(on_branch.messages), back_texts, texts(final.messages), len(final_record.branches), stale_branch

    on_branch, back, final, branches, stale_branch = await agree(make_store, scenario)
    assert on_branch == ["question 0", "answer 0", "question 3", "answer 3"]
    assert back == texts(TURNS[0] + TURNS[1] + TURNS[2])
    assert final == texts(TURNS[0] + TURNS[1] + TURNS[2] + TURNS[4])
    assert branches == 1
    assert stale_branch


async def test_a_rewritten_history_branches_off_the_last_shared_message(make_store: StoreFactory) -> None:
    async def scenario(store: ConversationStore) -> Any:
        loaded = await saved(store, "c1", 0, 1)
        # Serialized and rebuilt (no new_message_index): the save compares it with the stored history.
        rebuilt = Conversation(conversation_id="c1", messages=TURNS[0] + TURNS[2], revision=loaded.revision)
        new = await store.save(rebuilt)
        stored, record = await with_record(store, "c1")
        left = await store.branch("c1", from_entry=record.branches[0], expected_revision=stored.revision)
        return len(new), texts(stored.messages), texts(left.messages)

    new, stored, left = await agree(make_store, scenario)
    assert new == 2
    assert stored == texts(TURNS[0] + TURNS[2])
    assert left == texts(TURNS[0] + TURNS[1])


async def test_branching_to_nothing_and_back(make_store: StoreFactory) -> None:
    async def scenario(store: ConversationStore) -> Any:
        loaded = await saved(store, "c1", 0)
        empty = await store.branch("c1", at=0, expected_revision=loaded.revision)
        empty.messages += TURNS[1]
        await store.save(empty)
        stored = await store.load("c1")
        assert stored is not None
        return texts(stored.messages)

    assert await agree(make_store, scenario) == texts(TURNS[1])


async def test_a_fork_starts_a_conversation_from_a_point_and_the_original_carries_on(
    make_store: StoreFactory, tenant: str
) -> None:
    async def scenario(store: ConversationStore) -> Any:
        await saved(store, "c1", 0, 1, 2)
        fork = await store.fork("c1", at=4, new_conversation_id="f1")
        fork.messages += TURNS[3]
        await store.save(fork)
        whole = await store.fork("c1", new_conversation_id="f2")
        again = await conflicts(store.fork("c1", new_conversation_id="f1"))
        original = await store.load("c1")
        assert original is not None
        forked, record = await with_record(store, "f1")
        return texts(original.messages), texts(forked.messages), record.forked_from, whole.usage, again

    original, forked, forked_from, whole_usage, again = await agree(make_store, scenario)
    assert forked == texts(TURNS[0] + TURNS[1] + TURNS[3])
    assert original == texts(TURNS[0] + TURNS[1] + TURNS[2])
    assert forked_from == "c1"
    assert whole_usage.requests == 3
    assert again

    # On chatkeep, a fork is chatkeep's own: a session referring to its source, nothing copied.
    store = make_store()
    infos = {i.session_id: i for i in (await store.store.list_sessions(tenant)).items}
    forked_info = infos["f1"].forked_from
    assert forked_info is not None
    assert forked_info.session_id == "c1"


async def test_forks_outlive_their_source_and_a_deleted_conversation_can_start_again(
    make_store: StoreFactory,
) -> None:
    async def scenario(store: ConversationStore) -> Any:
        await saved(store, "c1", 0, 1)
        await store.fork("c1", at=2, new_conversation_id="f1")
        await store.delete("c1")
        gone = await store.load("c1")
        fork = await store.load("f1")
        assert fork is not None
        again = await saved(store, "c1", 2)
        return (
            gone,
            texts(fork.messages),
            texts(again.messages),
            [r.conversation_id for r in await store.list_conversations()],
        )

    gone, fork, again, listed = await agree(make_store, scenario)
    assert gone is None
    assert fork == texts(TURNS[0])
    assert again == texts(TURNS[2])
    assert listed == ["c1", "f1"]


async def test_scopes_keep_conversations_to_their_owner(make_store: StoreFactory) -> None:
    async def scenario(store: ConversationStore) -> Any:
        await saved(store, "c1", 0, scope="alice")
        await saved(store, "c2", 1, scope="bob")
        hidden = await store.load("c1", scope="bob")
        shown = await store.load("c1", scope="alice")
        c1 = await store.load("c1")
        assert c1 is not None
        c1.messages += TURNS[2]
        wrong_scope = await conflicts(store.save(c1, scope="bob"))
        listed = {s: [r.conversation_id for r in await store.list_conversations(scope=s)] for s in ("alice", "bob")}
        await store.delete("c1", scope="bob")
        kept = await store.load("c1") is not None
        await store.delete("c1", scope="alice")
        return hidden, shown is not None, wrong_scope, listed, kept, await store.load("c1")

    hidden, shown, wrong_scope, listed, kept, deleted = await agree(make_store, scenario)
    assert hidden is None
    assert shown
    assert wrong_scope
    assert kept
    assert deleted is None
    assert listed == {"alice": ["c1"], "bob": ["c2"]}


async def test_conversations_list_newest_first(make_store: StoreFactory) -> None:
    async def scenario(store: ConversationStore) -> Any:
        for conversation_id in ("c1", "c2", "c3"):
            await saved(store, conversation_id, 0)
        await saved(store, "c1", 1)
        listed = [r.conversation_id for r in await store.list_conversations()]
        return listed, [r.conversation_id for r in await store.list_conversations(limit=2)]

    assert await agree(make_store, scenario) == (["c1", "c3", "c2"], ["c1", "c3"])


async def test_messages_come_back_exactly_as_pydantic_ai_wrote_them(make_store: StoreFactory) -> None:
    image = BinaryContent(data=b"\x89PNG\x00\xff\xfe", media_type="image/png")
    messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(content=["Look: \u00e9\U0001f600 \x00 nul", image])]),
        ModelResponse(
            parts=[ToolCallPart("inspect", {"raw": "a\nb", "n": 1}, tool_call_id="call_1")],
            model_name="fake-model",
            provider_details={"finish_reason": "tool_calls"},
        ),
        ModelRequest(parts=[ToolReturnPart("inspect", {"bytes": b"\x00\x01", "big": "x" * 100_000}, "call_1")]),
        ModelResponse(parts=[TextPart("done")]),
    ]
    store = make_store()
    await store.save(Conversation(conversation_id="c1", messages=list(messages)))
    loaded = await make_store().load("c1")
    assert loaded is not None
    assert ModelMessagesTypeAdapter.dump_json(loaded.messages) == ModelMessagesTypeAdapter.dump_json(messages)
    # What Pydantic AI reads back from its own JSON: the image as a BinaryImage, a tool's raw bytes (a field typed
    # Any) as their base64 text.
    assert loaded.messages == ModelMessagesTypeAdapter.validate_json(ModelMessagesTypeAdapter.dump_json(messages))
    tool_return = loaded.messages[2].parts[0]
    assert isinstance(tool_return, ToolReturnPart)
    assert tool_return.content["bytes"] == "AAE="


async def test_each_entry_is_one_readable_chatkeep_message(make_store: StoreFactory, tenant: str) -> None:
    store = make_store()
    entries = await store.save(Conversation(conversation_id="c1", messages=TURNS[0] + TURNS[1]))
    stored = await store.store.load(SessionKey(tenant, "c1"))
    assert [m.message_id for m in stored] == [e.id for e in entries]
    assert [(m.role, m.text) for m in stored] == [
        ("user", "question 0"),
        ("assistant", "answer 0"),
        ("user", "question 1"),
        ("assistant", "answer 1"),
    ]
    assert (await store.read_entry(entries[2].id)).message == TURNS[1][0]
    with pytest.raises(LookupError):
        await make_store().read_history("not-an-entry")


async def test_concurrent_writers_on_other_instances_lose_nothing_and_duplicate_nothing(
    make_store: StoreFactory,
) -> None:
    await saved(make_store(), "c1", 0)
    for round_ in range(3):
        writers = [make_store() for _ in range(4)]
        loaded = [await w.load("c1") for w in writers]

        async def write(
            store: ChatkeepConversationStore, conversation: Conversation | None, n: int, round_: int = round_
        ) -> bool:
            assert conversation is not None
            conversation.messages += [ModelRequest(parts=[UserPromptPart(content=f"round {round_} writer {n}")])]
            return not await conflicts(store.save(conversation))

        won = await asyncio.gather(*(write(w, c, n) for n, (w, c) in enumerate(zip(writers, loaded, strict=True))))
        assert sum(won) == 1
    final = await make_store().load("c1")
    assert final is not None
    rounds = [t for t in texts(final.messages) if t.startswith("round")]
    assert [t.split(" writer")[0] for t in rounds] == ["round 0", "round 1", "round 2"]
    assert texts(final.messages)[:2] == texts(TURNS[0])
    # The losers' entries stay in the session, between the winners': a window of the newest is read past them.
    window = await make_store().load("c1", limit=2)
    assert window is not None
    assert texts(window.messages) == texts(final.messages)[-2:]


async def test_a_session_another_writer_keeps_is_named_not_read(make_store: StoreFactory, tenant: str) -> None:
    store = make_store()
    await store.store.save_session(SessionKey(tenant, "c1"), AgentSession(session_id="c1", tenant=tenant))
    with pytest.raises(MessageFormatError, match="did not write"):
        await store.load("c1")
