"""ChatkeepSessionService's own guarantees, beyond ADK's tests: writers in other processes, an interrupted append,
windowed reads, the events kept exactly, and what chatkeep's own tools see."""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.events import Event, EventActions
from google.adk.sessions import Session
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types

from chatkeep.core import (
    AgentSession,
    Message,
    SessionKey,
    SessionPage,
    StoredSession,
    StoreUnavailableError,
    UnsupportedOperationError,
    open_store,
)
from chatkeep.interop.adk import ChatkeepSessionService
from chatkeep.interop.adk._layout import app_key, session_key
from chatkeep.memory import MemoryHistoryStore

ServiceFactory = Callable[[], ChatkeepSessionService]

APP, USER = "weather-app", "user-1"


def _event(text: str, *, author: str = "user", timestamp: float | None = None, **delta: object) -> Event:
    role = "user" if author == "user" else "model"
    extra = {} if timestamp is None else {"timestamp": timestamp}
    return Event(
        invocation_id="inv",
        author=author,
        content=types.Content(role=role, parts=[types.Part(text=text)]),
        actions=EventActions(state_delta=dict(delta)),
        **extra,
    )


async def _get(service: ChatkeepSessionService, session_id: str, **config: object) -> Session:
    session = await service.get_session(
        app_name=APP, user_id=USER, session_id=session_id, config=GetSessionConfig(**config) if config else None
    )
    assert session is not None
    return session


async def test_writers_with_stores_of_their_own_lose_and_duplicate_nothing(make_service: ServiceFactory) -> None:
    # Four writers, each with a store of its own (as four processes), append to one session: a writer whose
    # session went stale gets ADK's ValueError, reloads and tries again, as ADK's runner would be made to.
    await make_service().create_session(app_name=APP, user_id=USER, session_id="shared")
    writers, each = 4, 5

    async def writer(n: int) -> int:
        service, stale = make_service(), 0
        for i in range(each):
            while True:
                session = await _get(service, "shared")
                try:
                    await service.append_event(session, _event(f"w{n}-{i}", **{f"w{n}-{i}": i, f"user:w{n}": i}))
                    break
                except StaleSessionError:  # a ValueError, as ADK's runner expects
                    stale += 1
                    await asyncio.sleep(random.random() / 100)
        return stale

    conflicts = await asyncio.gather(*(writer(n) for n in range(writers)))
    final = await _get(make_service(), "shared")
    texts = [event.content.parts[0].text for event in final.events if event.content and event.content.parts]
    assert sorted(texts) == sorted(f"w{n}-{i}" for n in range(writers) for i in range(each))
    assert len({event.id for event in final.events}) == writers * each
    for n in range(writers):
        assert [text for text in texts if text.startswith(f"w{n}-")] == [f"w{n}-{i}" for i in range(each)]
        assert final.state[f"user:w{n}"] == each - 1
        assert all(final.state[f"w{n}-{i}"] == i for i in range(each))
    assert sum(conflicts) > 0  # they did meet


async def test_appends_through_one_session_object_follow_each_other(service: ChatkeepSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id=USER)
    events = [_event(f"e{i}", k=i) for i in range(6)]
    await asyncio.gather(*(service.append_event(session, event) for event in events))
    stored = await _get(service, session.id)
    assert [event.id for event in stored.events] == [event.id for event in session.events]
    assert sorted(event.id for event in stored.events) == sorted(event.id for event in events)


async def test_a_stale_session_is_refused_and_stores_nothing(make_service: ServiceFactory) -> None:
    first, second = make_service(), make_service()
    created = await first.create_session(app_name=APP, user_id=USER, session_id="s")
    mine, theirs = await _get(first, "s"), await _get(second, "s")
    await first.append_event(mine, _event("mine", k="mine"))
    with pytest.raises(StaleSessionError, match="modified in storage"):
        await second.append_event(theirs, _event("theirs", k="theirs"))
    stored = await _get(second, "s")
    assert [event.content.parts[0].text for event in stored.events] == ["mine"]
    assert stored.state == {"k": "mine"}
    assert created.last_update_time < stored.last_update_time


