"""What a store raises for data it stored and can no longer read: a damaged session document, metadata or record.

Every such error names the session (tenant and id) and says what to do: the operator finds it, deletes or
restores that one session, and the rest of the store stays usable. One text, so every backend says the same;
:func:`naming_damage` gives a record a hook failed to decode the name of its session.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from chatkeep.core._errors import DamagedListingError, MessageFormatError, SessionFormatError

if TYPE_CHECKING:
    from chatkeep.core.backend._sessions import SessionKey, SessionPage

__all__ = ["damaged_listing_error", "damaged_record_error", "damaged_session_error", "naming_damage"]


def _way_out(key: SessionKey) -> str:
    delete = shlex.join(["chatkeep", "sessions", "delete", key.session_id, "--tenant", key.tenant])
    return f"delete the session ({delete}) or restore it from an export (chatkeep import)"


def damaged_session_error(key: SessionKey, what: str, cause: BaseException) -> SessionFormatError:
    """The error for a session whose stored ``what`` ("document", "metadata") cannot be read.

    Raise it ``from`` the decoding error; its message names the session and how to recover.
    """
    return SessionFormatError(
        f"the stored {what} of session {key.session_id!r} in tenant {key.tenant!r} is damaged ({cause}); "
        f"{_way_out(key)}"
    )


def damaged_listing_error(tenant: str, page: SessionPage, entries: Sequence[str]) -> DamagedListingError:
    """The error of a listing of ``tenant`` that met ``entries`` it cannot name a session for.

    Each entry says where it is stored and what to do with it; ``page`` is the listing without them.
    """
    return DamagedListingError(
        f"listing the sessions of tenant {tenant!r} met {len(entries)} damaged "
        f"{'entry' if len(entries) == 1 else 'entries'} that no longer say which session they are: "
        f"{'; '.join(entries)}. The other sessions are listed in this error's page; "
        "chatkeep sessions list --skip-damaged lists them, naming these",
        page=page,
        entries=tuple(entries),
    )


class _NamedMessageFormatError(MessageFormatError):
    """A :class:`MessageFormatError` that already names its session (so a wrapping store does not name it twice)."""


def damaged_record_error(key: SessionKey, cause: MessageFormatError) -> MessageFormatError:
    """``cause`` (a record that does not decode) with the session named and the way out; itself if already named."""
    if isinstance(cause, _NamedMessageFormatError):
        return cause
    return _NamedMessageFormatError(
        f"session {key.session_id!r} in tenant {key.tenant!r} holds a damaged message record: {cause}. "
        f"Its other sessions are unaffected; {_way_out(key)}"
    )


@contextlib.contextmanager
def naming_damage(key: SessionKey) -> Iterator[None]:
    """A stored record that does not decode is reported with its session named (see :func:`damaged_record_error`)."""
    try:
        yield
    except MessageFormatError as exc:
        named = damaged_record_error(key, exc)
        if named is exc:
            raise
        raise named from exc
