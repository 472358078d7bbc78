"""The errors a store raises for a call it refuses: a feature its backend lacks, a fork it cannot make, a session
document another owner holds or another writer changed.

One text per refusal, so every backend says the same; a backend raises them from its hooks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chatkeep.core._errors import (
    ConcurrencyConflictError,
    InvalidArgumentError,
    SearchUnsupportedError,
    SessionOwnershipError,
    UnsupportedOperationError,
)

if TYPE_CHECKING:
    from chatkeep.core.backend._sessions import Absent, SessionKey

__all__ = [
    "absent_unsupported_error",
    "conflict_error",
    "feature_unsupported_error",
    "fork_source_error",
    "fork_target_exists_error",
    "owner_error",
    "search_unsupported_error",
]


def search_unsupported_error(store: object) -> SearchUnsupportedError:
    """The error for asking a store without the search capability to index or search messages."""
    return SearchUnsupportedError(
        f"{type(store).__name__} cannot index or search messages (it lacks the search capability); keep the "
        "history you want to search in a store that has it: memory://, PostgreSQL with pgvector, or SQLite with "
        '?transport=apsw (pip install "chatkeep-sql[recall]")'
    )


def feature_unsupported_error(store: object, call: str, hook: str) -> UnsupportedOperationError:
    """The error for a call whose hook the store's backend does not implement (its plugin predates the call)."""
    return UnsupportedOperationError(
        f"{type(store).__name__} does not support {call}: its backend was written before "
        f"HistoryStore.{call.split('(')[0]} existed; upgrade the plugin that provides it, or ask its author to "
        f"implement HistoryStore.{hook} (see 'Writing a plugin' in the docs)"
    )


def fork_target_exists_error(target: SessionKey) -> ConcurrencyConflictError:
    """The error for a fork onto a session that exists (raise it from ``_fork``)."""
    return ConcurrencyConflictError(
        f"cannot fork onto session {target.session_id!r}: it already exists; pass a new session id as the target "
        "(or delete that session first)"
    )


def fork_source_error(source: SessionKey, through: str | None) -> InvalidArgumentError:
    """The error for a fork whose ``through`` is not a message of the source, or whose source is empty."""
    if through is None:
        return InvalidArgumentError(
            f"session {source.session_id!r} holds no messages, so there is nothing to fork; "
            "fork a session that has some"
        )
    return InvalidArgumentError(
        f"message {through!r} is not in session {source.session_id!r}; pass the id of one of its messages as through= "
        "(chatkeep show lists them)"
    )


def owner_error() -> SessionOwnershipError:
    """The error for a session document bound to another owner (raise it from ``_save_session``)."""
    return SessionOwnershipError("this session belongs to another owner; refuse the request")


def absent_unsupported_error(store: object) -> UnsupportedOperationError:
    """The error for ``save_session(expected_version=ABSENT)`` on a store whose plugin does not declare it."""
    return UnsupportedOperationError(
        f"{type(store).__name__} cannot save a session only if it has no document (expected_version=ABSENT): its "
        "backend does not declare creates_if_absent; upgrade the plugin that provides it, or ask its author to "
        "handle ABSENT in HistoryStore._save_session (see 'Writing a plugin' in the docs)"
    )


def conflict_error(
    session_id: str, expected_version: str | Absent, *, exists: bool | None = None
) -> ConcurrencyConflictError:
    """The error for a stale ``save_session``: raise it from ``_save_session`` when the version does not match.

    Args:
        session_id: the session's id.
        expected_version: the version the caller expected (``ABSENT``: that there was no document).
        exists: whether the key has a document now (``None``: unknown).
    """
    if not isinstance(expected_version, str):  # ABSENT, and the key has a document
        return ConcurrencyConflictError(
            f"session {session_id!r} already has a document (it was saved with expected_version=ABSENT); "
            "load it and save with its version, or create another session id"
        )
    now = {None: "", True: " (it has a newer version)", False: " (it has no document now)"}[exists]
    return ConcurrencyConflictError(
        f"session {session_id!r} changed since version {expected_version!r} was read{now}; "
        "load it again, reapply your change and save with the new version"
    )
