"""The checks of a store call's arguments that every backend shares, made once by :class:`HistoryStore`.

A backend's hooks are only ever called with arguments these let through: a :class:`SessionKey`, a valid tenant,
counts in range, a list of messages, an aware cut-off time.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta, timezone

from chatkeep.core._errors import InvalidArgumentError, InvalidArgumentTypeError, InvalidSessionKeyError
from chatkeep.core._messages import Message
from chatkeep.core._session import validate_id
from chatkeep.core.backend._sessions import SessionKey

__all__ = ["check_count", "check_key", "check_messages", "check_tenant", "prune_cutoff"]


def check_key(key: object) -> SessionKey:
    """``key`` if it is a :class:`SessionKey`; else :class:`InvalidSessionKeyError` saying how to write one."""
    if not isinstance(key, SessionKey):
        raise InvalidSessionKeyError(
            f"a store call takes a SessionKey, got {type(key).__name__}; write SessionKey(tenant, session_id)"
        )
    return key


def check_count(value: object, name: str, *, minimum: int) -> int:
    """``value`` if it is a whole number (not a bool) of ``minimum`` or more; else :class:`InvalidArgumentError`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgumentError(f"{name} must be a whole number of {minimum} or more, got {value!r}")
    return value


def check_tenant(tenant: object) -> str:
    """``tenant`` if a :class:`SessionKey` would take it as its tenant; else :class:`InvalidSessionKeyError`."""
    return validate_id(tenant, "tenant")


def prune_cutoff(older_than: timedelta | datetime) -> datetime:
    """The cut-off time (UTC) ``prune(older_than=...)`` means: now minus an age, or an aware datetime as given.

    Raises:
        InvalidArgumentError: a naive datetime, a negative age, an age reaching before the year 1, or another type.
    """
    if isinstance(older_than, timedelta):
        if older_than < timedelta(0):  # a cut-off in the future: every session would count as idle
            raise InvalidArgumentError(
                f"older_than={older_than!r} is a negative age, which would prune every session; give how long a "
                "session must have been idle, for example timedelta(days=30)"
            )
        try:
            return datetime.now(timezone.utc) - older_than
        except OverflowError:
            raise InvalidArgumentError(
                f"older_than={older_than!r} reaches before the year 1; give an age of at most a few thousand years "
                "(for example timedelta(days=365 * 100))"
            ) from None
    if not isinstance(older_than, datetime):
        raise InvalidArgumentTypeError(
            f"older_than must be a timedelta or an aware datetime, got {type(older_than).__name__}"
        )
    if older_than.tzinfo is None:
        raise InvalidArgumentError(
            "older_than must be timezone-aware (for example datetime.now(timezone.utc) - timedelta(days=30))"
        )
    return older_than.astimezone(timezone.utc)


def check_messages(messages: object) -> list[Message]:
    """``append``'s messages as a list, each a :class:`Message`; else :class:`InvalidArgumentTypeError`."""
    # A str or a lone Message iterates too (into characters, into fields): refuse them by name, not deep inside.
    if isinstance(messages, (str, bytes, Message)) or not isinstance(messages, Iterable):
        raise InvalidArgumentTypeError(
            f"append takes a list of Message, got {type(messages).__name__}; "
            'write append(key, [Message(role="user", text="...")])'
        )
    listed = list(messages)
    for n, message in enumerate(listed):
        if not isinstance(message, Message):
            raise InvalidArgumentTypeError(
                f"append takes a list of Message, but item {n} is a {type(message).__name__}; "
                'wrap each text in a Message(role="user", text="...")'
            )
    return listed
