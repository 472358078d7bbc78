"""Commands over whole tenants: ``tenants list`` and ``erase`` (a tenant, or one session of it, for good).

``erase`` removes what the store holds for the tenant or session: its messages and session documents. A store
wrapped in :class:`~chatkeep.core.encryption.EncryptedStore` keeps the tenant's data key in another store (the
key store), which the command line cannot open as such: ``erase`` on the key store's URL, tenant
``chatkeep-data-keys``, session ``TENANT`` deletes that key (docs/cli.md shows it).
"""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any, NamedTuple

from chatkeep.core._errors import redact_url
from chatkeep.core.backend import HistoryStore, SessionKey
from chatkeep.core.cli._app import store_url
from chatkeep.core.cli._inspect import _confirm, _missing, open_existing_store
from chatkeep.core.cli._output import emit_json, iso, plural, printable, say, table, when

__all__ = ["erase", "tenants_list"]

#: Sessions per list_sessions page while counting what a tenant holds.
PAGE = 500


async def tenants_list(args: argparse.Namespace) -> int:
    """Print every tenant that holds at least one session, sorted."""
    url = store_url(args)
    async with open_existing_store(url) as store:
        tenants = await store.list_tenants()
    if args.json:
        emit_json({"store": redact_url(url), "tenants": tenants})
    elif not tenants:
        say(f"no tenants in {redact_url(url)}")
    else:
        for tenant in tenants:
            say(printable(tenant))
    return 0


class _Found(NamedTuple):
    """A session erase removes: its id, message count and last update (``None``: not listed, one ``--session``)."""

    session_id: str
    messages: int
    updated_at: datetime | None = None


async def _tenant_sessions(store: HistoryStore, tenant: str) -> list[_Found]:
    """Every session of ``tenant`` as listed now, newest first."""
    found: list[_Found] = []
    cursor: str | None = None
    while True:
        page = await store.list_sessions(tenant, limit=PAGE, cursor=cursor)
        found += [_Found(info.session_id, info.message_count, info.updated_at) for info in page.items]
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor


async def erase(args: argparse.Namespace) -> int:
    """Remove a tenant's sessions (or, with ``--session``, one of them): messages and session documents.

    It asks first unless ``--yes``; ``--dry-run`` says what it would remove and removes nothing. Erasing what is
    not there is done (status 0): the command says there was nothing to erase. A session the tenant gains while
    it runs (a writer still at work) is reported, with status 1.
    """
    url, tenant = store_url(args), str(args.tenant)
    key = None if args.session is None else SessionKey(tenant, args.session)
    shown, what = redact_url(url), _scope(tenant, args.session)
    async with open_existing_store(url) as store:
        store.sealed_passthrough = True  # erase reads no contents: encrypted sessions go as they are stored
        if key is None:
            found = await _tenant_sessions(store, tenant)
        else:
            found = [] if await _missing(store, key) else [_Found(key.session_id, await store.count(key))]
        messages = sum(f.messages for f in found)
        if not found or args.dry_run:
            return _dry_run(args, shown, what, found)
        question = f"Erase {what} from {shown}: {_amount(len(found), messages)}, for good?"
        if not args.yes and not await _confirm(question, refused=f"not erasing {what}", yes_to="erase without asking"):
            say("nothing erased")
            return 1
        if key is None:
            removed = await store.delete_tenant(tenant)
            left = len(await _tenant_sessions(store, tenant))
        else:
            removed = int(await store.delete(key))
            left = 0 if await _missing(store, key) else 1
    if args.json:
        emit_json(_summary(args, shown, found, removed=removed, left=left))
    else:
        say(f"erased {what} from {shown}: {_amount(removed, messages)}")
    if left:
        say(
            f"chatkeep: {plural(left, 'session')} of tenant {printable(repr(tenant))} appeared while erasing (a "
            "writer still uses it); stop its writers and run the same erase again",
            err=True,
        )
        return 1
    return 0


def _amount(sessions: int, messages: int) -> str:
    """``2 sessions with 8 messages (and their session documents)``."""
    whose = "its session document" if sessions == 1 else "their session documents"
    return f"{plural(sessions, 'session')} with {plural(messages, 'message')} (and {whose})"


def _scope(tenant: str, session_id: str | None) -> str:
    if session_id is None:
        return f"tenant {printable(repr(tenant))}"
    return f"session {printable(repr(session_id))} of tenant {printable(repr(tenant))}"


def _summary(args: argparse.Namespace, shown: str, found: list[_Found], *, removed: int, left: int) -> dict[str, Any]:
    return {
        "store": shown,
        "tenant": args.tenant,
        "session_id": args.session,
        "dry_run": bool(args.dry_run),
        "sessions": removed,
        "messages": sum(f.messages for f in found),
        "remaining_sessions": left,
    }


def _dry_run(args: argparse.Namespace, shown: str, what: str, found: list[_Found]) -> int:
    """What ``--dry-run`` prints (also what erase says when there is nothing to erase): status 0."""
    if args.json:
        # With --dry-run, "sessions" and "messages" are what it would erase; without, there was nothing.
        report = _summary(args, shown, found, removed=len(found), left=0)
        if args.dry_run:
            report["would_erase"] = [
                {"session_id": f.session_id, "message_count": f.messages}
                | ({} if f.updated_at is None else {"updated_at": iso(f.updated_at)})
                for f in found
            ]
        emit_json(report)
        return 0
    if not found:
        say(f"nothing to erase: no {what} in {shown}")
        return 0
    messages = sum(f.messages for f in found)
    say(f"would erase {what} from {shown}: {_amount(len(found), messages)} (--dry-run: nothing erased)")
    if args.session is None:
        rows = [(f.session_id, f.messages, "" if f.updated_at is None else when(f.updated_at)) for f in found]
        table(("SESSION", "MESSAGES", "UPDATED (UTC)"), rows, right=(1,))
    return 0
