"""Commands that look at and look after a store: backends, doctor, sessions list/show/delete, prune, migrate."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from time import perf_counter
from typing import Any

from chatkeep.core._errors import (
    ChatkeepError,
    DamagedListingError,
    EncryptedSessionError,
    SessionFormatError,
    StoreConfigurationError,
    StoreFullError,
    StoreNotFoundError,
    StoreUnavailableError,
    UnknownBackendError,
    redact_url,
)
from chatkeep.core._messages import (
    DataContent,
    FunctionCallContent,
    FunctionResultContent,
    Message,
    TextContent,
    UriContent,
    UsageContent,
)
from chatkeep.core._session import DEFAULT_TENANT
from chatkeep.core.backend import (
    HistoryStore,
    SessionInfo,
    SessionKey,
    SupportsExistenceCheck,
    SupportsMigrate,
    SupportsSchemaRevision,
)
from chatkeep.core.backend._checks import prune_cutoff
from chatkeep.core.backend._sealed import KEYS_TENANT
from chatkeep.core.cli._app import store_url
from chatkeep.core.cli._damaged import DAMAGE, DamagedSessions
from chatkeep.core.cli._info import info_columns, info_fields
from chatkeep.core.cli._output import UsageError, emit_json, iso, plural, printable, printable_lines, say, table, when
from chatkeep.core.plugins import default_registry, installed_backends, open_store, plugin_failures

__all__ = [
    "DOCTOR_SAMPLE",
    "backend_label",
    "backends",
    "doctor",
    "first_round_trip",
    "migrate",
    "open_existing_store",
    "prune",
    "render",
    "sample_detail",
    "sample_sessions",
    "sessions_delete",
    "sessions_list",
    "sessions_show",
]


@contextlib.asynccontextmanager
async def open_existing_store(url: str) -> AsyncIterator[HistoryStore]:
    """Open the store for a command that only reads or deletes: one whose storage does not exist is an error.

    Opening creates storage on first use (a SQLite file); for a misspelled path, a read command would create
    an empty store and report no sessions. A store that can tell (:class:`SupportsExistenceCheck`) is asked first.

    Raises:
        StoreNotFoundError: the store's storage does not exist; nothing was created.
    """
    async with open_store(url) as store:
        missing = await store.missing_storage() if isinstance(store, SupportsExistenceCheck) else None
        if missing is not None:
            raise StoreNotFoundError(
                f"{missing} does not exist, so {redact_url(url)} holds no sessions and was not created; check the "
                "path in --store (or $CHATKEEP_STORE). Commands that write (import, chat, doctor, migrate) create it"
            )
        yield store


def tenant_of(args: argparse.Namespace) -> str:
    """The ``--tenant`` given (never empty: the parser refuses that), else the default tenant."""
    return str(args.tenant) if args.tenant is not None else DEFAULT_TENANT


# -- backends ------------------------------------------------------------------------------------


def backends(args: argparse.Namespace) -> int:
    """List the installed backend plugins, and the plugins found but unusable with their error."""
    found = installed_backends()
    failures = sorted(plugin_failures().items())
    if args.json:
        emit_json(
            {
                "backends": [
                    {
                        "name": b.name,
                        "schemes": list(b.schemes),
                        "distribution": b.distribution,
                        "version": b.version,
                        "description": b.description,
                    }
                    for b in found
                ],
                "broken": [{"plugin": plugin, "error": error} for plugin, error in failures],
            }
        )
        return 0
    if found:
        rows = [(b.name, ", ".join(f"{s}://" for s in b.schemes), b.distribution, b.version) for b in found]
        table(("BACKEND", "URL SCHEMES", "DISTRIBUTION", "VERSION"), rows)
    else:
        say('No backends installed. Install one, e.g.: pip install "chatkeep-core[sqlite]"')
    for plugin, error in failures:
        say(f"broken plugin {plugin!r}: {error}")
    return 0


# -- doctor --------------------------------------------------------------------------------------

#: How many of a tenant's newest sessions ``doctor`` reads (the newest message of each).
DOCTOR_SAMPLE = 20


def _hint(exc: BaseException, shown: str) -> str:
    """What to do about a failed check, beyond what the error itself says."""
    if isinstance(exc, UnknownBackendError):
        return "install the backend named above, or fix the URL's scheme (chatkeep backends lists what is installed)"
    if isinstance(exc, StoreFullError):
        return "free space where the store keeps its data (or raise its quota); what it stored before is intact"
    if isinstance(exc, StoreUnavailableError) and str(exc).startswith("the database at sqlite"):
        return "make sure the SQLite file's folder exists and is writable by this user, or give another --store"
    if isinstance(exc, StoreUnavailableError):
        return (
            "start the server or fix the host, port and credentials in the URL; for a slow network, raise the "
            "store's connect timeout (e.g. ?connect_timeout=30: the SQL, Redis and Blob backends all take it)"
        )
    if type(exc).__name__ == "SchemaVersionError":
        return (
            f"an older schema: run chatkeep migrate --store {shlex.quote(shown)} (back the database up first); "
            "a newer one: upgrade chatkeep-sql"
        )
    if isinstance(exc, StoreConfigurationError):
        return "fix the URL or option named above; the backend's page in the documentation lists its options"
    return "the error above names what failed"


def backend_label(url: str) -> str:
    """The backend a URL names and the distribution providing it, e.g. ``sql, chatkeep-sql 0.1.0``.

    Raises:
        UnknownBackendError: no installed backend handles the URL's scheme.
    """
    spec = default_registry().resolve(url)
    info = next((b for b in installed_backends() if b.name == spec.name), None)
    return spec.name if info is None else f"{spec.name}, {info.distribution} {info.version}"


async def first_round_trip(store: HistoryStore, key: SessionKey) -> str | None:
    """The first call to a store, which connects: the schema revision when the store keeps one, else a count.

    It reads only, so ``chatkeep ui`` takes its latency as ``doctor`` does without writing a probe.
    """
    revision = await store.schema_revision() if isinstance(store, SupportsSchemaRevision) else None
    if revision is None:
        await store.count(key)
    return revision


async def sample_sessions(store: HistoryStore, tenant: str) -> dict[str, Any]:
    """Read the newest message of the tenant's newest sessions: which are encrypted, and whether this is a key store.

    A store opened without keys cannot read what ``EncryptedStore`` sealed; saying so here spares a surprise in
    ``sessions show`` or in an application configured without the wrapper.
    """
    page = await store.list_sessions(tenant, limit=DOCTOR_SAMPLE)
    encrypted: list[str] = []
    for info in page.items:
        try:
            await store.load(SessionKey(tenant, info.session_id), last=1)
        except EncryptedSessionError:
            encrypted.append(info.session_id)
    key_store = bool((await store.list_sessions(KEYS_TENANT, limit=1)).items)
    return {"tenant": tenant, "sampled": len(page.items), "encrypted": encrypted, "key_store": key_store}


def sample_detail(sample: dict[str, Any]) -> str:
    tenant, sampled, encrypted = repr(sample["tenant"]), sample["sampled"], sample["encrypted"]
    if not sampled:
        detail = f"tenant {tenant} has no sessions"
    elif not encrypted:
        detail = f"the {plural(sampled, 'newest session')} of tenant {tenant} read, none encrypted"
    else:
        detail = (
            f"{len(encrypted)} of the {plural(sampled, 'newest session')} of tenant {tenant} are encrypted "
            f"({', '.join(map(repr, encrypted[:3]))}{', ...' if len(encrypted) > 3 else ''}): this command has no "
            "keys, so read them through EncryptedStore in your code (export and copy move them sealed)"
        )
    if sample["key_store"]:
        detail += "; it holds EncryptedStore data keys (a key store): back it up, never prune it"
    return printable(detail)


async def doctor(args: argparse.Namespace) -> int:
    """Connect, write a probe in a tenant of its own, read it back, delete it; report latency and the schema.

    Then read the newest message of the ``--tenant``'s newest sessions, and say which are encrypted.
    """
    url = store_url(args)
    shown = redact_url(url)
    report: dict[str, Any] = {
        "store": shown,
        "backend": None,
        "ok": False,
        "checks": [],
        "schema_revision": None,
        "sessions": None,
    }

    def check(name: str, ms: float | None, detail: str, *, ok: bool = True) -> None:
        report["checks"].append({"name": name, "ok": ok, "ms": None if ms is None else round(ms, 2), "detail": detail})

    def finish(failure: BaseException | None) -> int:
        if failure is not None:
            report["error"] = {"type": type(failure).__name__, "message": redact_url(str(failure))}
            report["fix"] = _hint(failure, shown)
        report["ok"] = failure is None
        if args.json:
            emit_json(report)
        else:
            say(f"chatkeep doctor: {shown}" + (f" (backend {report['backend']})" if report["backend"] else ""))
            rows = [
                (c["name"], "ok" if c["ok"] else "FAILED", "" if c["ms"] is None else f"{c['ms']:.1f} ms", c["detail"])
                for c in report["checks"]
            ]
            table(("CHECK", "RESULT", "TIME", "DETAIL"), rows, right=(2,))
            if failure is not None:
                say(f"error: {report['error']['message']}")
                say(f"fix: {report['fix']}")
            else:
                say("the store works")
        return 0 if failure is None else 1

    try:
        report["backend"] = backend_label(url)
        store = open_store(url)
    except ChatkeepError as exc:
        check("open", None, "the URL names no usable store", ok=False)
        return finish(exc)
    key = SessionKey(f"chatkeep-doctor-{uuid.uuid4().hex[:12]}", "probe")
    report["probe_tenant"] = key.tenant
    probe = Message(role="user", text="chatkeep doctor probe \u2713")
    step, wrote = "connect", False
    try:
        async with store:
            try:
                started = perf_counter()
                try:
                    # The first round trip connects; a store with a schema checks it on that call anyway.
                    revision = await first_round_trip(store, key)
                except StoreConfigurationError as exc:
                    if type(exc).__name__ == "SchemaVersionError":
                        step = "schema"
                    raise
                check("connect", (perf_counter() - started) * 1000, "first round trip, connecting")
                if revision is not None:
                    report["schema_revision"] = revision
                    check("schema", None, f"revision {revision}")
                step, wrote = "write", True
                started = perf_counter()
                await store.append(key, [probe])
                check("write", (perf_counter() - started) * 1000, f"a probe message in tenant {key.tenant}")
                step = "read back"
                started = perf_counter()
                loaded = await store.load(key)
                elapsed = (perf_counter() - started) * 1000
                if [m.to_record() for m in loaded] != [probe.to_record()]:
                    raise StoreConfigurationError(
                        f"the store returned {len(loaded)} message(s) that differ from the probe it was given; "
                        "the backend does not keep messages exactly"
                    )
                check("read back", elapsed, "the same message came back")
            finally:
                if wrote:
                    step = "clean up"
                    started = perf_counter()
                    removed = await store.delete_tenant(key.tenant)
                    check(
                        "clean up",
                        (perf_counter() - started) * 1000,
                        f"probe tenant deleted ({plural(removed, 'session')})",
                    )
            step = "sessions"
            started = perf_counter()
            report["sessions"] = await sample_sessions(store, tenant_of(args))
            check("sessions", (perf_counter() - started) * 1000, sample_detail(report["sessions"]))
    except ChatkeepError as exc:
        check(step, None, "see the error below", ok=False)
        return finish(exc)
    return finish(None)


# -- sessions ------------------------------------------------------------------------------------


async def sessions_list(args: argparse.Namespace) -> int:
    """One page of a tenant's sessions, newest first, with message counts; a damaged session is named.

    Each listed session's document is read, so a damaged one (or damaged metadata) is found here; damaged
    message records are found by the commands that read them (``export``, ``copy``, ``sessions show``). An
    entry so damaged that it names no session (:class:`DamagedListingError`) is named where it is stored.
    """
    url, tenant = store_url(args), tenant_of(args)
    damage = DamagedSessions(args, "sessions list", after="")
    damaged: dict[str, str] = {}
    unnamed: DamagedListingError | None = None
    async with open_existing_store(url) as store:
        try:
            page = await store.list_sessions(tenant, tag=args.tag, limit=args.limit, cursor=args.cursor)
        except DamagedListingError as exc:
            page, unnamed = exc.page, exc
        for info in page.items:
            try:
                await store.load_session(SessionKey(tenant, info.session_id))
            except DAMAGE as exc:
                damaged[info.session_id] = str(exc)
    entries = list(unnamed.entries) if unnamed is not None else []
    if damage.skip:
        if unnamed is not None:
            damage.found_in_listing(tenant, unnamed)
        for info in page.items:
            if info.session_id in damaged:
                damage.found(SessionKey(tenant, info.session_id), SessionFormatError(damaged[info.session_id]))
    shown = [s for s in page.items if not (damage.skip and s.session_id in damaged)]
    status = damage.exit_status(1 if (damaged or entries) and not damage.skip else 0)
    if args.json:
        items = [
            {
                "session_id": s.session_id,
                "tenant": s.tenant,
                "message_count": s.message_count,
                "created_at": iso(s.created_at),
                "updated_at": iso(s.updated_at),
                "damaged": damaged.get(s.session_id),
                **info_fields(s),
            }
            for s in shown
        ]
        listing = {"tenant": tenant, "sessions": items, "next_cursor": page.next_cursor}
        unlisted = [] if damage.skip else entries  # with --skip-damaged they are in "skipped"
        emit_json({**listing, "damaged_entries": unlisted, "skipped": damage.skipped})
        return status
    if not page.items and not entries:
        say(f"no sessions for tenant {tenant!r} in {redact_url(url)}")
        return 0
    headers, rows = info_columns(
        ("SESSION", "MESSAGES", "CREATED (UTC)", "UPDATED (UTC)"),
        [(s, (s.session_id, s.message_count, when(s.created_at), when(s.updated_at))) for s in shown],
    )
    rows = [(*row, "DAMAGED" * (s.session_id in damaged)) for s, row in zip(shown, rows, strict=True)]
    table((*headers, ""), rows, right=(1, *(n for n, h in enumerate(headers) if h == "TOKENS")))
    if page.next_cursor:
        command = ["chatkeep", "sessions", "list", "--store", redact_url(url), "--tenant", tenant]
        command += ["--tag", args.tag] if args.tag else []
        say(f"more sessions: {shlex.join([*command, '--limit', str(args.limit), '--cursor', page.next_cursor])}")
    if damage.skip:
        if damage.skipped:
            say(damage.summary(), err=True)
        return status
    for session_id, why in damaged.items():
        say(
            f"chatkeep: session {printable(repr(session_id))} of tenant {printable(repr(tenant))} is damaged: {why}",
            err=True,
        )
    for entry in entries:
        say(
            f"chatkeep: tenant {printable(repr(tenant))} holds a damaged entry that names no session: {entry}", err=True
        )
    if damaged:
        say(
            f"chatkeep: {plural(len(damaged), 'damaged session')} listed (marked DAMAGED); --skip-damaged leaves "
            "them out",
            err=True,
        )
    if entries:
        say(
            f"chatkeep: damaged entries that name no session: {len(entries)}, not listed; --skip-damaged "
            "names them and exits 3",
            err=True,
        )
    return status


def _short(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def render(message: Message) -> str:
    """A message as a transcript shows it: time, role, then each content (tool calls and results included)."""
    who = message.role if not message.author_name else f"{message.role} ({message.author_name})"
    parts: list[str] = []
    for content in message.contents:
        if isinstance(content, TextContent):
            parts.append(_short(content.text))
        elif isinstance(content, FunctionCallContent):
            parts.append(f"-> calls {content.name}({_short(content.arguments, 500)}) [{content.call_id}]")
        elif isinstance(content, FunctionResultContent):
            label = "error" if content.is_error else "result"
            result = _short(json.dumps(content.result, ensure_ascii=False), 500)
            parts.append(f"<- {label} of [{content.call_id}]: {result}")
        elif isinstance(content, DataContent):
            parts.append(f"[data {content.media_type}, {len(content.data):,} base64 characters]")
        elif isinstance(content, UriContent):
            parts.append(f"[{content.media_type or 'uri'} {content.uri}]")
        elif isinstance(content, UsageContent):
            usage = content.usage
            parts.append(f"[usage: {usage.input_tokens} in, {usage.output_tokens} out]")
    # A text's own lines stay lines, indented under the message's; every other control character is escaped.
    body = printable_lines("\n".join(parts)).replace("\n", "\n    ")
    return f"[{when(message.created_at)}] {printable(who)}: {body}"


async def _missing(store: HistoryStore, key: SessionKey) -> bool:
    return await store.count(key) == 0 and await store.load_session(key) is None


def _not_found(key: SessionKey, url: str) -> int:
    say(
        f"chatkeep: no session {key.session_id!r} in tenant {key.tenant!r} of {redact_url(url)}; "
        "list them with: chatkeep sessions list",
        err=True,
    )
    return 1


async def sessions_show(args: argparse.Namespace) -> int:
    """Print a session's transcript, streaming it in pages (``--last N``: only the newest N)."""
    url = store_url(args)
    key = SessionKey(tenant_of(args), args.session_id)
    async with open_existing_store(url) as store:
        if await _missing(store, key):
            return _not_found(key, url)
        messages: Any = (
            store.iter_messages(key, batch=500) if args.last is None else _aiter(await store.load(key, last=args.last))
        )
        write: Callable[[str], object] = sys.stdout.write
        if args.json:
            write(f'{{"tenant":{_quote(key.tenant)},"session_id":{_quote(key.session_id)},"messages":[')
            first = True
            async for message in messages:
                write(("" if first else ",") + message.to_record())
                first = False
            write("]}\n")
            sys.stdout.flush()
            return 0
        count = await store.count(key)
        say(f"session {printable(key.session_id)} (tenant {printable(key.tenant)}): {plural(count, 'message')}")
        async for message in messages:
            write(render(message) + "\n")
        sys.stdout.flush()
    return 0


