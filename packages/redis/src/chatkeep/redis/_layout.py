"""Where a session lives in Redis: key names and index entries.

Layout (``P`` is the prefix, ``T`` and ``S`` the base64url of the tenant and session id in UTF-8)::

    P:{T.S}:h       hash: next sequence number, created/updated stamps, session document, version, owner
    P:{T.S}:m       list: message records in append order
    P:{T.S}:i       sorted set: message ids still stored, scored by sequence number
    P:{T.S}:p:N     string: the record pop N removed, kept a minute so a retried pop returns it again
    P:{T.S}:u       sorted set: the usage of each stored message that has some, ``seq:json``, scored by sequence
                    number (what a pop or trim takes off the session's usage, kept in the hash as ``usage``)
    P:{T.S}:m:N     a log forks share, renamed from ``m``, ``i`` and ``u`` (the hash's ``log`` names the current
    P:{T.S}:i:N     one, its ``segs`` the earlier logs it still holds messages of, in its slot or other sessions')
    P:{T.S}:u:N
    P:{T.S}:r:N     string: how many sessions hold log N (as current log or segment); the last to let go frees it
    P:{T}:sessions  sorted set: the tenant's session ids, scored by last update (microseconds)
    P:{T}:tags      hash: session id -> its tags (a JSON array), for the sessions that have tags
    P:{T}:tags:G    sorted set: the tenant's session ids tagged G (the tag's UTF-8), scored by last update
    P:tenants       sorted set: tenants, scored by last update

The braces are the cluster hash tag: a session's keys share a slot, so one Lua script updates
them atomically. base64url has no ``.``, ``{`` or ``}``, so no id can reach another key. The tenant's
index lives on another slot: writers update it *before* the session (an entry without a session is
dropped by ``list_sessions`` and ``prune``; a session without an entry cannot happen), and removals
are conditional on the entry's score, so a concurrent write keeps its entry. ``trim`` is the exception:
it updates the index *after*, and only when it deleted messages, from a session that has its entry;
``update_info`` likewise (it changes only a session that exists). A session's tags live in its tenant's slot
(``tags`` and the tag indexes), beside the tenant's index they are updated with: the tag indexes are scored
like it, so ``list_sessions(tag=...)`` pages one of them newest first and reads only the tagged sessions.

Keys hold the ids' base64url, not :func:`chatkeep.core.backend.hashed_key`: Redis takes keys of any length and
bytes, so nothing needs hashing, and keys written by earlier versions must stay where readers look for them.
"""

from __future__ import annotations

import base64
import functools
from typing import Any

__all__ = [
    "INDEX_GRACE_US",
    "log_keys",
    "pairs",
    "pop_receipt",
    "session_keys",
    "tag_index",
    "tags_map",
    "tenant_index",
    "usage_key",
]

# An index entry whose session is missing is only dropped once it is this old: younger, it may belong to a
# write that updated the index and has not reached the session yet.
INDEX_GRACE_US = 60_000_000


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode("utf-8")).rstrip(b"=").decode("ascii")


@functools.lru_cache(maxsize=4096)
def session_keys(prefix: str, tenant: str, session_id: str) -> tuple[str, str, str, str]:
    """The keys of one session: hash, messages, ids, and its tenant's index."""
    tag_tenant = _b64(tenant)
    tag = f"{prefix}:{{{tag_tenant}.{_b64(session_id)}}}"
    return f"{tag}:h", f"{tag}:m", f"{tag}:i", f"{prefix}:{{{tag_tenant}}}:sessions"


def pop_receipt(hash_key: str, token: str) -> str:
    """The key where the pop ``token`` leaves its record, in the slot of the session whose hash is ``hash_key``."""
    return f"{hash_key[:-2]}:p:{token}"


def usage_key(hash_key: str) -> str:
    """The per-message usage of the session whose hash is ``hash_key`` (same slot)."""
    return f"{hash_key[:-2]}:u"


def log_keys(records: str) -> tuple[str, str, str, str]:
    """The keys of the shared log whose records are at ``records`` (``P:{T.S}:m:N``): hold count, records, ids, usage.

    All in one slot, the ``ACQUIRE`` and ``RELEASE`` scripts' keys.
    """
    base, name = records.rsplit(":m:", 1)
    return f"{base}:r:{name}", records, f"{base}:i:{name}", f"{base}:u:{name}"


def tenant_index(prefix: str, tenant: str) -> str:
    return f"{prefix}:{{{_b64(tenant)}}}:sessions"


def tags_map(prefix: str, tenant: str) -> str:
    """The hash of the tenant's sessions' tags (in the slot of the tenant's index)."""
    return f"{prefix}:{{{_b64(tenant)}}}:tags"


def tag_index(prefix: str, tenant: str, tag: str) -> str:
    """The index of the tenant's sessions tagged ``tag`` (the scripts name it as ``tags_map`` + ``:`` + tag)."""
    return f"{tags_map(prefix, tenant)}:{tag}"


def pairs(rows: list[Any]) -> list[tuple[bytes, int]]:
    """``(member, score)`` pairs of a WITHSCORES reply (redis-py pairs them; a raw reply is flat)."""
    if rows and isinstance(rows[0], (list, tuple)):
        return [(member, int(float(score))) for member, score in rows]
    return [(rows[n], int(float(rows[n + 1]))) for n in range(0, len(rows), 2)]
