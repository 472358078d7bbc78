"""Where ADK's sessions, events and shared state live in a chatkeep store, and how an event is kept.

One tenant holds every ADK app of a service. Each ADK session is one chatkeep session whose id is the JSON
array ``["adk.session", app_name, user_id, session_id]`` (unambiguous whatever the ids hold, readable in
``chatkeep sessions list``): its messages are the session's events, one message per event, and its session
document holds the session-scoped state, the revision ADK's stale-session check compares, and the newest event
(so an append interrupted between the document and the event is completed by the next reader). The state every
session of an app shares (``app:`` keys) lives in the document of ``["adk.app", app_name]``, a user's
(``user:`` keys) in that of ``["adk.user", app_name, user_id]``. Tags on each session's info name its app and
its user (hashed: tags are short), so ``list_sessions`` reads only that app's or that user's sessions. A user's
memories (``ChatkeepMemoryService``) are the messages of ``["adk.memory", app_name, user_id]``.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from google.adk.events import Event
from google.adk.sessions import State
from pydantic_core import to_jsonable_python

from chatkeep.core import AgentSession, InvalidSessionKeyError, Message, MessageFormatError, Role, SessionKey
from chatkeep.interop._envelope import unwrap, wrap

__all__ = [
    "CREATED",
    "FORMAT",
    "Document",
    "app_key",
    "event_json",
    "event_of",
    "ids_of",
    "item_of",
    "listing_tag",
    "memory_key",
    "merged_state",
    "message_of",
    "session_key",
    "split_delta",
    "tags_of",
    "user_key",
]

#: The envelope format of the events this adapter writes.
FORMAT = "adk.event"
#: The id of the message that releases before ``ABSENT`` appended to claim a key (its first message); it is no
#: longer written, and skipped where a store written by those releases still holds it.
CREATED = "adk.created"
_EVENT_ID_PREFIX = "adk.event:"
_DOCUMENT_KEY = "adk"  # the entry of the chatkeep session document's state this adapter owns


def _key(tenant: str, parts: list[str]) -> SessionKey:
    try:
        return SessionKey(tenant, json.dumps(parts, ensure_ascii=False, separators=(",", ":")))
    except InvalidSessionKeyError as exc:
        raise InvalidSessionKeyError(
            f"app_name, user_id and session_id together must fit in a chatkeep session id of 1,024 characters "
            f"(and be valid unicode); {exc}; pass shorter ids"
        ) from exc


def session_key(tenant: str, app_name: str, user_id: str, session_id: str) -> SessionKey:
    """The chatkeep key of an ADK session."""
    return _key(tenant, ["adk.session", app_name, user_id, session_id])


def app_key(tenant: str, app_name: str) -> SessionKey:
    """The key whose document holds an app's shared state (its ``app:`` keys)."""
    return _key(tenant, ["adk.app", app_name])


def user_key(tenant: str, app_name: str, user_id: str) -> SessionKey:
    """The key whose document holds a user's shared state (its ``user:`` keys) within an app."""
    return _key(tenant, ["adk.user", app_name, user_id])


def memory_key(tenant: str, app_name: str, user_id: str) -> SessionKey:
    """The key whose messages are a user's memories within an app (``ChatkeepMemoryService``)."""
    return _key(tenant, ["adk.memory", app_name, user_id])


def ids_of(key_id: str) -> tuple[str, str, str] | None:
    """``(app_name, user_id, session_id)`` of an ADK session's chatkeep id; ``None`` for any other id."""
    try:
        parts = json.loads(key_id)
    except ValueError:
        return None
    if (
        isinstance(parts, list)
        and len(parts) == 4
        and parts[0] == "adk.session"
        and all(isinstance(p, str) for p in parts)
    ):
        return parts[1], parts[2], parts[3]
    return None


def _tag(kind: str, *parts: str) -> str:
    digest = hashlib.sha256(json.dumps(list(parts), ensure_ascii=False).encode("utf-8", "surrogatepass"))
    return f"adk.{kind}:{digest.hexdigest()[:40]}"


def listing_tag(app_name: str, user_id: str | None = None) -> str:
    """The tag every session of an app carries (``user_id`` None), or every session of one user of it."""
    return _tag("app", app_name) if user_id is None else _tag("user", app_name, user_id)


def tags_of(app_name: str, user_id: str) -> frozenset[str]:
    """The tags of an ADK session: its app's and its user's."""
    return frozenset({listing_tag(app_name), listing_tag(app_name, user_id)})