async def _aiter(items: list[Message]) -> Any:
    for item in items:
        yield item


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


async def _confirm(question: str, *, refused: str, yes_to: str) -> bool:
    """Ask ``question`` on the terminal; without one, refuse (a usage error) and name the ``--yes`` that skips it."""
    if not sys.stdin.isatty():
        raise UsageError(f"{refused}: stdin is not a terminal to ask on; add --yes to {yes_to}")
    answer = await asyncio.to_thread(input, f"{question} [y/N] ")
    return answer.strip().lower() in {"y", "yes"}


async def sessions_delete(args: argparse.Namespace) -> int:
    """Delete a session (its history and its document), after asking unless ``--yes``."""
    url = store_url(args)
    key = SessionKey(tenant_of(args), args.session_id)
    async with open_existing_store(url) as store:
        if await _missing(store, key):
            return _not_found(key, url)
        count = await store.count(key)
        question = (
            f"Delete session {key.session_id!r} of tenant {key.tenant!r} ({count} messages) from {redact_url(url)}?"
        )
        if not args.yes and not await _confirm(
            question, refused=f"not deleting session {key.session_id!r}", yes_to="delete without asking"
        ):
            say("not deleted")
            return 1
        deleted = await store.delete(key)
    if args.json:
        emit_json({"tenant": key.tenant, "session_id": key.session_id, "deleted": deleted, "messages": count})
    else:
        say(f"deleted session {printable(key.session_id)} (tenant {printable(key.tenant)}, {count} messages)")
    return 0


