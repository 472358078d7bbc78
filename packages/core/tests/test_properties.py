"""Property tests of what users hand core (with Hypothesis): session payloads and messages, never a stray exception.

The stores' side of the same inputs is in the conformance kit (``chatkeep.testing.conformance``), which every
backend runs.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chatkeep.core import (
    AgentSession,
    ChatkeepError,
    DataContent,
    FunctionCallContent,
    FunctionResultContent,
    InvalidArgumentError,
    Message,
    MessageFormatError,
    SessionFormatError,
    TextContent,
    UriContent,
    Usage,
    UsageContent,
)
from chatkeep.testing.conformance import PROPERTY_SETTINGS

_json: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(st.characters(), max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
_fields = st.sampled_from(["type", "v", "session_id", "tenant", "service_session_id", "state", "sig", "other"])
#: Dicts shaped like a session payload, with each field now right, now wrong, now missing.
_payloads = st.fixed_dictionaries(
    {},
    optional={
        "type": st.just("session") | _json,
        "v": st.just(1) | _json,
        "session_id": st.text(st.characters(), max_size=12) | _json,
        "tenant": st.text(st.characters(), max_size=12) | _json,
        "service_session_id": st.none() | st.text(st.characters(), max_size=12) | _json,
        "state": st.dictionaries(st.text(max_size=8), _json, max_size=3) | _json,
        "sig": _json,
    },
) | st.dictionaries(_fields, _json, max_size=6)


@given(payload=_payloads | _json, tenant=st.none() | st.text(st.characters(), max_size=8))
@PROPERTY_SETTINGS
def test_from_dict_of_any_json_parses_or_raises_session_format_error(payload: Any, tenant: str | None) -> None:
    try:
        session = AgentSession.from_dict(payload, tenant=tenant)
    except SessionFormatError:
        return
    except ChatkeepError:
        # The only others it may raise: the payload names another tenant, or the tenant argument is invalid.
        if tenant is None:
            raise
        return
    # Parsed: it serializes back to the same payload (without a signature it was not asked to check).
    assert session.to_dict() == {k: v for k, v in payload.items() if k != "sig"} | {
        "service_session_id": payload.get("service_session_id"),
        "state": payload.get("state", {}),
    }
    assert AgentSession.from_dict(json.loads(json.dumps(session.to_dict()))) == session


@pytest.mark.parametrize("where", ["state", "service_session_id"])
def test_a_lone_surrogate_in_a_session_is_refused_with_session_format_error(where: str) -> None:
    session = AgentSession(session_id="s", service_session_id="resp_\ud800" if where != "state" else None)
    if where == "state":
        session.state["memory"] = {"fact": "a\udc80b"}
    with pytest.raises(SessionFormatError, match="lone surrogate"):
        session.to_dict()
    payload = {"type": "session", "v": 1, "session_id": "s", "tenant": "default", "state": {}}
    payload |= {"state": {"x": "\ud800"}} if where == "state" else {"service_session_id": "\ud800"}
    with pytest.raises(SessionFormatError, match="lone surrogate"):
        AgentSession.from_dict(payload)


@given(text=st.text(max_size=30), bad=st.text(st.characters(categories=["Cs"]), min_size=1))
@PROPERTY_SETTINGS
def test_a_message_encodes_to_a_record_that_decodes_equal_or_raises_message_format_error(text: str, bad: str) -> None:
    good = Message(role="user", contents=[TextContent(text=text)], additional_properties={text: [text]})
    assert Message.from_record(good.to_record()) == good
    with pytest.raises(MessageFormatError, match="lone surrogate"):
        Message(role="user", text=text + bad).to_record()


#: Every class of the message model a user builds, with its keyword names and one that none of them takes.
_BUILT = [
    Message,
    TextContent,
    FunctionCallContent,
    FunctionResultContent,
    DataContent,
    UriContent,
    Usage,
    UsageContent,
]
_names = st.sampled_from(
    [
        *("role", "text", "contents", "message_id", "author_name", "type", "call_id", "name", "arguments"),
        *("result", "is_error", "data", "media_type", "uri", "input_tokens", "output_tokens", "total_tokens"),
        *("usage", "other"),
    ]
)
_values = _json | st.builds(object) | st.just(TextContent(text="t")) | st.lists(st.builds(object), max_size=1)


@given(
    cls=st.sampled_from(_BUILT),
    args=st.lists(_values, max_size=1),
    kwargs=st.dictionaries(_names, _values, max_size=4),
)
@PROPERTY_SETTINGS
def test_any_arguments_to_a_message_or_content_build_it_or_raise_invalid_argument_error(
    cls: type, args: list[Any], kwargs: dict[str, Any]
) -> None:
    """Never pydantic's ValidationError (nor another foreign exception): a ChatkeepError that says what to pass."""
    try:
        cls(*args, **kwargs)
    except InvalidArgumentError as exc:
        refused = str(exc)
    else:
        return
    assert "Pass " in refused, refused
