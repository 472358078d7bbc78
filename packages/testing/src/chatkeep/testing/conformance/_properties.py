"""Property tests of what users hand a store: any message, any id, any session state (with Hypothesis).

Each test draws its inputs at random, within what the public types accept (any unicode, lone surrogates
included; NULs; JSON of any shape; texts near ``max_message_bytes``), and asserts one of two outcomes:
stored and read back exactly, or refused with the :class:`~chatkeep.core.ChatkeepError` the contract names,
with nothing stored. Few examples per test (:data:`PROPERTY_SETTINGS`): every backend runs them, on real
servers, in every CI run; a failure prints the smallest input Hypothesis found.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import Any, TypeVar

import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatkeep.core import (
    MAX_ID_LENGTH,
    AgentSession,
    ChatkeepError,
    DataContent,
    FunctionCallContent,
    FunctionResultContent,
    InvalidSessionKeyError,
    Message,
    MessageFormatError,
    MessageTooLargeError,
    TextContent,
    UriContent,
    Usage,
    UsageContent,
)
from chatkeep.core.backend import HistoryStore, SessionKey, StoredSession
from chatkeep.testing.conformance._base import ConformanceBase, StoreKit

__all__ = ["PROPERTY_SETTINGS", "PropertyConformance", "for_all"]

T = TypeVar("T")

#: The limit the message properties open their store with: small, so records near it are cheap to make.
LIMIT = 4096

#: Few examples (each one is a round trip to a real server), no deadline (shared machines are slow), no example
#: database left in the backend's repository.
PROPERTY_SETTINGS = settings(
    max_examples=30,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


async def for_all(
    strategy: st.SearchStrategy[T],
    check: Callable[[T], Coroutine[Any, Any, None]],
    *,
    config: settings = PROPERTY_SETTINGS,
) -> None:
    """Await ``check(value)`` for values Hypothesis draws from ``strategy``; the smallest failing one is raised.

    Hypothesis runs in a worker thread and each check on the calling event loop (where the test's stores
    live), so a kit test stays a plain async test: a backend can override it with a strict ``xfail`` and
    ``super()``, as any other kit test.
    """
    loop = asyncio.get_running_loop()

    @config
    @given(strategy)
    def run(value: T) -> None:
        asyncio.run_coroutine_threadsafe(check(value), loop).result()

    await asyncio.to_thread(run)


_surrogates = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2)
#: Any unicode (NULs and other controls, astral planes, combining marks), now and then with a lone surrogate.
_text = st.one_of(st.text(max_size=40), st.text(max_size=40).flatmap(lambda s: _surrogates.map(lambda x: s + x)))


def _near(limit: int) -> st.SearchStrategy[str]:
    """Texts whose UTF-8 size is close to ``limit`` (one repeated character, 1 to 4 bytes, maybe escaped in JSON)."""
    return st.tuples(st.characters(exclude_categories=["Cs"]), st.integers(limit - 700, limit + 50)).map(
        lambda drawn: drawn[0] * (drawn[1] // len(drawn[0].encode()))
    )


_json: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_contents = st.one_of(
    st.builds(TextContent, text=st.one_of(_text, _near(LIMIT))),
    st.builds(FunctionCallContent, call_id=_text, name=_text, arguments=_json.map(json.dumps)),
    st.builds(FunctionResultContent, call_id=_text, result=_json, is_error=st.booleans()),
    st.builds(DataContent, data=st.text(max_size=40), media_type=_text),
    st.builds(UriContent, uri=_text, media_type=st.none() | _text),
    st.builds(
        UsageContent,
        usage=st.builds(Usage, input_tokens=st.integers(0, 2**31), output_tokens=st.integers(0, 2**31)),
    ),
)
_offsets = st.integers(-14 * 60, 14 * 60).map(lambda minutes: timezone(timedelta(minutes=minutes)))
_created = st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1), timezones=_offsets)


@st.composite
def _messages(draw: st.DrawFn) -> Message:
    fields: dict[str, Any] = {
        "role": draw(st.sampled_from(["system", "user", "assistant", "tool"])),
        "contents": draw(st.lists(_contents, max_size=3)),
        "author_name": draw(st.none() | _text),
        "additional_properties": draw(st.dictionaries(st.text(max_size=8), _json, max_size=3)),
    }
    if draw(st.booleans()):
        fields["created_at"] = draw(_created)
    if draw(st.integers(0, 4)) == 0:  # a caller's own ids, maybe repeated in the batch (pydantic checks their form)
        fields["message_id"] = draw(st.sampled_from(["same", "ïd 😀", "a\x00b"]) | st.text(min_size=1, max_size=40))
    return Message(**fields)


def _ids() -> st.SearchStrategy[str]:
    """Ids of any unicode, lone surrogates and the empty string included, and lengths around the 1,024 limit."""
    long = st.tuples(st.characters(), st.integers(MAX_ID_LENGTH - 2, MAX_ID_LENGTH + 2)).map(lambda d: d[0] * d[1])
    return st.one_of(_text, long)


def _valid_id(value: str) -> bool:
    """The contract's rule: non-empty, at most 1,024 characters, encodable as UTF-8 (no lone surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return 0 < len(value) <= MAX_ID_LENGTH


