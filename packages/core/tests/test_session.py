"""AgentSession, its JSON form, typed provider state, and SessionKey validation."""

from __future__ import annotations

import json
import unicodedata
import uuid
from typing import Any

import pytest
from pydantic import BaseModel

from chatkeep.core import (
    DEFAULT_TENANT,
    AgentSession,
    InvalidSessionKeyError,
    ProviderSessionState,
    SessionFormatError,
    SessionKey,
    SessionOwnershipError,
)


def through_json(data: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(json.dumps(data))
    return result


def valid_payload(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "type": "session",
        "v": 1,
        "session_id": "s1",
        "tenant": "acme",
        "service_session_id": None,
        "state": {},
    }
    data.update(changes)
    return data


# -- AgentSession ---------------------------------------------------------------------------------


def test_defaults() -> None:
    session = AgentSession()

    assert session.tenant == DEFAULT_TENANT == "default"
    assert uuid.UUID(session.session_id)
    assert session.service_session_id is None
    assert session.state == {}
    assert AgentSession().session_id != session.session_id
    assert AgentSession().state is not session.state


def test_to_dict_is_json_safe_and_round_trips() -> None:
    session = AgentSession(
        session_id="chat-42 ☃",
        tenant="acme",
        service_session_id="resp_123",
        state={"memory": {"messages": [{"text": "hi\u0000"}], "n": 1.5, "ok": True, "none": None}},
    )

    data = session.to_dict()
    assert data["type"] == "session"
    assert data["v"] == 1
    back = AgentSession.from_dict(through_json(data))

    assert back == session
    assert (back.session_id, back.tenant, back.service_session_id) == ("chat-42 ☃", "acme", "resp_123")
    assert back.state == session.state


def test_to_dict_is_a_snapshot() -> None:
    session = AgentSession(state={"k": [1]})
    data = session.to_dict()

    session.state["k"].append(2)
    assert data["state"] == {"k": [1]}


def test_from_dict_copies_state() -> None:
    data = valid_payload(state={"provider": {"items": [1, 2]}})
    session = AgentSession.from_dict(data)

    data["state"]["provider"]["items"].append(3)
    data["state"]["other"] = 1
    assert session.state == {"provider": {"items": [1, 2]}}


def test_optional_fields_may_be_absent() -> None:
    session = AgentSession.from_dict({"type": "session", "v": 1, "session_id": "s1", "tenant": "t"})

    assert session.service_session_id is None
    assert session.state == {}


@pytest.mark.parametrize(
    ("value", "says"),
    [
        pytest.param({"k": {1, 2}}, "JSON values", id="set"),
        pytest.param({"k": object()}, "JSON values", id="object"),
        pytest.param({"k": float("nan")}, "JSON values", id="nan"),
        pytest.param({"k": b"bytes"}, "JSON values", id="bytes"),
    ],
)
def test_state_that_is_not_json_fails_to_dict(value: dict[str, Any], says: str) -> None:
    session = AgentSession(state=value)

    with pytest.raises(SessionFormatError, match=says):
        session.to_dict()


@pytest.mark.parametrize(
    ("data", "says"),
    [
        pytest.param(["not", "a", "dict"], "must be a dict, got list", id="list"),
        pytest.param('{"type": "session"}', "must be a dict, got str", id="json-text"),
        pytest.param(valid_payload(type="agent"), '"type" is \'agent\', expected "session"', id="wrong-type"),
        pytest.param({k: v for k, v in valid_payload().items() if k != "type"}, '"type" is None', id="no-type"),
        pytest.param({k: v for k, v in valid_payload().items() if k != "v"}, "version None", id="no-version"),
        pytest.param(valid_payload(v=2), "version 2.*upgrade chatkeep-core", id="newer-version"),
        pytest.param(valid_payload(v=True), "version True", id="bool-version"),
        pytest.param(valid_payload(v=1.0), "version 1.0", id="float-version"),
        pytest.param(valid_payload(v="1"), "version '1'", id="version-as-text"),
        pytest.param(
            {k: v for k, v in valid_payload().items() if k != "session_id"}, 'must have "session_id"', id="no-id"
        ),
        pytest.param({k: v for k, v in valid_payload().items() if k != "tenant"}, 'must have "tenant"', id="no-tenant"),
        pytest.param(valid_payload(session_id=42), '"session_id" must be a string, got int', id="id-int"),
        pytest.param(valid_payload(tenant=None), '"tenant" must be a string, got NoneType', id="tenant-none"),
        pytest.param(valid_payload(service_session_id=7), '"service_session_id" must be a string or null', id="svc"),
        pytest.param(valid_payload(state=[1]), '"state" must be a dict, got list', id="state-list"),
        pytest.param(valid_payload(state="{}"), '"state" must be a dict, got str', id="state-str"),
        pytest.param(valid_payload(owner="bob"), "unknown fields \\['owner'\\]", id="unknown-field"),
        pytest.param(valid_payload(session_id=""), "session_id must not be empty", id="empty-id"),
        pytest.param(valid_payload(tenant=""), "tenant must not be empty", id="empty-tenant"),
        pytest.param(valid_payload(session_id="x" * 1025), "session_id is 1,025 characters", id="long-id"),
        pytest.param(valid_payload(tenant="t" * 1025), "tenant is 1,025 characters", id="long-tenant"),
        pytest.param(valid_payload(session_id="a\ud800b"), "lone surrogate", id="surrogate-id"),
    ],
)
def test_from_dict_names_what_is_wrong(data: Any, says: str) -> None:
    with pytest.raises(SessionFormatError, match=says):
        AgentSession.from_dict(data)


def test_from_dict_refuses_another_tenants_session() -> None:
    data = AgentSession(session_id="s1", tenant="acme").to_dict()

    with pytest.raises(SessionOwnershipError, match="another tenant"):
        AgentSession.from_dict(data, tenant="evil-corp")
    with pytest.raises(SessionOwnershipError):
        AgentSession.from_dict(data, tenant="Acme")  # tenants are compared exactly
    # The error does not tell a caller which tenant owns the session.
    with pytest.raises(SessionOwnershipError) as caught:
        AgentSession.from_dict(data, tenant="evil-corp")
    assert "acme" not in str(caught.value)


def test_from_dict_accepts_the_matching_tenant() -> None:
    data = AgentSession(session_id="s1", tenant="acme", state={"k": 1}).to_dict()

    session = AgentSession.from_dict(data, tenant="acme")
    assert (session.session_id, session.tenant, session.state) == ("s1", "acme", {"k": 1})


def test_constructor_validates_ids() -> None:
    with pytest.raises(InvalidSessionKeyError, match="session_id must not be empty"):
        AgentSession(session_id="")
    with pytest.raises(InvalidSessionKeyError, match="tenant is 1,025 characters"):
        AgentSession(tenant="t" * 1025)
    assert AgentSession(session_id="x" * 1024).session_id == "x" * 1024


# -- ProviderSessionState -------------------------------------------------------------------------


class Counter(BaseModel):
    turns: int = 0
    names: list[str] = []


def test_pydantic_state_initializer_called_when_absent() -> None:
    calls: list[AgentSession | None] = []

    def initial(session: AgentSession | None) -> Counter:
        calls.append(session)
        return Counter(turns=10)

    state = ProviderSessionState(Counter, state_key="counter", initializer=initial)
    session = AgentSession()

    assert state.get_or_initialize(session) == Counter(turns=10)
    assert calls == [session]
    assert state.get_or_initialize(None) == Counter(turns=10)
    assert calls == [session, None]


def test_pydantic_state_default_initializer_uses_the_type() -> None:
    state = ProviderSessionState(Counter, state_key="counter")

    assert state.get_or_initialize(AgentSession()) == Counter()


def test_pydantic_state_round_trips_through_to_dict() -> None:
    calls: list[AgentSession | None] = []

    def initial(session: AgentSession | None) -> Counter:
        calls.append(session)
        return Counter()

    state = ProviderSessionState(Counter, state_key="counter", initializer=initial)
    session = AgentSession()

    state.save(session, Counter(turns=3, names=["Zoë"]))
    assert session.state["counter"] == {"turns": 3, "names": ["Zoë"]}
    restored = AgentSession.from_dict(through_json(session.to_dict()))

    assert state.get_or_initialize(restored) == Counter(turns=3, names=["Zoë"])
    assert calls == []


def test_dict_state_round_trips_through_to_dict() -> None:
    state: ProviderSessionState[dict[str, Any]] = ProviderSessionState(dict, state_key="notes")
    session = AgentSession()

    assert state.get_or_initialize(session) == {}
    state.save(session, {"a": [1, 2], "b": None})
    restored = AgentSession.from_dict(through_json(session.to_dict()))

    assert state.get_or_initialize(restored) == {"a": [1, 2], "b": None}


def test_states_under_different_keys_do_not_mix() -> None:
    first = ProviderSessionState(Counter, state_key="first")
    second = ProviderSessionState(Counter, state_key="second")
    session = AgentSession()

    first.save(session, Counter(turns=1))
    assert second.get_or_initialize(session) == Counter()
    assert first.get_or_initialize(session) == Counter(turns=1)


def test_state_holding_the_wrong_value_raises_session_format_error() -> None:
    state = ProviderSessionState(Counter, state_key="counter")
    session = AgentSession(state={"counter": {"turns": "many"}})

    with pytest.raises(SessionFormatError, match="'counter'"):
        state.get_or_initialize(session)


# -- SessionKey -----------------------------------------------------------------------------------


def test_session_key_defaults_and_of_session() -> None:
    session = AgentSession(session_id="s1", tenant="acme")

    assert SessionKey(session_id="s1") == SessionKey("default", "s1")
    assert SessionKey.of(session) == SessionKey("acme", "s1")


@pytest.mark.parametrize(
    ("tenant", "session_id", "says"),
    [
        pytest.param("default", "", "session_id must not be empty", id="empty-id"),
        pytest.param("", "s1", "tenant must not be empty", id="empty-tenant"),
        pytest.param("default", "x" * 1025, "session_id is 1,025 characters", id="long-id"),
        pytest.param("t" * 1025, "s1", "tenant is 1,025 characters", id="long-tenant"),
        pytest.param("default", "a\udc80", "lone surrogate at position 1", id="surrogate-id"),
        pytest.param("\ud83d", "s1", "tenant is not valid unicode", id="surrogate-tenant"),
        pytest.param("default", 42, "session_id must be a string, got int", id="not-a-string"),
    ],
)
def test_session_key_rejects_invalid_ids(tenant: Any, session_id: Any, says: str) -> None:
    with pytest.raises(InvalidSessionKeyError, match=says):
        SessionKey(tenant, session_id)


def test_session_key_accepts_1024_characters_and_any_unicode() -> None:
    long_id = "é" * 1024

    assert SessionKey("t" * 1024, long_id).session_id == long_id
    assert SessionKey("🏢", "a/b\u0000c").session_id == "a/b\u0000c"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param("Alice", "alice", id="case"),
        pytest.param("a", "a ", id="trailing-space"),
        pytest.param(unicodedata.normalize("NFC", "Zoë"), unicodedata.normalize("NFD", "Zoë"), id="nfc-nfd"),
        pytest.param("a/b", "a%2Fb", id="escaped-slash"),
    ],
)
def test_session_keys_are_compared_exactly(a: str, b: str) -> None:
    assert SessionKey("t", a) != SessionKey("t", b)
    assert SessionKey(a, "s") != SessionKey(b, "s")
    assert len({SessionKey("t", a), SessionKey("t", b)}) == 2
    assert SessionKey("t", a) == SessionKey("t", a)
