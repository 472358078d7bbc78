"""Where a ``ChatkeepSession``'s branches live: each one a chatkeep session of its own, found by a tag.

Branch ``main`` is the session itself (its key is the one ``ChatkeepSession`` always used, so a session that
never branches is stored as before). Any other branch ``b`` of session ``s`` is the session ``s#branch:b`` in the
same tenant: a :meth:`~chatkeep.core.HistoryStore.fork` of the branch it was made from (nothing copied), carrying
the tag :func:`branch_tag` of ``s``, through which ``list_sessions(tenant, tag=...)`` finds a session's branches
with the store's tag index.
"""

from __future__ import annotations

import hashlib

from chatkeep.core import InvalidArgumentError, SessionKey
from chatkeep.core.backend import check_tag

__all__ = ["MAIN", "SEPARATOR", "branch_key", "branch_name", "branch_tag", "check_branch_name"]

#: The branch every session starts on: the session itself.
MAIN = "main"
#: Between a session's id and a branch's name, in the branch's session id.
SEPARATOR = "#branch:"
_TAG_PREFIX = "openai-agents.branch-of:"


def check_branch_name(branch_id: str) -> str:
    """A branch name as ``create_branch_from_turn`` takes it: a non-blank string without :data:`SEPARATOR`.

    Raises:
        InvalidArgumentError: a blank name, or one holding the separator (it would make two sessions' branches
            one key).
    """
    if not isinstance(branch_id, str) or not branch_id.strip():
        raise InvalidArgumentError(f"Branch name cannot be empty (got {branch_id!r}). Pass a name, or None for one")
    if SEPARATOR in branch_id:
        raise InvalidArgumentError(
            f"Branch name {branch_id!r} holds {SEPARATOR!r}, which separates a session's id from its branches' "
            "names. Pass a name without it"
        )
    return branch_id


def branch_key(main: SessionKey, branch_id: str) -> SessionKey:
    """The key of a branch of the session ``main`` (``main`` itself for :data:`MAIN`).

    Raises:
        InvalidSessionKeyError: the branch's session id would be over 1,024 characters.
    """
    if branch_id == MAIN:
        return main
    return SessionKey(main.tenant, f"{main.session_id}{SEPARATOR}{branch_id}")


def branch_name(main: SessionKey, session_id: str) -> str | None:
    """The name of the branch of ``main`` whose session id is ``session_id`` (``None``: not one of its branches)."""
    if session_id == main.session_id:
        return MAIN
    prefix = f"{main.session_id}{SEPARATOR}"
    return session_id[len(prefix) :] if session_id.startswith(prefix) else None


def branch_tag(session_id: str) -> str:
    """The tag every branch of the session ``session_id`` carries (besides ``main``, which carries none).

    ``openai-agents.branch-of:`` and the id; for an id too long for a tag, a SHA-256 of it.
    """
    tag = f"{_TAG_PREFIX}{session_id}"
    try:
        return check_tag(tag)
    except InvalidArgumentError:  # over the store's length limit for a tag
        return f"{_TAG_PREFIX}sha256:{hashlib.sha256(session_id.encode('utf-8')).hexdigest()}"
