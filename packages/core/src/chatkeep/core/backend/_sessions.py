"""What the store contract names and returns about a session: its key, its listing, its stored document.

:class:`SessionKey` addresses a conversation; :class:`SessionInfo` and :class:`SessionPage` are what
``list_sessions`` returns; :class:`StoredSession` is what ``load_session`` returns, and
:func:`session_document` / :func:`decode_session_document` are the one text every backend stores a session
document as; :data:`ABSENT` is the expected version of a document that does not exist yet.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from chatkeep.core._session import DEFAULT_TENANT, AgentSession, validate_id
from chatkeep.core.backend._damage import damaged_session_error
from chatkeep.core.backend._info import ForkInfo, SessionUsage

__all__ = [
    "ABSENT",
    "Absent",
    "SessionInfo",
    "SessionKey",
    "SessionPage",
    "StoredSession",
    "decode_session_document",
    "session_document",
]


class Absent(enum.Enum):
    """The type of :data:`ABSENT` (its one member), for annotations: ``expected_version: str | Absent | None``."""

    ABSENT = "ABSENT"

    def __repr__(self) -> str:
        return "ABSENT"


#: The expected version of a session document that does not exist yet: ``save_session(key, session,
#: expected_version=ABSENT)`` writes only when the key has no document (messages without one count as none), and
#: raises :class:`~chatkeep.core.ConcurrencyConflictError` when it has one. Never equal to a version string.
ABSENT = Absent.ABSENT


@dataclass(frozen=True, slots=True)
class SessionKey:
    """Addresses one conversation in a store: a tenant and a session id, both compared exactly.

    Raises:
        InvalidSessionKeyError: an id is empty, longer than 1,024 characters or not valid unicode.
    """

    tenant: str = DEFAULT_TENANT
    session_id: str = field(default="")

    def __post_init__(self) -> None:
        validate_id(self.tenant, "tenant")
        validate_id(self.session_id, "session_id")

    @classmethod
    def of(cls, session: AgentSession) -> SessionKey:
        """The key of ``session`` (its tenant and session id)."""
        return cls(session.tenant, session.session_id)


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """What ``list_sessions`` tells about one stored session.

    The fields after ``updated_at`` have defaults, so a backend written before they existed still builds one.

    Attributes:
        forked_from: the session this one was forked from and the last message it took (``None``: not a fork).
        usage: the tokens its messages used (``None``: the backend does not count usage).
        title: its title (``None``: none set).
        tags: its tags.
        metadata: the JSON-safe dict set with ``update_info``.
    """

    session_id: str
    tenant: str
    message_count: int
    created_at: datetime
    updated_at: datetime
    forked_from: ForkInfo | None = None
    usage: SessionUsage | None = None
    title: str | None = None
    tags: frozenset[str] = frozenset()
    metadata: dict[str, Any] = field(default_factory=dict, hash=False)  # hash=False: a SessionInfo stays hashable


@dataclass(frozen=True, slots=True)
class SessionPage:
    """One page of ``list_sessions``, newest first; pass ``next_cursor`` back for the next (``None`` at the end)."""

    items: list[SessionInfo]
    next_cursor: str | None = None


@dataclass(frozen=True, slots=True)
class StoredSession:
    """A session document read by ``load_session``, its opaque version (pass it to ``save_session``) and owner.

    ``owner`` is the user the document is bound to within its tenant (``None``: not bound); it takes no part in
    comparisons, so a stored session equals ``StoredSession(session, version)``. It unpacks as
    ``session, version = await store.load_session(key)``.
    """

    session: AgentSession
    version: str
    owner: str | None = field(default=None, compare=False)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.session, self.version))


def session_document(session: AgentSession) -> str:
    """The JSON text a backend stores for a session document (what ``load_session`` hands back to the base)."""
    return json.dumps(session.to_dict(), ensure_ascii=False)


def decode_session_document(key: SessionKey, document: str | bytes, version: str, owner: str | None) -> StoredSession:
    """What ``_load_session`` returns for the text :func:`session_document` stored under ``key``.

    Raises:
        SessionFormatError: the stored text is damaged (not JSON, or not a serialized session); the message
            names the session and says how to recover.
    """
    try:
        session = AgentSession.from_dict(json.loads(document), tenant=key.tenant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError and SessionFormatError too
        raise damaged_session_error(key, "document", exc) from exc
    return StoredSession(session, version, owner)