async def test_a_creator_stalled_before_the_first_shared_document_loses_no_update(
    make_service: ServiceFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The app's shared state has no document yet. The first creator finds none and stalls before making it; the
    # second makes it, applies its delta and returns. The stalled one's creation must then fail and re-read, not
    # write an empty document over the second's delta (the marker and 10 s wait of earlier releases lost app:b).
    first, second = make_service(), make_service()
    shared = app_key(first.tenant, APP)
    arrived, resume = asyncio.Event(), asyncio.Event()
    save = first.store.save_session

    async def stalled_save(key: SessionKey, session: AgentSession, **options: Any) -> str:
        if key == shared and not arrived.is_set():  # its first save of the shared state: the empty document
            arrived.set()
            await resume.wait()
        return await save(key, session, **options)

    monkeypatch.setattr(first.store, "save_session", stalled_save)
    stalled = asyncio.create_task(first.create_session(app_name=APP, user_id=USER, state={"app:a": 1}, session_id="a"))
    await asyncio.wait_for(arrived.wait(), 10)
    await second.create_session(app_name=APP, user_id=USER, state={"app:b": 2}, session_id="b")
    resume.set()
    await stalled
    for session_id in ("a", "b"):
        assert (await _get(make_service(), session_id)).state == {"app:a": 1, "app:b": 2}


async def test_concurrent_creators_of_one_shared_state_lose_no_delta(make_service: ServiceFactory) -> None:
    creators = 8
    await asyncio.gather(
        *(
            make_service().create_session(
                app_name=APP, user_id=USER, state={f"app:c{n}": n, f"user:c{n}": n}, session_id=f"s{n}"
            )
            for n in range(creators)
        )
    )
    state = (await _get(make_service(), "s0")).state
    assert state == {f"{scope}:c{n}": n for scope in ("app", "user") for n in range(creators)}


async def test_sessions_made_by_releases_with_creation_markers_read_as_before(make_service: ServiceFactory) -> None:
    # Earlier releases claimed a key by appending this marker before its first document: such a key still
    # reads, takes appends, and refuses a second create_session.
    service = make_service()
    marker = Message(role="system", text="ADK session created", message_id="adk.created")
    key = session_key(service.tenant, APP, USER, "old")
    await service.store.append(key, [marker])
    await service.store.append(app_key(service.tenant, APP), [marker])
    session = await service.create_session(app_name=APP, user_id=USER, state={"k": 0, "app:x": 1}, session_id="old")
    await service.append_event(session, _event("hello", k=1))
    read = await _get(make_service(), "old")
    assert [event.content.parts[0].text for event in read.events if event.content and event.content.parts] == ["hello"]
    assert read.state == {"k": 1, "app:x": 1}
    assert len((await _get(make_service(), "old", num_recent_events=1)).events) == 1
    with pytest.raises(AlreadyExistsError):
        await make_service().create_session(app_name=APP, user_id=USER, session_id="old")


def test_a_store_that_cannot_create_only_if_absent_is_refused_when_the_service_is_made(tenant: str) -> None:
    class Undeclared(MemoryHistoryStore):
        creates_if_absent = False

    with pytest.raises(UnsupportedOperationError, match="Undeclared does not declare creates_if_absent"):
        ChatkeepSessionService(Undeclared(namespace=f"adk-{tenant}"), tenant=tenant)


class _FailingAppends(MemoryHistoryStore):
    """A memory store whose message appends fail while ``failing`` (its documents are written as usual)."""

    failing = False

    async def append(self, key: SessionKey, messages: Sequence[Message], **kwargs: object) -> int:
        if self.failing:
            raise StoreUnavailableError("the server went away (injected by the test)")
        return await super().append(key, messages, **kwargs)  # type: ignore[arg-type]


async def test_an_append_interrupted_between_its_two_writes_is_completed(tenant: str) -> None:
    store = _FailingAppends(namespace=f"adk-{tenant}")
    service = ChatkeepSessionService(store, tenant=tenant)
    session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
    event = _event("hello", k=1, **{"app:shared": 2})
    store.failing = True
    with pytest.raises(StoreUnavailableError):
        await service.append_event(session, event)
    store.failing = False
    # The next reader finds the event in the session's document and stores it, with its shared state.
    read = await _get(service, "s")
    assert [e.id for e in read.events] == [event.id]
    assert read.state == {"k": 1, "app:shared": 2}
    assert await store.count(SessionKey(tenant, '["adk.session","weather-app","user-1","s"]')) == 1
    # Retrying the failed call with the session object it failed on succeeds too, and stores it once.
    await service.append_event(session, event)
    assert [e.id for e in (await _get(service, "s")).events] == [event.id]
    await service.append_event(session, _event("next"))
    assert len((await _get(service, "s")).events) == 2
    await store.close()


class _HeldCalls(MemoryHistoryStore):
    """A memory store that holds chosen calls until the test releases them: the append of the message of the
    event id in ``held_event`` (any writer's), and the reads of a user's shared state by tasks marked ``reader``
    after their first (the read of a read-modify-write)."""

    held_event: str | None = None

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.appending, self.append_released = asyncio.Event(), asyncio.Event()
        self.sharing, self.share_released = asyncio.Event(), asyncio.Event()
        self.reader: contextvars.ContextVar[bool] = contextvars.ContextVar("reader", default=False)
        self.reads = 0

    async def append(self, key: SessionKey, messages: Sequence[Message], **kwargs: object) -> int:
        if any(message.message_id == f"adk.event:{self.held_event}" for message in messages):
            self.appending.set()
            await self.append_released.wait()
        return await super().append(key, messages, **kwargs)  # type: ignore[arg-type]

    async def load_session(self, key: SessionKey, **options: Any) -> StoredSession | None:
        if self.reader.get() and key.session_id.startswith('["adk.user"'):
            self.reads += 1
            if self.reads > 1:
                self.sharing.set()
                await self.share_released.wait()
        return await super().load_session(key, **options)


async def test_a_reader_completing_an_append_late_does_not_undo_a_later_event(tenant: str) -> None:
    # A reader finds e1 in the document but not among the messages (its writer is between its two writes) and
    # completes it, applying e1's shared delta; it reads the shared state after the writer has stored e2.
    store = _HeldCalls(namespace=f"adk-{tenant}")
    writer, reader = ChatkeepSessionService(store, tenant=tenant), ChatkeepSessionService(store, tenant=tenant)
    session = await writer.create_session(app_name=APP, user_id=USER, session_id="s")
    first, second = _event("e1", **{"user:n": 1}), _event("e2", **{"user:n": 2})
    store.held_event = first.id
    writing = asyncio.create_task(writer.append_event(session, first))
    await store.appending.wait()  # e1's document and shared state are written, its message is held

    async def read() -> Session:
        store.reader.set(True)
        return await _get(reader, "s")

    reading = asyncio.create_task(read())
    await store.sharing.wait()  # the reader is about to read the user's state, to apply e1's delta to it
    store.append_released.set()
    await writing
    await writer.append_event(session, second)
    store.share_released.set()
    read_early = await reading
    assert [event.content.parts[0].text for event in read_early.events] == ["e1"]
    final = await _get(reader, "s")
    assert [event.content.parts[0].text for event in final.events] == ["e1", "e2"]
    assert final.state == {"user:n": 2}
    await store.close()


class _LaggingDocuments(MemoryHistoryStore):
    """A memory store whose next document read, once ``lag`` is set, answers as of the write before the newest: a
    read sent at once with the events' that an append's document write overtook."""

    lag = False

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.before: dict[SessionKey, StoredSession | None] = {}

    async def save_session(self, key: SessionKey, session: AgentSession, **options: Any) -> str:
        self.before[key] = await super().load_session(key)
        return await super().save_session(key, session, **options)

    async def load_session(self, key: SessionKey, **options: Any) -> StoredSession | None:
        if self.lag and self.before.get(key) is not None:
            self.lag = False
            return self.before[key]
        return await super().load_session(key, **options)


async def test_a_document_read_older_than_the_events_is_read_again(tenant: str) -> None:
    store = _LaggingDocuments(namespace=f"adk-{tenant}")
    service = ChatkeepSessionService(store, tenant=tenant)
    session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
    for n in range(2):
        await service.append_event(session, _event(f"e{n}", k=n))
    store.lag = True  # the document read beside the events answers as of e0, the events reach e1
    read = await _get(service, "s")
    assert not store.lag
    assert [event.content.parts[0].text for event in read.events] == ["e0", "e1"]  # e0 not taken again
    assert read.state == {"k": 1}
    await service.append_event(read, _event("e2", k=2))  # the session read is current
    assert [event.content.parts[0].text for event in (await _get(service, "s")).events] == ["e0", "e1", "e2"]
    await store.close()


class _NoTags(MemoryHistoryStore):
    """A memory store as a backend without tags answers (Blob, EncryptedStore): update_info and a tag refused."""

    async def update_info(self, key: SessionKey, **fields: object) -> bool:
        raise UnsupportedOperationError("update_info: this backend keeps no tags (injected by the test)")

    async def list_sessions(self, tenant: str = "default", *, tag: str | None = None, **kwargs: Any) -> SessionPage:
        if tag is not None:
            raise UnsupportedOperationError("list_sessions(tag=...): this backend keeps no tags (injected by the test)")
        return await super().list_sessions(tenant, **kwargs)


async def test_a_backend_without_tags_lists_by_walking_the_tenant(tenant: str) -> None:
    async with _NoTags(namespace=f"adk-{tenant}") as store, ChatkeepSessionService(store, tenant=tenant) as service:
        for user, session_id in (("u1", "a"), ("u2", "b")):
            await service.create_session(app_name=APP, user_id=user, session_id=session_id)
        await service.create_session(app_name="other-app", user_id="u1", session_id="c")
        assert [s.id for s in (await service.list_sessions(app_name=APP)).sessions] == ["a", "b"]
        assert [s.id for s in (await service.list_sessions(app_name=APP, user_id="u2")).sessions] == ["b"]


async def test_recent_events_and_events_after_a_time(service: ChatkeepSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id=USER, session_id="long")
    start = session.last_update_time
    for i in range(150):
        await service.append_event(session, _event(f"e{i}", timestamp=start + 1 + i))
    assert [e.content.parts[0].text for e in (await _get(service, "long", num_recent_events=3)).events] == [
        "e147",
        "e148",
        "e149",
    ]
    assert (await _get(service, "long", num_recent_events=0)).events == []
    after = (await _get(service, "long", after_timestamp=start + 1 + 10)).events
    assert [e.content.parts[0].text for e in after] == [f"e{i}" for i in range(10, 150)]  # past the first windows
    both = (await _get(service, "long", after_timestamp=start + 1 + 140, num_recent_events=5)).events
    assert [e.content.parts[0].text for e in both] == [f"e{i}" for i in range(145, 150)]
    assert len((await _get(service, "long")).events) == 150


async def test_events_are_kept_exactly_and_readable_by_chatkeep(store_url: str, tenant: str) -> None:
    async with open_store(store_url) as store, ChatkeepSessionService(store, tenant=tenant) as service:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="exact")
        call = Event(
            invocation_id="inv",
            author="weather_agent",
            content=types.Content(
                role="model",
                parts=[
                    types.Part(function_call=types.FunctionCall(id="c1", name="get_weather", args={"city": "Paris"}))
                ],
            ),
            long_running_tool_ids={"c1"},
            usage_metadata=types.GenerateContentResponseUsageMetadata(prompt_token_count=3, total_token_count=5),
            custom_metadata={"nested": {"ünïcode": ["\x00", 1.5]}},
        )
        result = Event(
            invocation_id="inv",
            author="weather_agent",
            content=types.Content(
                role="user",
                parts=[
                    types.Part(
                        function_response=types.FunctionResponse(id="c1", name="get_weather", response={"t": 21})
                    ),
                    types.Part.from_bytes(data=b"\x89PNG\x00", mime_type="image/png"),
                ],
            ),
        )
        answer = _event("Sunny, 21 degrees.", author="weather_agent")
        for event in (_event("Weather in Paris?"), call, result, answer):
            await service.append_event(session, event)
        assert await _get(service, "exact") == session
        stored = await store.load(SessionKey(tenant, '["adk.session","weather-app","user-1","exact"]'))
        assert [(m.role, m.text, m.author_name) for m in stored] == [
            ("user", "Weather in Paris?", "user"),
            ("assistant", "", "weather_agent"),
            ("tool", "", "weather_agent"),
            ("assistant", "Sunny, 21 degrees.", "weather_agent"),
        ]


