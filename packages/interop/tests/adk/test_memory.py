"""ChatkeepMemoryService: ADK's memory on chatkeep's semantic recall (memory store; the offline embedder)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence

import pytest
from google.adk.events import Event
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.sessions import Session
from google.genai import types

from chatkeep.core import SearchUnsupportedError, default_embedder, open_store
from chatkeep.interop.adk import ChatkeepMemoryService

APP, USER = "notes-app", "user-1"
FACTS = [
    "The spare key hangs behind the kitchen door.",
    "My manager is called Priya.",
    "I am allergic to peanuts.",
    "The wifi password is on the fridge.",
]


def _session(session_id: str, texts: list[str]) -> Session:
    events = [
        Event(
            invocation_id="inv",
            author="user" if n % 2 == 0 else "assistant",
            content=types.Content(role="user" if n % 2 == 0 else "model", parts=[types.Part(text=text)]),
        )
        for n, text in enumerate(texts)
    ]
    events.append(Event(invocation_id="inv", author="assistant"))  # no content: nothing to remember
    return Session(id=session_id, app_name=APP, user_id=USER, events=events)


@pytest.fixture
async def memory() -> AsyncIterator[ChatkeepMemoryService]:
    async with ChatkeepMemoryService(f"memory://?namespace=adk-{uuid.uuid4().hex}", tenant="t") as service:
        yield service


def _texts(entries: list[MemoryEntry]) -> list[str]:
    return [part.text or "" for entry in entries for part in entry.content.parts or []]


async def test_a_question_finds_the_memory_that_answers_it_by_meaning(memory: ChatkeepMemoryService) -> None:
    session = _session("s1", FACTS)
    await memory.add_session_to_memory(session)
    await memory.add_session_to_memory(session)  # again: each event is remembered once
    found = (await memory.search_memory(app_name=APP, user_id=USER, query="where is the extra key?")).memories
    assert _texts(found)[0] == FACTS[0]
    assert len(found) == len(FACTS)
    first = found[0]
    assert first.author == "user"
    assert first.custom_metadata == {"session_id": "s1"}
    assert first.timestamp is not None
    # Who is the boss: no word in common with the fact.
    boss = (await memory.search_memory(app_name=APP, user_id=USER, query="who is my boss?")).memories
    assert _texts(boss)[0] == FACTS[1]


class _Counting:
    """The offline embedder, counting the texts it embeds."""

    def __init__(self) -> None:
        self.inner = default_embedder()
        self.name, self.dimensions = self.inner.name, self.inner.dimensions
        self.texts: list[str] = []

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.texts += texts
        return await self.inner.embed(texts)


async def test_adding_a_session_again_embeds_only_its_new_events() -> None:
    counting = _Counting()
    url = f"memory://?namespace=adk-{uuid.uuid4().hex}"
    async with ChatkeepMemoryService(url, tenant="t", embedder=counting) as memory:
        session = _session("s1", FACTS[:2])
        await memory.add_session_to_memory(session)
        await memory.add_session_to_memory(session)
        assert counting.texts == FACTS[:2]
        session.events += _session("s1", FACTS[2:3]).events
        await memory.add_session_to_memory(session)
        assert counting.texts == FACTS[:3]
        found = (await memory.search_memory(app_name=APP, user_id=USER, query="peanut allergy")).memories
        assert _texts(found)[0] == FACTS[2]


async def test_memories_stay_with_their_app_and_user(memory: ChatkeepMemoryService) -> None:
    await memory.add_session_to_memory(_session("s1", FACTS[:1]))
    for app, user in ((APP, "user-2"), ("other-app", USER)):
        assert (await memory.search_memory(app_name=app, user_id=user, query="spare key")).memories == []
    await memory.delete_memories(app_name=APP, user_id=USER)
    assert (await memory.search_memory(app_name=APP, user_id=USER, query="spare key")).memories == []


async def test_events_and_entries_added_directly(memory: ChatkeepMemoryService) -> None:
    [event] = _session("s2", ["I park on level 3 of the garage."]).events[:1]
    await memory.add_events_to_memory(
        app_name=APP, user_id=USER, events=[event], session_id="s2", custom_metadata={"source": "turn"}
    )
    entry = MemoryEntry(id="pref-1", content=types.Content(role="user", parts=[types.Part(text="I prefer tea.")]))
    await memory.add_memory(app_name=APP, user_id=USER, memories=[entry, entry])
    parked = (await memory.search_memory(app_name=APP, user_id=USER, query="where did I leave the car?")).memories
    assert _texts(parked)[0] == "I park on level 3 of the garage."
    assert parked[0].custom_metadata == {"source": "turn", "session_id": "s2"}
    drink = (await memory.search_memory(app_name=APP, user_id=USER, query="what drink do I like?")).memories
    assert drink[0] == entry
    assert len(drink) == 2


async def test_a_store_that_cannot_search_is_refused(tmp_path: object) -> None:
    store = open_store(f"sqlite:///{tmp_path}/plain.db")
    with pytest.raises(SearchUnsupportedError):
        ChatkeepMemoryService(store)
    await store.close()
