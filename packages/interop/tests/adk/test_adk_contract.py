"""The behaviours ADK's own session-service tests hold every ``BaseSessionService`` to, checked on the adapter.

google-adk's source distribution ships no tests (2.13.0 holds its package only), so they cannot be run from
it as the Agents SDK's and LangChain's are (``packages/interop/tests/peers``). These are the same checks,
written here, one per behaviour of ADK's ``tests/unittests/sessions/test_session_service.py`` that concerns
the service's contract (the rest test ``DatabaseSessionService``'s SQLAlchemy internals): reads of a missing
session, create/get/delete, listing per user and for all users, state scopes (``app:``, ``user:``,
``temp:``, session), ids per user, an existing id, bytes and every event field round trip, the update time,
the stale-session check (also two writers racing), a drifted float time, ``GetSessionConfig``, partial
events, ``get_user_state``, padded ids and re-delivered events. Each runs on memory, SQLite, PostgreSQL and
Redis.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timezone

import pytest
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events import Event, EventActions
from google.adk.sessions import Session
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types

from chatkeep.interop.adk import ChatkeepSessionService

ServiceFactory = Callable[[], ChatkeepSessionService]
APP = "my_app"


def _now() -> float:
    return datetime.now(timezone.utc).timestamp()


async def _got(service: ChatkeepSessionService, user: str, session_id: str, **config: object) -> Session:
    found = await service.get_session(
        app_name=APP, user_id=user, session_id=session_id, config=GetSessionConfig(**config) if config else None
    )
    assert found is not None
    return found


async def test_a_missing_session_reads_as_none(service: ChatkeepSessionService) -> None:
    assert await service.get_session(app_name=APP, user_id="u", session_id="123") is None


async def test_create_get_and_delete(service: ChatkeepSessionService) -> None:
    created = await service.create_session(app_name=APP, user_id="u", state={"key": "value"})
    assert (created.app_name, created.user_id, created.state) == (APP, "u", {"key": "value"})
    assert created.id
    assert created.last_update_time <= _now()
    assert await _got(service, "u", created.id) == created
    await service.delete_session(app_name=APP, user_id="u", session_id=created.id)
    assert await service.get_session(app_name=APP, user_id="u", session_id=created.id) is None
    await service.delete_session(app_name=APP, user_id="u", session_id=created.id)  # gone already: no error


async def test_sessions_listed_for_a_user_and_for_all_users(service: ChatkeepSessionService) -> None:
    for user, session_id in (("u1", "1a"), ("u1", "1b"), ("u2", "2a")):
        await service.create_session(app_name=APP, user_id=user, session_id=session_id, state={"key": session_id})
    ones = (await service.list_sessions(app_name=APP, user_id="u1")).sessions
    assert {s.id: s.state for s in ones} == {"1a": {"key": "1a"}, "1b": {"key": "1b"}}
    assert [s.id for s in (await service.list_sessions(app_name=APP, user_id="u2")).sessions] == ["2a"]
    everyone = (await service.list_sessions(app_name=APP, user_id=None)).sessions
    assert {s.id: s.state for s in everyone} == {"1a": {"key": "1a"}, "1b": {"key": "1b"}, "2a": {"key": "2a"}}
    assert all(not s.events for s in everyone)
    assert (await service.list_sessions(app_name="no_app", user_id="u1")).sessions == []


async def test_sessions_are_listed_oldest_update_first(service: ChatkeepSessionService) -> None:
    first = await service.create_session(app_name=APP, user_id="u", session_id="first")
    await service.create_session(app_name=APP, user_id="u", session_id="second")
    await service.append_event(first, Event(author="user", timestamp=_now() + 100))
    assert [s.id for s in (await service.list_sessions(app_name=APP, user_id="u")).sessions] == ["second", "first"]


async def test_app_state_is_shared_by_every_user_of_the_app(service: ChatkeepSessionService) -> None:
    one = await service.create_session(app_name=APP, user_id="u1", session_id="s1", state={"app:k1": "v1"})
    await service.append_event(one, Event(author="user", actions=EventActions(state_delta={"app:k2": "v2"})))
    two = await service.create_session(app_name=APP, user_id="u2", session_id="s2")
    assert two.state == {"app:k1": "v1", "app:k2": "v2"}
    again = await _got(service, "u1", "s1")
    assert (again.state["app:k1"], again.state["app:k2"]) == ("v1", "v2")


async def test_user_state_is_shared_by_that_users_sessions_only(service: ChatkeepSessionService) -> None:
    one = await service.create_session(app_name=APP, user_id="u1", session_id="s1", state={"user:k1": "v1"})
    await service.append_event(one, Event(author="user", actions=EventActions(state_delta={"user:k2": "v2"})))
    assert (await service.create_session(app_name=APP, user_id="u1", session_id="s1b")).state == {
        "user:k1": "v1",
        "user:k2": "v2",
    }
    assert (await service.create_session(app_name=APP, user_id="u2", session_id="s2")).state == {}


async def test_session_state_is_the_sessions_own(service: ChatkeepSessionService) -> None:
    one = await service.create_session(app_name=APP, user_id="u1", session_id="s1", state={"sk1": "v1"})
    await service.append_event(one, Event(author="user", actions=EventActions(state_delta={"sk2": "v2"})))
    assert (await _got(service, "u1", "s1")).state == {"sk1": "v1", "sk2": "v2"}
    assert (await service.create_session(app_name=APP, user_id="u1", session_id="s1b")).state == {}


async def test_temp_state_lives_in_the_invocation_only(service: ChatkeepSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u1", session_id="s1")
    first = Event(author="agent1", actions=EventActions(state_delta={"temp:k1": "v1", "sk": "v2"}))
    await service.append_event(session, first)
    assert (session.state["temp:k1"], session.state["sk"]) == ("v1", "v2")  # the next agent reads it
    assert first.actions.state_delta == {"sk": "v2"}  # but the event keeps no temp key
    stored = await _got(service, "u1", "s1")
    assert stored.state == {"sk": "v2"}
    assert stored.events[0].actions.state_delta == {"sk": "v2"}


async def test_a_session_id_is_per_user(service: ChatkeepSessionService) -> None:
    one = await service.create_session(app_name=APP, user_id="u1", session_id="s1")
    await service.append_event(one, Event(author="user"))
    await service.create_session(app_name=APP, user_id="u2", session_id="s1")
    other = await _got(service, "u2", "s1")
    assert (other.user_id, other.events) == ("u2", [])


async def test_an_existing_id_cannot_be_created_again(make_service: ServiceFactory) -> None:
    await make_service().create_session(app_name=APP, user_id="u", session_id="existing")
    with pytest.raises(AlreadyExistsError):
        await make_service().create_session(app_name=APP, user_id="u", session_id="existing")
    # Two creators at once, each with a store of its own: one wins.
    results = await asyncio.gather(
        *(make_service().create_session(app_name=APP, user_id="u", session_id="raced") for _ in range(4)),
        return_exceptions=True,
    )
    assert sum(isinstance(result, Session) for result in results) == 1
    assert all(isinstance(result, (Session, AlreadyExistsError)) for result in results)


async def test_bytes_round_trip(service: ChatkeepSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    content = types.Content(role="user", parts=[types.Part.from_bytes(data=b"test_image_data", mime_type="image/png")])
    grounding = types.GroundingMetadata(search_entry_point=types.SearchEntryPoint(sdk_blob=b"test_sdk_blob"))
    await service.append_event(session, Event(author="user", content=content, grounding_metadata=grounding))
    [event] = (await _got(service, "u", session.id)).events
    assert (event.content, event.grounding_metadata) == (content, grounding)


async def test_every_event_field_round_trips(service: ChatkeepSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    event = Event(
        invocation_id="invocation",
        author="user",
        content=types.Content(role="user", parts=[types.Part(text="test_text")]),
        turn_complete=True,
        partial=False,
        actions=EventActions(artifact_delta={"file": 0}, transfer_to_agent="agent", escalate=True),
        long_running_tool_ids={"tool1"},
        error_code="error_code",
        error_message="error_message",
        interrupted=True,
        grounding_metadata=types.GroundingMetadata(web_search_queries=["query1"]),
        usage_metadata=types.GenerateContentResponseUsageMetadata(
            prompt_token_count=1, candidates_token_count=1, total_token_count=2
        ),
        citation_metadata=types.CitationMetadata(),
        custom_metadata={"custom_key": "custom_value"},
        timestamp=1700000000.123,
        input_transcription=types.Transcription(text="input transcription", finished=True),
        output_transcription=types.Transcription(text="output transcription", finished=True),
    )
    await service.append_event(session, event)
    assert await _got(service, "u", session.id) == session


async def test_the_update_time_is_the_newest_events(service: ChatkeepSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    created = session.last_update_time
    await service.append_event(session, Event(author="user", timestamp=created + 10))
    assert session.last_update_time == pytest.approx(created + 10, abs=1e-6)
    assert (await _got(service, "u", session.id)).last_update_time == pytest.approx(created + 10, abs=1e-6)


async def test_a_stale_session_is_refused(service: ChatkeepSessionService) -> None:
    now = _now()
    original = await service.create_session(app_name=APP, user_id="u")
    await service.append_event(
        original,
        Event(invocation_id="inv1", author="user", timestamp=now + 1, actions=EventActions(state_delta={"sk1": "v1"})),
    )
    updated = await _got(service, "u", original.id)
    await service.append_event(
        updated,
        Event(invocation_id="inv2", author="user", timestamp=now + 2, actions=EventActions(state_delta={"sk2": "v2"})),
    )
    assert original.last_update_time < updated.last_update_time
    third = Event(
        invocation_id="inv3", author="user", timestamp=now + 3, actions=EventActions(state_delta={"sk3": "v3"})
    )
    with pytest.raises(StaleSessionError, match="modified in storage"):
        await service.append_event(original, third)
    assert isinstance(StaleSessionError("x"), ValueError)  # ADK's callers catch ValueError
    final = await _got(service, "u", original.id)
    assert [e.invocation_id for e in final.events] == ["inv1", "inv2"]
    assert (final.state.get("sk1"), final.state.get("sk2"), final.state.get("sk3")) == ("v1", "v2", None)


async def test_two_copies_of_one_revision_racing_one_wins(service: ChatkeepSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    rounds = 8
    for i in range(rounds):
        latest = await _got(service, "u", session.id)
        first, second = latest.model_copy(deep=True), latest.model_copy(deep=True)
        base = latest.last_update_time + 10.0
        results = await asyncio.gather(
            service.append_event(
                first, Event(author="user", timestamp=base + 1, actions=EventActions(state_delta={f"sk{i}-1": 1}))
            ),
            service.append_event(
                second, Event(author="user", timestamp=base + 2, actions=EventActions(state_delta={f"sk{i}-2": 2}))
            ),
            return_exceptions=True,
        )
        errors = [result for result in results if isinstance(result, Exception)]
        assert len(errors) == 1
        assert isinstance(errors[0], StaleSessionError)
    final = await _got(service, "u", session.id)
    assert len(final.events) == rounds
    for i in range(rounds):
        assert (f"sk{i}-1" in final.state) != (f"sk{i}-2" in final.state)


async def test_a_drifted_float_time_of_a_current_session_is_no_staleness(service: ChatkeepSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u", session_id="s1")
    first = Event(invocation_id="inv1", author="user", timestamp=session.last_update_time + 10)
    await service.append_event(session, first)
    session.last_update_time -= 0.0001  # a float round trip elsewhere; the session still holds the newest event
    await service.append_event(session, Event(invocation_id="inv2", author="user", timestamp=first.timestamp + 10))
    assert [e.invocation_id for e in (await _got(service, "u", "s1")).events] == ["inv1", "inv2"]


async def test_an_event_appended_to_a_deleted_session_is_refused(service: ChatkeepSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u", session_id="gone")
    await service.delete_session(app_name=APP, user_id="u", session_id="gone")
    with pytest.raises(SessionNotFoundError):
        await service.append_event(session, Event(author="user"))


async def test_get_session_config(service: ChatkeepSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    for i in range(1, 6):
        await service.append_event(session, Event(author="user", timestamp=i))
    assert len((await _got(service, "u", session.id)).events) == 5
    assert (await _got(service, "u", session.id, num_recent_events=0)).events == []
    recent = (await _got(service, "u", session.id, num_recent_events=3)).events
    assert [e.timestamp for e in recent] == [3, 4, 5]
    assert [e.timestamp for e in (await _got(service, "u", session.id, after_timestamp=4.0)).events] == [4, 5]
    assert (await _got(service, "u", session.id, after_timestamp=50.0)).events == []
    both = (await _got(service, "u", session.id, after_timestamp=4.0, num_recent_events=3)).events
    assert [e.timestamp for e in both] == [4, 5]


async def test_partial_events_are_not_stored(service: ChatkeepSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    await service.append_event(session, Event(author="user", partial=True))
    assert session.events == []
    assert (await _got(service, "u", session.id)).events == []


async def test_user_state_read_without_a_session(service: ChatkeepSessionService) -> None:
    assert await service.get_user_state(app_name=APP, user_id="u1") == {}
    session = await service.create_session(app_name=APP, user_id="u1")
    for delta in ({"user:profile": {"name": "Alice"}, "session_key": 1}, {"user:counter": 1}, {"user:counter": 2}):
        await service.append_event(session, Event(author="system", actions=EventActions(state_delta=delta)))
    assert await service.get_user_state(app_name=APP, user_id="u1") == {"profile": {"name": "Alice"}, "counter": 2}
    assert await service.get_user_state(app_name=APP, user_id="u2") == {}
    assert await service.get_user_state(app_name="other_app", user_id="u1") == {}


async def test_padded_ids_read_and_delete_the_session(service: ChatkeepSessionService) -> None:
    created = await service.create_session(app_name=APP, user_id="u", session_id="  padded  ")
    assert created.id == "padded"
    assert (await _got(service, "u", " padded ")).id == "padded"
    await service.delete_session(app_name=APP, user_id="u", session_id="padded ")
    assert await service.get_session(app_name=APP, user_id="u", session_id="padded") is None


async def test_an_event_delivered_again_is_kept_once(service: ChatkeepSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    event = Event(author="user", actions=EventActions(state_delta={"n": 1}))
    await service.append_event(session, event)
    await service.append_event(session, event.model_copy(deep=True))
    assert len(session.events) == 1
    assert len((await _got(service, "u", session.id)).events) == 1


async def test_rich_state_values_are_stored_as_json(service: ChatkeepSessionService) -> None:
    when = datetime(2026, 12, 3, tzinfo=timezone.utc)
    session = await service.create_session(app_name=APP, user_id="u")
    await service.append_event(session, Event(author="user", actions=EventActions(state_delta={"when": when})))
    assert (await _got(service, "u", session.id)).state["when"] == "2026-12-03T00:00:00Z"