def split_delta(delta: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A state delta as ADK's services split it: ``(app, user, session)``, prefixes removed, ``temp:`` keys dropped."""
    app: dict[str, Any] = {}
    user: dict[str, Any] = {}
    session: dict[str, Any] = {}
    # Values that are not JSON (datetimes, pydantic models) are stored as ADK's database service stores them.
    for name, value in to_jsonable_python(dict(delta or {}), serialize_unknown=True).items():
        if name.startswith(State.APP_PREFIX):
            app[name.removeprefix(State.APP_PREFIX)] = value
        elif name.startswith(State.USER_PREFIX):
            user[name.removeprefix(State.USER_PREFIX)] = value
        elif not name.startswith(State.TEMP_PREFIX):
            session[name] = value
    return app, user, session


def merged_state(app: Mapping[str, Any], user: Mapping[str, Any], session: Mapping[str, Any]) -> dict[str, Any]:
    """The state an ADK session shows: its own keys, then the app's and the user's under their prefixes."""
    state: dict[str, Any] = copy.deepcopy(dict(session))  # the caller may change it
    state.update({State.APP_PREFIX + name: value for name, value in app.items()})
    state.update({State.USER_PREFIX + name: value for name, value in user.items()})
    return state


# -- events as chatkeep messages ------------------------------------------------------------------------------


def _role_and_text(event: Event) -> tuple[Role, str]:
    content = event.content
    parts = list(content.parts or []) if content is not None else []
    text = "".join(part.text for part in parts if part.text and not part.thought)
    if any(part.function_response is not None for part in parts):
        return "tool", text
    if content is not None and content.role == "user":
        return "user", text
    return "assistant", text


def event_json(event: Event) -> dict[str, Any]:
    """The event's JSON form, as ADK's own database service stores it (``None`` fields left out)."""
    return event.model_dump(mode="json", exclude_none=True)


def message_of(event: Event, item: dict[str, Any] | None = None) -> Message:
    """The chatkeep message that keeps ``event`` exactly (its id is the event's, so an append stores it once).

    Raises:
        MessageFormatError: the event holds a value that is not JSON.
    """
    role, text = _role_and_text(event)
    return wrap(
        event_json(event) if item is None else item,
        format=FORMAT,
        role=role,
        text=text,
        message_id=_EVENT_ID_PREFIX + event.id,
        author_name=event.author or None,
        created_at=datetime.fromtimestamp(event.timestamp, timezone.utc),
    )


def item_of(message: Message) -> dict[str, Any] | None:
    """The event JSON a message keeps; ``None`` for the creation marker earlier releases wrote.

    Raises:
        MessageFormatError: the message was not written by this adapter.
    """
    if message.message_id == CREATED:
        return None
    item = unwrap(message, format=FORMAT)
    if item is None:
        raise MessageFormatError(
            f"message {message.message_id} ({message.role}) was not written by ChatkeepSessionService: this "
            "chatkeep session also holds other messages; keep ADK's sessions in keys of their own"
        )
    return item


def event_of(item: Mapping[str, Any]) -> Event:
    """The ADK event of its stored JSON form."""
    return Event.model_validate(item)


# -- the documents --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Document:
    """What this adapter keeps in a chatkeep session document.

    For a session: its own state, its create and update times, and its newest event (the event JSON), whose id
    is the session's revision. For an app's or a user's shared state: ``state``, and in ``stamps`` the time of
    the event that last set each key (so a late delta cannot undo a later event's).
    """

    state: dict[str, Any] = field(default_factory=dict)
    created: float = 0.0
    updated: float = 0.0
    newest: dict[str, Any] | None = None
    stamps: dict[str, float] = field(default_factory=dict)

    @property
    def newest_id(self) -> str | None:
        """The id of the session's newest event (``None``: none appended yet)."""
        return None if self.newest is None else str(self.newest["id"])

    @classmethod
    def of(cls, session: AgentSession) -> Document:
        """The document kept in a chatkeep session document's state.

        Raises:
            MessageFormatError: the document was not written by this adapter.
        """
        data = session.state.get(_DOCUMENT_KEY)
        if not isinstance(data, dict) or not isinstance(data.get("state"), dict):
            raise MessageFormatError(
                f"the session document of {session.session_id!r} was not written by chatkeep's ADK adapter; keep "
                "ADK's sessions in keys of their own"
            )
        newest = data.get("newest")
        stamps = data.get("stamps") or {}  # none yet: every key as if set long ago
        created, updated = float(data.get("created", 0.0)), float(data.get("updated", 0.0))
        return cls(data["state"], created, updated, newest, {name: float(at) for name, at in stamps.items()})

    def to_session(self, key: SessionKey) -> AgentSession:
        """The chatkeep session document that keeps this."""
        data: dict[str, Any] = {"state": self.state}
        if self.created or self.updated:
            data.update(created=self.created, updated=self.updated, newest=self.newest)
        if self.stamps:
            data["stamps"] = self.stamps
        return AgentSession(session_id=key.session_id, tenant=key.tenant, state={_DOCUMENT_KEY: data})

    def with_delta(self, delta: Mapping[str, Any], at: float, *, late: bool = False) -> Document:
        """This document with ``delta``, from an event of time ``at``, applied to its state.

        A ``late`` delta is one that may already have been applied, by the writer of its event, before later
        events changed the same keys (a reader completing an interrupted append): it leaves every key that an
        event of the same time or later has set.
        """
        if late:
            delta = {name: value for name, value in delta.items() if self.stamps.get(name, float("-inf")) < at}
        return replace(self, state={**self.state, **delta}, stamps={**self.stamps, **dict.fromkeys(delta, at)})