def _expected_error(batch: list[Message]) -> type[ChatkeepError] | None:
    """The error the contract requires for ``batch``, judged on the messages alone (before any store)."""
    for message in batch:
        try:
            record = message.to_record()
        except MessageFormatError:
            return MessageFormatError
        if len(record.encode("utf-8")) > LIMIT:
            return MessageTooLargeError
    return None


@dataclass
class _Target:
    store: HistoryStore
    kit: StoreKit
    tenant: str


class PropertyConformance(ConformanceBase):
    """Random messages, ids and session state: an exact round trip, or the contract's error with nothing stored."""

    @pytest_asyncio.fixture(loop_scope="function")
    async def property_target(self, kit: StoreKit) -> _Target:
        """A store with ``max_message_bytes`` of :data:`LIMIT`, and a tenant the examples share (deleted after)."""
        return _Target(await kit.open(max_message_bytes=LIMIT), kit, kit.tenant("prop"))

    async def test_any_messages_round_trip_exactly_or_are_refused_whole(self, property_target: _Target) -> None:
        await for_all(st.lists(_messages(), min_size=1, max_size=4), partial(_check_messages, property_target))

    async def test_any_tenant_and_session_id_round_trips_or_is_refused(self, property_target: _Target) -> None:
        await for_all(st.tuples(_ids(), _ids()), partial(_check_ids, property_target))

    async def test_any_session_state_round_trips_or_is_refused(self, property_target: _Target) -> None:
        states = st.tuples(st.dictionaries(_text, _json, max_size=4), st.none() | _text)
        await for_all(states, partial(_check_state, property_target))

    async def test_any_wrong_argument_is_refused_with_a_chatkeep_error(self, property_target: _Target) -> None:
        """Every public call, given a wrong type or a value out of range, raises a ChatkeepError and changes nothing."""
        key = SessionKey(property_target.tenant, f"s-{uuid.uuid4().hex}")
        assert await property_target.store.append(key, [Message(role="user", text="kept")]) == 1
        calls = st.sampled_from(sorted(_WRONG_CALLS))
        # Many examples: most are refused before any I/O, and there are many calls and kinds of values to pair.
        config = settings(PROPERTY_SETTINGS, max_examples=300)
        await for_all(st.tuples(calls, _wrong), partial(_check_wrong_argument, property_target, key), config=config)