# -- prune and migrate ---------------------------------------------------------------------------


async def _idle(store: HistoryStore, tenant: str, cutoff: datetime) -> list[SessionInfo]:
    """The tenant's sessions not updated since ``cutoff``: what ``prune`` would delete now."""
    idle: list[SessionInfo] = []
    cursor: str | None = None
    while True:
        page = await store.list_sessions(tenant, limit=500, cursor=cursor)
        idle += [info for info in page.items if info.updated_at < cutoff]
        if page.next_cursor is None:
            return idle
        cursor = page.next_cursor


async def prune(args: argparse.Namespace) -> int:
    """Delete the sessions of a tenant (or, with ``--all-tenants``, of all) not updated for ``--older-than``.

    It asks first unless ``--yes``; ``--dry-run`` lists what it would delete and deletes nothing.
    """
    if args.all_tenants and args.tenant is not None:
        raise UsageError("give --tenant or --all-tenants, not both")
    if not args.all_tenants and args.tenant is None:
        raise UsageError("say which sessions to prune: --tenant TENANT, or --all-tenants for every tenant")
    url = store_url(args)
    tenant = None if args.all_tenants else str(args.tenant)
    cutoff = prune_cutoff(args.older_than)
    scope = "every tenant" if tenant is None else f"tenant {printable(repr(tenant))}"
    async with open_existing_store(url) as store:
        if args.dry_run:  # every tenant's idle sessions, one tenant after another, as list_tenants names them
            tenants = [tenant] if tenant is not None else await store.list_tenants()
            return _report_dry_run(args, tenant, cutoff, [s for t in tenants for s in await _idle(store, t, cutoff)])
        idle = None if tenant is None else await _idle(store, tenant, cutoff)
        if not args.yes and idle != []:
            what = "every session" if idle is None else plural(len(idle), "session")
            question = f"Delete {what} of {scope} not updated since {when(cutoff)} UTC from {redact_url(url)}?"
            if not await _confirm(
                question, refused="not pruning", yes_to="prune without asking (--dry-run lists what it would delete)"
            ):
                say("not pruned")
                return 1
        deleted = await store.prune(older_than=cutoff, tenant=tenant)
    if args.json:
        emit_json({"deleted": deleted, "tenant": tenant, "cutoff": iso(cutoff)})
    else:
        say(f"pruned {plural(deleted, 'session')} of {scope} not updated since {when(cutoff)} UTC")
    return 0


