"""Signed session payloads: what comes back from a client is what the server sent, or it is refused."""

from __future__ import annotations

import json
import secrets

import pytest

from chatkeep.core import AgentSession, SessionIntegrityError, SessionOwnershipError, SessionSigner

OLD, NEW = secrets.token_bytes(32), secrets.token_bytes(32)


def session() -> AgentSession:
    return AgentSession(
        session_id="s-1", tenant="acme", service_session_id="resp_1", state={"in_memory": {"messages": ["x"]}}
    )


def through_client(data: dict) -> dict:  # type: ignore[type-arg]
    return json.loads(json.dumps(data))


def test_signed_payload_round_trips_through_json() -> None:
    signer = SessionSigner({"k": NEW})
    payload = through_client(session().to_dict(signer=signer))
    assert payload["sig"]["kid"] == "k"
    assert AgentSession.from_dict(payload, tenant="acme", signer=signer) == session()


@pytest.mark.parametrize(
    "tamper",
    [
        lambda d: d.update(tenant="globex"),
        lambda d: d.update(service_session_id="resp_other"),
        lambda d: d["state"]["in_memory"]["messages"].append("injected"),
        lambda d: d.update(session_id="s-2"),
        lambda d: d["sig"].update(kid="old"),  # replaying the MAC under another key's name
    ],
)
def test_any_change_is_refused(tamper) -> None:  # type: ignore[no-untyped-def]
    signer = SessionSigner({"k": NEW, "old": OLD})
    payload = through_client(session().to_dict(signer=signer))
    tamper(payload)
    with pytest.raises(SessionIntegrityError, match="changed after it was signed"):
        AgentSession.from_dict(payload, signer=signer)


def test_unsigned_or_malformed_payload_is_refused_when_a_signature_is_required() -> None:
    signer = SessionSigner({"k": NEW})
    with pytest.raises(SessionIntegrityError, match="not signed"):
        AgentSession.from_dict(session().to_dict(), signer=signer)
    bad = session().to_dict()
    bad["sig"] = "nonsense"
    with pytest.raises(SessionIntegrityError, match="malformed"):
        AgentSession.from_dict(bad, signer=signer)


def test_key_rotation_accepts_old_signatures_until_the_key_is_retired() -> None:
    before = SessionSigner({"2026-05": OLD})
    payload = through_client(session().to_dict(signer=before))
    during = SessionSigner({"2026-11": NEW, "2026-05": OLD}, current="2026-11")
    assert AgentSession.from_dict(payload, signer=during) == session()
    assert session().to_dict(signer=during)["sig"]["kid"] == "2026-11"
    after = SessionSigner({"2026-11": NEW})
    with pytest.raises(SessionIntegrityError, match="2026-05"):
        AgentSession.from_dict(payload, signer=after)


def test_tenant_check_still_applies_to_a_valid_signature() -> None:
    signer = SessionSigner({"k": NEW})
    payload = session().to_dict(signer=signer)
    with pytest.raises(SessionOwnershipError):
        AgentSession.from_dict(payload, tenant="globex", signer=signer)


def test_weak_or_inconsistent_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 32"):
        SessionSigner({"k": b"short"})
    with pytest.raises(ValueError, match="current key"):
        SessionSigner({"k": NEW}, current="other")
    with pytest.raises(ValueError, match="at least one key"):
        SessionSigner({})


def test_a_signed_payload_still_loads_without_a_signer() -> None:
    payload = session().to_dict(signer=SessionSigner({"k": NEW}))
    assert AgentSession.from_dict(payload) == session()
