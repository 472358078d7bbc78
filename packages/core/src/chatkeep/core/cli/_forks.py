"""``chatkeep sessions fork`` and ``chatkeep sessions tag``: branch a session, tag it, title it."""

from __future__ import annotations

import argparse
import uuid

from chatkeep.core._errors import redact_url
from chatkeep.core.backend import SessionKey
from chatkeep.core.cli._app import store_url
from chatkeep.core.cli._inspect import open_existing_store, tenant_of
from chatkeep.core.cli._output import UsageError, emit_json, plural, printable, say

__all__ = ["sessions_fork", "sessions_tag"]


async def sessions_fork(args: argparse.Namespace) -> int:
    """Fork a session into a new one (``--as``, or a random id) through ``--through`` (default: its newest message)."""
    url, tenant = store_url(args), tenant_of(args)
    source = SessionKey(tenant, args.session_id)
    target = SessionKey(tenant, args.new_id or f"{args.session_id[:900]}-fork-{uuid.uuid4().hex[:8]}")
    async with open_existing_store(url) as store:
        held = await store.fork(source, target, through=args.through)
    if args.json:
        emit_json({"tenant": tenant, "source": source.session_id, "session_id": target.session_id, "messages": held})
    else:
        through = f" through message {printable(args.through)}" if args.through else ""
        say(
            f"forked session {printable(source.session_id)}{through} into {printable(target.session_id)} "
            f"(tenant {printable(tenant)}, {plural(held, 'message')}); nothing was copied"
        )
    return 0


async def sessions_tag(args: argparse.Namespace) -> int:
    """Set a session's tags to the ones given (``--clear``: none), and its title with ``--title``."""
    if args.tags and args.clear:
        raise UsageError("give tags, or --clear to remove them all, not both")
    if not args.tags and not args.clear and args.title is None:
        raise UsageError("give the session's tags (they replace its tags), --clear, or --title TEXT")
    url, tenant = store_url(args), tenant_of(args)
    key = SessionKey(tenant, args.session_id)
    tags = frozenset(args.tags) if args.tags or args.clear else None
    async with open_existing_store(url) as store:
        found = await store.update_info(key, title=args.title, tags=tags)
    if not found:
        say(
            f"chatkeep: no session {key.session_id!r} in tenant {key.tenant!r} of {redact_url(url)}; "
            "list them with: chatkeep sessions list",
            err=True,
        )
        return 1
    if args.json:
        listed = None if tags is None else sorted(tags)
        emit_json({"tenant": tenant, "session_id": key.session_id, "tags": listed, "title": args.title})
    else:
        shown = "unchanged" if tags is None else ", ".join(sorted(tags)) or "none"
        title = "" if args.title is None else f", title {printable(repr(args.title))}"
        say(f"session {printable(key.session_id)} (tenant {printable(tenant)}): tags {shown}{title}")
    return 0
