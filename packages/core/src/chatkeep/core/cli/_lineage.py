"""What ``copy`` carries beside the messages: a fork stays a fork (when its parent is copied too), and the title,
tags and metadata go along.

A fork is copied by forking the copied parent in the target (nothing is copied twice), then appending the fork's
messages: appends are idempotent by message id, so only the fork's own messages are written. The copy is then
verified as every session is (count and sha256). When that fails (the fork was trimmed into what it took, or its
parent changed since), or the target cannot fork, or the parent is not in the target, the fork is copied as an
equal copy instead: the same messages, no parent.
"""

from __future__ import annotations

from chatkeep.core._errors import ConcurrencyConflictError, InvalidArgumentError, UnsupportedOperationError
from chatkeep.core.backend import HistoryStore, SessionInfo, SessionKey

__all__ = ["carry_info", "fork_in_target", "parents_first"]


def parents_first(forks: list[SessionInfo]) -> list[SessionInfo]:
    """``forks`` ordered so that a fork whose parent is among them comes after that parent."""
    by_id = {info.session_id: info for info in forks}
    ordered: list[SessionInfo] = []
    placed: set[str] = set()
    for info in forks:
        chain = []
        current: SessionInfo | None = info
        while current is not None and current.session_id not in placed:
            chain.append(current)
            placed.add(current.session_id)
            parent = current.forked_from
            current = by_id.get(parent.session_id) if parent is not None else None
        ordered += reversed(chain)
    return ordered


async def fork_in_target(target: HistoryStore, key: SessionKey, info: SessionInfo) -> bool:
    """Fork ``key`` from its parent in ``target`` when the parent is there; ``True`` when the target forked it."""
    parent = info.forked_from
    if parent is None:
        return False
    try:
        await target.fork(SessionKey(key.tenant, parent.session_id), key, through=parent.through)
    except ConcurrencyConflictError:
        return False  # the target holds the session already (a rerun): the appends complete it
    except (InvalidArgumentError, UnsupportedOperationError):
        return False  # the parent is not in the target (or lost that message), or the target cannot fork
    return True


async def carry_info(target: HistoryStore, key: SessionKey, info: SessionInfo) -> str | None:
    """Give ``key`` in ``target`` the title, tags and metadata ``info`` has; a note when the target cannot."""
    if not (info.title or info.tags or info.metadata):
        return None
    try:
        await target.update_info(key, title=info.title or "", tags=info.tags, metadata=info.metadata)
    except UnsupportedOperationError:
        return "title, tags and metadata not copied: the target store does not keep them"
    return None