async def _check_messages(property_target: _Target, batch: list[Message]) -> None:
    store, key = property_target.store, SessionKey(property_target.tenant, f"s-{uuid.uuid4().hex}")
    before = Message(role="user", text="already stored")
    assert await store.append(key, [before]) == 1
    expected = _expected_error(batch)
    if expected is not None:
        try:
            await store.append(key, batch)
        except expected:
            pass
        else:
            raise AssertionError(f"append stored a batch the contract refuses with {expected.__name__}")
        assert await store.count(key) == 1, "a refused append stored part of its batch"
        assert [m.to_record() for m in await store.load(key)] == [before.to_record()]
        return
    first: dict[str, Message] = {}  # the first message of each id: a repeated id is a retry
    for message in batch:
        first.setdefault(message.message_id, message)
    assert await store.append(key, batch) == len(first)
    for reader in (store, await property_target.kit.open(max_message_bytes=LIMIT)):
        loaded = await reader.load(key)
        assert [m.to_record() for m in loaded] == [m.to_record() for m in (before, *first.values())]
        assert loaded == [before, *first.values()]
    assert await store.append(key, batch) == 0, "a retry of the same batch stored something twice"


async def _check_ids(property_target: _Target, ids: tuple[str, str]) -> None:
    tenant_suffix, session_id = ids
    # The tenant starts with one of the kit's own, so whatever the suffix, the kit can find and delete it.
    tenant = property_target.tenant + tenant_suffix
    if not (_valid_id(tenant) and _valid_id(session_id)):
        try:
            SessionKey(tenant, session_id)
        except InvalidSessionKeyError:
            return
        raise AssertionError(f"SessionKey accepted an invalid id (tenant {tenant!r}, session id {session_id!r})")
    property_target.kit.remember_tenant(tenant)
    store, key = property_target.store, SessionKey(tenant, session_id)
    message = Message(role="user", text=f"to {session_id[:40]}")
    assert await store.append(key, [message]) == 1
    assert await store.load(key) == [message]
    page = await store.list_sessions(tenant)
    assert [(info.tenant, info.session_id, info.message_count) for info in page.items] == [(tenant, session_id, 1)]
    session = AgentSession(session_id=session_id, tenant=tenant, state={"id": session_id})
    version = await store.save_session(key, session)
    assert await store.load_session(key) == StoredSession(session, version)
    assert await store.delete(key)
    assert await store.count(key) == 0


async def _check_state(property_target: _Target, drawn: tuple[dict[str, Any], str | None]) -> None:
    state, service_session_id = drawn
    store, key = property_target.store, SessionKey(property_target.tenant, f"s-{uuid.uuid4().hex}")
    session = AgentSession(
        session_id=key.session_id, tenant=key.tenant, service_session_id=service_session_id, state=state
    )
    if not _encodable({"service_session_id": service_session_id, "state": state}):
        # A lone surrogate somewhere: no store can keep it as text, so it is refused and nothing is stored.
        try:
            await store.save_session(key, session)
        except ChatkeepError:
            pass
        else:
            raise AssertionError("save_session stored a session holding a lone surrogate")
        assert await store.load_session(key) is None, "a refused session document was stored"
        return
    version = await store.save_session(key, session)
    for reader in (store, await property_target.kit.open()):
        assert await reader.load_session(key) == StoredSession(session, version)