async def test_sessions_are_listed_by_app_and_by_user(service: ChatkeepSessionService) -> None:
    for user, session_id in (("u1", "a"), ("u1", "b"), ("u2", "c")):
        await service.create_session(app_name=APP, user_id=user, session_id=session_id, state={"user:name": user})
    await service.create_session(app_name="other-app", user_id="u1", session_id="d")
    listed = (await service.list_sessions(app_name=APP, user_id="u1")).sessions
    assert [(s.id, s.user_id, s.events, s.state) for s in listed] == [
        ("a", "u1", [], {"user:name": "u1"}),
        ("b", "u1", [], {"user:name": "u1"}),
    ]
    assert sorted(s.id for s in (await service.list_sessions(app_name=APP)).sessions) == ["a", "b", "c"]
    await service.delete_session(app_name=APP, user_id="u1", session_id="a")
    assert [s.id for s in (await service.list_sessions(app_name=APP, user_id="u1")).sessions] == ["b"]
    assert await service.get_session(app_name=APP, user_id="u1", session_id="a") is None


async def test_ids_are_kept_apart_exactly(service: ChatkeepSessionService) -> None:
    # Ids holding the separators a naive key would use ('/', ':', quotes) never reach another session.
    pairs = [("a/b", "c"), ("a", "b/c"), ('a","b', "c"), ("a", "b")]
    for user, session_id in pairs:
        await service.create_session(
            app_name=APP, user_id=user, session_id=session_id, state={"who": user + session_id}
        )
    for user, session_id in pairs:
        got = await service.get_session(app_name=APP, user_id=user, session_id=session_id)
        assert got is not None
        assert got.state == {"who": user + session_id}