def _report_dry_run(args: argparse.Namespace, tenant: str | None, cutoff: datetime, idle: list[SessionInfo]) -> int:
    if args.json:
        sessions = [
            {"session_id": s.session_id, "message_count": s.message_count, "updated_at": iso(s.updated_at)}
            | ({} if tenant is not None else {"tenant": s.tenant})
            for s in idle
        ]
        emit_json({"dry_run": True, "would_delete": sessions, "tenant": tenant, "cutoff": iso(cutoff)})
        return 0
    scope = "every tenant" if tenant is None else f"tenant {printable(repr(tenant))}"
    say(
        f"would prune {plural(len(idle), 'session')} of {scope} not updated since {when(cutoff)} UTC "
        "(--dry-run: nothing deleted)"
    )
    if idle and tenant is not None:
        rows = [(s.session_id, s.message_count, when(s.updated_at)) for s in idle]
        table(("SESSION", "MESSAGES", "UPDATED (UTC)"), rows, right=(1,))
    elif idle:
        with_tenant = [(s.tenant, s.session_id, s.message_count, when(s.updated_at)) for s in idle]
        table(("TENANT", "SESSION", "MESSAGES", "UPDATED (UTC)"), with_tenant, right=(2,))
    return 0


async def migrate(args: argparse.Namespace) -> int:
    """Create or upgrade the store's schema in place, through ``SupportsMigrate``."""
    url = store_url(args)
    shown = redact_url(url)
    async with open_store(url) as store:
        # Backends with a schema (sql) support migrate(); the others have nothing to upgrade.
        revision = await store.migrate() if isinstance(store, SupportsMigrate) else None
    if args.json:
        emit_json({"store": shown, "has_schema": revision is not None, "revision": revision})
    elif revision is None:
        say(f"{shown}: this backend keeps no schema, so it needs no migrations")
    else:
        say(f"{shown}: schema at revision {revision}")
    return 0