def _encodable(document: object) -> bool:
    """Whether ``document``'s JSON has a UTF-8 form (no lone surrogate in any string)."""
    try:
        json.dumps(document, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


#: Values of every kind: each call below is given those its parameter does not take (the others are skipped).
_wrong: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.integers(),
    st.floats(),
    st.text(max_size=6),
    st.binary(max_size=6),
    st.lists(st.integers() | st.text(max_size=3), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.tuples(st.text(max_size=3), st.text(max_size=3)),
    st.datetimes(),
    st.timedeltas(max_value=-timedelta(microseconds=1)),  # a negative age would prune every session
    st.just(Message(role="user", text="a lone message")),
    st.builds(object),
)
_Call = Callable[[HistoryStore, SessionKey, Any], Coroutine[Any, Any, Any]]


def _is_count(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _is_messages(value: Any) -> bool:
    """An iterable of messages (an empty one too: nothing to store), which is not a string or a lone message."""
    if isinstance(value, (str, bytes, Message)) or not hasattr(value, "__iter__"):
        return False
    return all(isinstance(item, Message) for item in value)


async def _drain(store: HistoryStore, key: SessionKey, batch: Any) -> None:
    async for _ in store.iter_messages(key, batch=batch):
        pass


_KEPT = [Message(role="user", text="appended by a wrong call")]
_LONG_AGO = timedelta(days=36500)
#: name -> (the call with the wrong value in one place, whether that value is in fact valid there).
_WRONG_CALLS: dict[str, tuple[_Call, Callable[[Any], bool]]] = {
    "append(key=)": (lambda s, k, w: s.append(w, _KEPT), lambda w: False),
    "append(messages=)": (lambda s, k, w: s.append(k, w), _is_messages),
    "load(key=)": (lambda s, k, w: s.load(w), lambda w: False),
    "load(last=)": (lambda s, k, w: s.load(k, last=w), lambda w: w is None or _is_count(w, 0)),
    "iter_messages(batch=)": (lambda s, k, w: _drain(s, k, w), lambda w: _is_count(w, 1)),
    "count(key=)": (lambda s, k, w: s.count(w), lambda w: False),
    "delete(key=)": (lambda s, k, w: s.delete(w), lambda w: False),
    "pop(key=)": (lambda s, k, w: s.pop(w), lambda w: False),
    "trim(keep_last=)": (lambda s, k, w: s.trim(k, w), lambda w: _is_count(w, 0)),
    "list_sessions(tenant=)": (lambda s, k, w: s.list_sessions(w), lambda w: isinstance(w, str) and _valid_id(w)),
    "list_sessions(limit=)": (lambda s, k, w: s.list_sessions(k.tenant, limit=w), lambda w: _is_count(w, 1)),
    "list_sessions(cursor=)": (lambda s, k, w: s.list_sessions(k.tenant, cursor=w), lambda w: w is None),
    "prune(older_than=)": (lambda s, k, w: s.prune(older_than=w, tenant=k.tenant), lambda w: False),
    "prune(tenant=)": (
        lambda s, k, w: s.prune(older_than=_LONG_AGO, tenant=w),
        lambda w: w is None or (isinstance(w, str) and _valid_id(w)),
    ),
    "delete_tenant(tenant=)": (lambda s, k, w: s.delete_tenant(w), lambda w: isinstance(w, str) and _valid_id(w)),
    "save_session(key=)": (lambda s, k, w: s.save_session(w, AgentSession(tenant=k.tenant)), lambda w: False),
    "save_session(session=)": (lambda s, k, w: s.save_session(k, w), lambda w: False),
    "save_session(expected_version=)": (
        lambda s, k, w: s.save_session(k, AgentSession(tenant=k.tenant), expected_version=w),
        lambda w: w is None or isinstance(w, str),  # None writes; a string is checked against the stored version
    ),
    "save_session(owner=)": (
        lambda s, k, w: s.save_session(k, AgentSession(tenant=k.tenant), owner=w),
        lambda w: w is None or (isinstance(w, str) and _valid_id(w)),
    ),
    "load_session(key=)": (lambda s, k, w: s.load_session(w), lambda w: False),
    "load_session(owner=)": (
        lambda s, k, w: s.load_session(k, owner=w),
        lambda w: w is None or (isinstance(w, str) and _valid_id(w)),
    ),
}


async def _check_wrong_argument(property_target: _Target, key: SessionKey, drawn: tuple[str, Any]) -> None:
    name, wrong = drawn
    call, valid = _WRONG_CALLS[name]
    if valid(wrong):
        return  # not a wrong value for this parameter
    store = property_target.store
    try:
        await call(store, key, wrong)
    except ChatkeepError:
        pass
    else:
        raise AssertionError(f"{name} accepted {wrong!r}: it must raise a ChatkeepError naming what to pass")
    assert [m.text for m in await store.load(key)] == ["kept"], f"{name} with {wrong!r} changed the session"
    assert await store.load_session(key) is None, f"{name} with {wrong!r} stored a session document"
