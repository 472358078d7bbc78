"""How a store without keys tells what ``EncryptedStore`` sealed, so it never hands it out as an empty message.

``EncryptedStore`` (:mod:`chatkeep.core.encryption`) stores each message as one ``DataContent`` of
:data:`SEALED_MEDIA_TYPE` carrying the property :data:`SEALED_PROPERTY`, and a session document's state as
``{SEALED_PROPERTY: {...}}``. :class:`~chatkeep.core.backend.HistoryStore` checks what it reads against these marks
(one dict lookup per message) and raises :class:`EncryptedSessionError` unless the store passes sealed records
through (``sealed_passthrough``: the inner store of an ``EncryptedStore``, or a tool copying records verbatim).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from chatkeep.core._errors import EncryptedSessionError
from chatkeep.core._messages import DataContent, Message

if TYPE_CHECKING:
    from chatkeep.core.backend._sessions import SessionKey

__all__ = [
    "KEYS_TENANT",
    "SEALED_MEDIA_TYPE",
    "SEALED_PROPERTY",
    "SealedSessions",
    "encrypted_session_error",
    "is_sealed",
    "is_sealed_state",
]

SEALED_MEDIA_TYPE = "application/vnd.chatkeep.sealed"
SEALED_PROPERTY = "chatkeep.sealed"
#: The tenant under which a key store keeps each tenant's wrapped data key (one session per tenant).
KEYS_TENANT = "chatkeep-data-keys"

_PROPERTIES = operator.attrgetter("additional_properties")
_OPEN_IT = (
    "open it through chatkeep.core.encryption.EncryptedStore with the same key store and master keys "
    "(see docs/security.md, encryption at rest)"
)


def is_sealed(message: Message) -> bool:
    """Whether ``message`` is a record ``EncryptedStore`` sealed (its contents are ciphertext)."""
    if SEALED_PROPERTY not in message.additional_properties:
        return False
    contents = message.contents
    return len(contents) == 1 and isinstance(contents[0], DataContent) and contents[0].media_type == SEALED_MEDIA_TYPE


def is_sealed_state(state: Mapping[str, object]) -> bool:
    """Whether a stored session document's ``state`` is one ``EncryptedStore`` sealed."""
    return isinstance(state.get(SEALED_PROPERTY), dict)


def encrypted_session_error(tenant: str, session_id: str, *, found: str, outcome: str) -> EncryptedSessionError:
    """The error for a store without keys meeting an encrypted session.

    Args:
        tenant: the session's tenant.
        session_id: the session's id.
        found: what was sealed (``"message 0190..."``, ``"its session document"``).
        outcome: what the call did about it (``"nothing was returned"``, ``"nothing was stored"``).
    """
    return EncryptedSessionError(
        f"session {session_id!r} of tenant {tenant!r} is encrypted ({found} was sealed by EncryptedStore) and this "
        f"store has no keys, so {outcome}; {_OPEN_IT}"
    )


class SealedSessions:
    """What a store without keys checks, and the sessions it found encrypted (the newest ``limit``).

    A plain append to a session found here is refused without a round trip. A session is forgotten when it is
    deleted, trimmed or popped, and all of them when the store prunes or deletes a tenant.
    """

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self._found: dict[SessionKey, None] = {}

    def __contains__(self, key: SessionKey) -> bool:
        return key in self._found

    def forget(self, key: SessionKey | None = None) -> None:
        """Forget ``key`` (``None``: every session)."""
        if key is None:
            self._found.clear()
        else:
            self._found.pop(key, None)

    def check(self, key: SessionKey, messages: Sequence[Message], *, outcome: str = "nothing was returned") -> None:
        """Raise :class:`EncryptedSessionError` when a message of ``messages`` is sealed (and remember ``key``)."""
        # Most messages carry no additional properties: one pass in C rules them out (about 2% of a decode).
        if not any(map(_PROPERTIES, messages)):
            return
        for message in messages:
            if is_sealed(message):
                raise self._found_in(key, f"message {message.message_id}", outcome)

    def check_document(self, key: SessionKey, state: Mapping[str, object]) -> None:
        """Raise :class:`EncryptedSessionError` when a session document's ``state`` is sealed."""
        if is_sealed_state(state):
            raise self._found_in(key, "its session document", "nothing was returned")

    def refuse_append(self, key: SessionKey) -> None:
        """Raise :class:`EncryptedSessionError` when ``key`` was found encrypted: plaintext must not go there."""
        if key in self._found:
            raise encrypted_session_error(
                key.tenant,
                key.session_id,
                found="a message this store read",
                outcome="nothing was stored (plaintext there would be unreadable through EncryptedStore)",
            )

    def _found_in(self, key: SessionKey, found: str, outcome: str) -> EncryptedSessionError:
        if key not in self._found and len(self._found) >= self.limit:
            del self._found[next(iter(self._found))]
        self._found[key] = None
        return encrypted_session_error(key.tenant, key.session_id, found=found, outcome=outcome)
