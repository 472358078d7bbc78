"""How a store without keys tells what ``EncryptedStore`` sealed, so it never hands it out as an empty message.

``EncryptedStore`` (:mod:`chatkeep.core.encryption`) stores each message as one ``DataContent`` of
:data:`SEALED_MEDIA_TYPE` carrying the property :data:`SEALED_PROPERTY`, and a session document's state as
``{SEALED_PROPERTY: {...}}``. :class:`~chatkeep.core.backend.HistoryStore` checks what it reads against these marks
(one dict lookup per message) and raises :class:`EncryptedSessionError` unless the store passes sealed records
through (``sealed_passthrough``: the inner store of an ``EncryptedStore``, or a tool copying records verbatim).
"""

from __future__ import annotations

from collections.abc import Mapping

from chatkeep.core._errors import EncryptedSessionError
from chatkeep.core._messages import DataContent, Message

__all__ = [
    "KEYS_TENANT",
    "SEALED_MEDIA_TYPE",
    "SEALED_PROPERTY",
    "encrypted_session_error",
    "is_sealed",
    "is_sealed_state",
]

SEALED_MEDIA_TYPE = "application/vnd.chatkeep.sealed"
SEALED_PROPERTY = "chatkeep.sealed"
#: The tenant under which a key store keeps each tenant's wrapped data key (one session per tenant).
KEYS_TENANT = "chatkeep-data-keys"

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
