"""The ``chatkeep`` command: a demo of a conversation kept across processes, and tools to look at stores."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chatkeep.core._agent import Agent
from chatkeep.core._chat import ChatClient
from chatkeep.core._errors import ChatkeepError, StoreConfigurationError, redact_url
from chatkeep.core._providers import InMemoryHistoryProvider
from chatkeep.core._session import DEFAULT_TENANT, AgentSession
from chatkeep.core.backend import SessionKey, SupportsMigrate
from chatkeep.core.plugins import default_registry, installed_backends, open_store, plugin_failures

__all__ = ["main"]

DEFAULT_STORE = "sqlite://"
STORE_HELP = "backend URL (default: sqlite://, the SQLite file under your user data folder)"
DEMO_TURNS = ("Remember that I like Italian food.", "What kind of food do I like?")
DEMO_INSTRUCTIONS = "You are a helpful assistant. Answer in one or two sentences."


def _client() -> tuple[ChatClient, str]:
    """The OpenAI-compatible model the environment configures, else the offline model."""
    if os.environ.get("OPENAI_API_KEY") or os.environ.get("OPENAI_BASE_URL"):
        from chatkeep.core.openai import OpenAIChatClient

        client = OpenAIChatClient()
        return client, f"OpenAI-compatible model {getattr(client, 'model', '?')!r}"
    from chatkeep.core.offline import OfflineChatClient

    return OfflineChatClient(), "the built-in offline demo model (set OPENAI_API_KEY and OPENAI_MODEL for a real one)"


def _print(text: str = "") -> None:
    print(text, flush=True)


# -- demo ----------------------------------------------------------------------------------------


async def _demo_turn(step: int, saved: dict[str, Any] | None, store_url: str | None) -> dict[str, Any] | None:
    """One process of the demo: returns the session to save, or ``None`` when the check failed."""
    client, _ = _client()
    history = store_url if store_url else InMemoryHistoryProvider()
    async with Agent(client, name="DemoAgent", instructions=DEMO_INSTRUCTIONS, history=history) as agent:
        if step == 1:
            session = agent.create_session()
        else:
            session = AgentSession.from_dict(saved or {})
            provider = agent.history_provider
            stored = (
                await provider.get_messages(
                    session.session_id, state=session.state.get(provider.source_id), session=session
                )
                if provider
                else []
            )
            _print(f"loaded session {session.session_id} with {len(stored)} stored messages")
            if not any(m.text == DEMO_TURNS[0] for m in stored):
                _print("error: the first process's message is not in the stored history")
                return None
        prompt = DEMO_TURNS[step - 1]
        _print(f"you:   {prompt}")
        print("agent: ", end="", flush=True)
        async for update in agent.run_stream(prompt, session=session):
            print(update.text, end="", flush=True)
        _print()
        return session.to_dict()


def _demo_process(args: argparse.Namespace) -> int:
    session_file: Path = args.session_file
    saved = json.loads(session_file.read_text(encoding="utf-8")) if args.step == 2 else None
    session = asyncio.run(_demo_turn(args.step, saved, args.store))
    if session is None:
        return 1
    session_file.write_text(json.dumps(session, ensure_ascii=False, indent=2), encoding="utf-8")
    if args.step == 1:
        _print(f"saved session {session['session_id']} to {session_file}")
    return 0


def _sqlite_installed() -> bool:
    try:
        default_registry().resolve("sqlite://")
    except ChatkeepError:
        return False
    return True


def _default_store() -> str | None:
    """The CLI's store when none is named: the SQLite file store (under the user's data folder), if installed."""
    return DEFAULT_STORE if _sqlite_installed() else None


def _store_of(args: argparse.Namespace) -> str:
    store: str | None = args.store or _default_store()
    if store is None:
        raise StoreConfigurationError(
            "no --store given and the default SQLite store is not installed; pass --store URL, "
            'or run: pip install "chatkeep-core[sqlite]"'
        )
    return store


def _demo(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    session_file = state_dir / "session.json"
    where = f"the session itself, saved as JSON to {session_file}"
    if args.store is None and not args.in_session and _sqlite_installed():
        # The embedded default: a SQLite file beside the demo's session, so the demo leaves nothing elsewhere.
        database = (state_dir / "history.db").resolve()
        args.store = f"sqlite:///{database}"
        where = f"a SQLite file, {database} (the embedded default store)"
    elif args.store:
        where = f"the {redact_url(args.store)} store"
    _, model = _client()
    _print("chatkeep demo: one conversation, kept across two separate processes")
    _print(f"  model:   {model}")
    _print(f"  history: {where}")
    for step, title in ((1, "talks and stores"), (2, "resumes from what was stored")):
        _print()
        _print(f"-- process {step}: {title} --")
        command = [sys.executable, "-m", "chatkeep.core.cli", "_demo-turn", str(step), str(session_file)]
        if args.store:
            command += ["--store", args.store]
        result = subprocess.run(command, check=False)
        if result.returncode != 0:
            _print(f"\nthe demo failed in process {step} (exit code {result.returncode})")
            return result.returncode
    _print()
    _print("done: the second process answered with the history the first one stored.")
    return 0


# -- store inspection ----------------------------------------------------------------------------


def _backends(_args: argparse.Namespace) -> int:
    backends = installed_backends()
    if not backends:
        _print('No backends installed. Install one, e.g.: pip install "chatkeep-core[memory]"')
    rows = [
        (info.name, ", ".join(f"{s}://" for s in info.schemes), f"{info.distribution} {info.version}")
        for info in backends
    ]
    widths = [max((len(row[i]) for row in rows), default=0) for i in range(2)]
    for name, schemes, distribution in rows:
        _print(f"{name:<{widths[0]}}  {schemes:<{widths[1]}}  {distribution}".rstrip())
    for plugin, reason in sorted(plugin_failures().items()):
        _print(f"unusable plugin {plugin!r}: {reason}")
    return 0


async def _sessions(args: argparse.Namespace) -> int:
    url = _store_of(args)
    async with open_store(url) as store:
        page = await store.list_sessions(args.tenant, limit=args.limit, cursor=args.cursor)
        if not page.items:
            _print(f"no sessions for tenant {args.tenant!r} in {redact_url(url)}")
        for info in page.items:
            _print(f"{info.session_id}  {info.message_count:>6} messages  updated {info.updated_at:%Y-%m-%d %H:%M:%S}")
        if page.next_cursor:
            _print(
                f"more sessions: chatkeep sessions --store {shlex.quote(redact_url(url))} --tenant "
                f"{shlex.quote(args.tenant)} --limit {args.limit} --cursor {page.next_cursor}"
            )
    return 0


async def _history(args: argparse.Namespace) -> int:
    async with open_store(_store_of(args)) as store:
        messages = await store.load(SessionKey(args.tenant, args.session_id), last=args.last)
        if not messages:
            _print(f"session {args.session_id!r} (tenant {args.tenant!r}) has no stored messages")
        for message in messages:
            body = message.text or ", ".join(c.type for c in message.contents)
            _print(f"[{message.created_at:%Y-%m-%d %H:%M:%S}] {message.role}: {body}")
    return 0


async def _migrate(args: argparse.Namespace) -> int:
    args.store = _store_of(args)
    async with open_store(args.store) as store:
        # Backends with a schema (sql) support migrate(); the others have nothing to upgrade.
        if not isinstance(store, SupportsMigrate):
            _print(f"{redact_url(args.store)}: this backend keeps no schema, so it needs no migrations")
            return 0
        revision = await store.migrate()
        _print(f"{redact_url(args.store)}: schema at revision {revision}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chatkeep", description="Store and resume AI-agent conversations.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser("demo", help="show a conversation kept across two processes")
    demo.add_argument(
        "--store", help="keep history in this backend URL (default: a SQLite file in the state dir, when installed)"
    )
    demo.add_argument("--in-session", action="store_true", help="keep history inside the session instead of a store")
    demo.add_argument(
        "--state-dir", default=".chatkeep-demo", help="where the demo saves the session (default: %(default)s)"
    )
    demo.set_defaults(run=_demo)
    backends = commands.add_parser("backends", help="list installed storage backends")
    backends.set_defaults(run=_backends)
    sessions = commands.add_parser("sessions", help="list a tenant's stored sessions, newest first")
    sessions.add_argument("--store", help=STORE_HELP)
    sessions.add_argument("--tenant", default=DEFAULT_TENANT)
    sessions.add_argument("--limit", type=int, default=20, help="sessions per page (default: %(default)s)")
    sessions.add_argument("--cursor", help="the cursor the previous page printed, for the next page")
    sessions.set_defaults(run_async=_sessions)
    history = commands.add_parser("history", help="print a session's stored messages")
    history.add_argument("session_id")
    history.add_argument("--store", help=STORE_HELP)
    history.add_argument("--tenant", default=DEFAULT_TENANT)
    history.add_argument("--last", type=int, default=None, help="only the N newest messages")
    history.set_defaults(run_async=_history)
    migrate = commands.add_parser("migrate", help="create or upgrade a store's schema in place (SQL databases)")
    migrate.add_argument("--store", help=STORE_HELP)
    migrate.set_defaults(run_async=_migrate)
    turn = commands.add_parser("_demo-turn")  # internal: one process of the demo
    turn.add_argument("step", type=int, choices=(1, 2))
    turn.add_argument("session_file", type=Path)
    turn.add_argument("--store")
    turn.set_defaults(run=_demo_process)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        run_async: Any = getattr(args, "run_async", None)
        if run_async is not None:
            return int(asyncio.run(run_async(args)))
        return int(args.run(args))
    except (ChatkeepError, ValueError) as exc:  # a bad cursor or option is the user's to fix, not a crash
        print(f"chatkeep: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
