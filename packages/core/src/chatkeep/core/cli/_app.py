"""The ``chatkeep`` parser and entry point: shared options, exit codes, errors without tracebacks.

Only argparse is imported up front; each command's module (and the store, the model, rich) is imported when
that command runs, so ``chatkeep --help`` and scripts that call the command often stay fast.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import inspect
import json
import os
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

__all__ = ["duration", "main", "session_id", "store_url", "tenant"]

STORE_ENV = "CHATKEEP_STORE"
DEFAULT_STORE = "sqlite://"
STORE_HELP = (
    f"backend URL (default: ${STORE_ENV} when set, else sqlite://, the SQLite file under your user data folder)"
)


def store_url(args: argparse.Namespace) -> str:
    """The store a command works on: ``--store``, else ``$CHATKEEP_STORE``, else the SQLite file store if installed."""
    from chatkeep.core._errors import ChatkeepError, StoreConfigurationError
    from chatkeep.core.plugins import default_registry

    if args.store:
        return str(args.store)
    if os.environ.get(STORE_ENV):
        return os.environ[STORE_ENV]
    try:
        default_registry().resolve(DEFAULT_STORE)
    except ChatkeepError:
        raise StoreConfigurationError(
            f"no --store given, {STORE_ENV} is not set and the default SQLite store is not installed; pass "
            f'--store URL, set {STORE_ENV}, or run: pip install "chatkeep-core[sqlite]"'
        ) from None
    return DEFAULT_STORE


def _common(*, store: bool = True, tenant_option: bool = True) -> argparse.ArgumentParser:
    """The options every command takes, placed after the command's name."""
    common = argparse.ArgumentParser(add_help=False)
    if store:
        common.add_argument("--store", type=_store_option, metavar="URL", help=STORE_HELP)
    if store and tenant_option:
        common.add_argument("--tenant", type=tenant, default=None, help="the tenant to work in (default: default)")
    common.add_argument("--json", action="store_true", help="print stable JSON for scripts instead of text")
    return common


def _command(
    commands: Any, name: str, handler: str, help: str, *, parents: Sequence[argparse.ArgumentParser]
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help, description=help, parents=list(parents))
    parser.set_defaults(handler=handler)
    return parser


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chatkeep",
        description="Store and resume AI-agent conversations.",
        epilog=(
            "Exit status: 0 done, 1 an error (store, data, model), 2 a usage error, 3 done but damaged sessions "
            "were skipped (--skip-damaged). Run 'chatkeep COMMAND -h'."
        ),
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    common, bare = _common(), _common(store=False)

    _command(commands, "backends", "_inspect:backends", "list installed storage backends", parents=[bare])

    doctor_help = "check that a store works: write, read back, latency"
    _command(commands, "doctor", "_inspect:doctor", doctor_help, parents=[common])

    sessions = commands.add_parser("sessions", help="list, show or delete stored sessions")
    session_commands = sessions.add_subparsers(dest="sessions_command", metavar="ACTION", required=True)
    listing = _command(
        session_commands, "list", "_inspect:sessions_list", "a tenant's sessions, newest first", parents=[common]
    )
    listing.add_argument("--limit", type=_positive, default=20, help="sessions per page (default: %(default)s)")
    listing.add_argument("--cursor", help="the cursor the previous page printed, for the next page")
    listing.add_argument("--tag", type=_tag, default=None, help="only the sessions carrying this tag")
    _skip_damaged(listing, "leave damaged sessions out of the table (each is named on stderr)")
    show = _command(
        session_commands, "show", "_inspect:sessions_show", "print a session's transcript", parents=[common]
    )
    show.add_argument("session_id", type=session_id, metavar="ID")
    show.add_argument("--last", type=_positive, default=None, help="only the N newest messages")
    delete = _command(
        session_commands, "delete", "_inspect:sessions_delete", "delete a session and its history", parents=[common]
    )
    delete.add_argument("session_id", type=session_id, metavar="ID")
    delete.add_argument("--yes", action="store_true", help="do not ask (required when stdin is not a terminal)")
    fork_help = "start a new session from a session's history up to a message (nothing is copied)"
    fork = _command(session_commands, "fork", "_forks:sessions_fork", fork_help, parents=[common])
    fork.add_argument("session_id", type=session_id, metavar="ID")
    fork.add_argument("--through", metavar="MESSAGE_ID", help="the last message the fork takes (default: the newest)")
    fork.add_argument("--as", dest="new_id", type=session_id, metavar="NEW_ID", help="the fork's id (default: random)")
    tag_help = "set a session's tags (and title)"
    tagging = _command(session_commands, "tag", "_forks:sessions_tag", tag_help, parents=[common])
    tagging.add_argument("session_id", type=session_id, metavar="ID")
    tagging.add_argument("tags", type=_tag, nargs="*", metavar="TAG", help="the tags, replacing the session's")
    tagging.add_argument("--clear", action="store_true", help="remove every tag")
    tagging.add_argument("--title", default=None, help='set the session\'s title ("" clears it)')

    export = _command(commands, "export", "_transfer:export", "write sessions as JSON Lines", parents=[common])
    export.add_argument(
        "--session", type=session_id, metavar="ID", help="only this session (default: every session of the tenant)"
    )
    export.add_argument("--output", "-o", type=Path, help="the file to write (default: stdout)")
    _skip_damaged(export, "export the other sessions when one is damaged (each is named, and marked in the file)")

    imp = _command(commands, "import", "_transfer:import_", "read sessions from JSON Lines", parents=[common])
    imp.add_argument("--input", "-i", type=Path, help="the file to read (default: stdin)")
    imp.add_argument(
        "--allow-partial",
        action="store_true",
        help="import a file without the trailer export writes last, or whose counts do not match it (a file cut "
        "short, or an export from an earlier chatkeep); it says what it imported",
    )

    copy = _command(
        commands,
        "copy",
        "_transfer:copy",
        "copy a tenant's sessions between two stores, then verify (run it again to resume an interrupted copy)",
        parents=[bare],
    )
    copy.add_argument("--from", dest="source", required=True, metavar="URL", help="the store to copy from")
    copy.add_argument("--to", dest="target", required=True, metavar="URL", help="the store to copy to")
    copy.add_argument(
        "--tenant",
        dest="tenants",
        type=tenant,
        action="append",
        help="a tenant to copy (repeat for several)",
    )
    _skip_damaged(copy, "copy the other sessions when one is damaged (each is named)")
    copy.add_argument(
        "--all-tenants", action="store_true", help="copy every tenant of --from (instead of --tenant): a whole store"
    )

    _tenant_commands(commands, _common(tenant_option=False))

    prune = _command(commands, "prune", "_inspect:prune", "delete sessions not updated for a while", parents=[common])
    prune.add_argument("--older-than", type=duration, required=True, metavar="AGE", help="e.g. 30d, 12h, 90m, 45s")
    prune.add_argument("--all-tenants", action="store_true", help="prune every tenant (instead of --tenant)")
    prune.add_argument("--yes", action="store_true", help="do not ask (required when stdin is not a terminal)")
    prune.add_argument("--dry-run", action="store_true", help="list the sessions it would delete, and delete nothing")

    search = _command(
        commands,
        "search",
        "_search:search",
        "the messages that best match some words, by meaning and by words",
        parents=[common],
    )
    search.add_argument("words", help="what to look for")
    search.add_argument("--session", type=session_id, metavar="ID", help="only this session (default: the tenant)")
    search.add_argument("--limit", type=_positive, default=10, help="how many matches (default: %(default)s)")
    reindex = _command(
        commands,
        "reindex",
        "_search:reindex",
        "index the messages not yet indexed with the embedder (every tenant unless --tenant); run again to resume",
        parents=[common],
    )
    for command in (search, reindex):
        command.add_argument("--openai-model", metavar="MODEL", help="embed with this model of OPENAI_BASE_URL")
        command.add_argument("--dimensions", type=_positive, help="the width of --openai-model's vectors")

    # The handler lives in chatkeep.core.ui, the layer above the CLI (it reuses the CLI's readers), named by its
    # full module path: the parser imports nothing of it until the command runs.
    ui_help = "browse the store's sessions in a web browser, read-only (extra ui)"
    browse = _command(commands, "ui", "chatkeep.core.ui._command:ui", ui_help, parents=[common])
    browse.add_argument("--all-tenants", action="store_true", help="let the pages show every tenant, not only --tenant")
    browse.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: %(default)s)")
    browse.add_argument("--port", type=_port, default=8765, help="the port to listen on (default: %(default)s)")
    browse.add_argument(
        "--token",
        nargs="?",
        const="",
        default=None,
        help="require this token on every request (a bare --token makes a random one; default: $CHATKEEP_UI_TOKEN); "
        "needed to listen on any address but loopback",
    )

    _command(
        commands, "migrate", "_inspect:migrate", "create or upgrade a store's schema (SQL databases)", parents=[common]
    )

    chat_help = "chat with the configured model; the history lives in the store"
    chat = _command(commands, "chat", "_chat:chat", chat_help, parents=[common])
    chat.add_argument(
        "--session", type=session_id, required=True, metavar="ID", help="the conversation to start or resume"
    )

    demo = _command(commands, "demo", "_chat:demo", "show a conversation kept across two processes", parents=[])
    demo.add_argument(
        "--store", help="keep history in this backend URL (default: a SQLite file in the state dir, when installed)"
    )
    demo.add_argument("--in-session", action="store_true", help="keep history inside the session instead of a store")
    demo.add_argument(
        "--state-dir", default=".chatkeep-demo", help="where the demo saves the session (default: %(default)s)"
    )
    turn = commands.add_parser("_demo-turn")  # internal: one process of the demo
    turn.add_argument("step", type=int, choices=(1, 2))
    turn.add_argument("session_file", type=Path)
    turn.add_argument("--store")
    turn.set_defaults(handler="_chat:demo_process")
    return parser


def _skip_damaged(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--skip-damaged", action="store_true", help=f"{what}; the exit status is then 3")


def _tenant_commands(commands: Any, store_only: argparse.ArgumentParser) -> None:
    """``tenants list`` and ``erase`` (whose ``--tenant`` has no default: erasing is for good)."""
    tenants = commands.add_parser("tenants", help="list the tenants a store holds")
    tenant_commands = tenants.add_subparsers(dest="tenants_command", metavar="ACTION", required=True)
    _command(tenant_commands, "list", "_tenants:tenants_list", "every tenant holding a session", parents=[store_only])
    erase_help = "erase a tenant's sessions (or one session) for good"
    erase = _command(commands, "erase", "_tenants:erase", erase_help, parents=[store_only])
    erase.add_argument("--tenant", type=tenant, required=True, help="the tenant to erase (no default)")
    erase.add_argument("--session", type=session_id, metavar="ID", help="only this session (default: every session)")
    erase.add_argument("--yes", action="store_true", help="do not ask (required when stdin is not a terminal)")
    erase.add_argument("--dry-run", action="store_true", help="say what it would remove, and remove nothing")


def _checked_id(text: str, what: str, *, instead: str = "") -> str:
    from chatkeep.core._errors import InvalidSessionKeyError
    from chatkeep.core._session import validate_id

    if not text:  # never the default in disguise: "--tenant $TENANT" with TENANT unset must not act on 'default'
        raise argparse.ArgumentTypeError(f"the {what} is empty (an unset shell variable?); give its name{instead}")
    try:
        return validate_id(text, what)
    except InvalidSessionKeyError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _store_option(text: str) -> str:
    if not text.strip():  # "--store $URL" with URL unset must not fall back to the default store
        raise argparse.ArgumentTypeError(
            f"the store URL is empty (an unset shell variable?); give a URL, or leave --store out for ${STORE_ENV} "
            "or the default SQLite store"
        )
    return text


def tenant(text: str) -> str:
    """A ``--tenant`` value (an argparse type): refuses an empty or over-long one instead of meaning ``default``."""
    return _checked_id(text, "tenant", instead=", or leave --tenant out for the tenant 'default'")


def session_id(text: str) -> str:
    """A session id on the command line (an argparse type): refuses an empty or over-long one."""
    return _checked_id(text, "session id")


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration(text: str) -> timedelta:
    """Parse an age: ``30d``, ``12h``, ``90m``, ``45s`` or ``2w`` (an argparse type, so a bad one is a usage error)."""
    number, unit = text.strip()[:-1], text.strip()[-1:].lower()
    if unit not in _UNITS or not number.isdigit() or int(number) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an age; write a whole number and a unit: 30d, 12h, 90m, 45s or 2w"
        )
    from chatkeep.core._errors import InvalidArgumentError
    from chatkeep.core.backend._checks import prune_cutoff

    try:
        age = timedelta(seconds=int(number) * _UNITS[unit])
        prune_cutoff(age)  # an age must leave a time to compare with: now minus it, after the year 1
    except (OverflowError, InvalidArgumentError):
        raise argparse.ArgumentTypeError(
            f"{text!r} reaches before the year 1; give an age of at most a few thousand years, e.g. 36500d"
        ) from None
    return age


def _tag(text: str) -> str:
    from chatkeep.core._errors import ChatkeepError
    from chatkeep.core.backend import check_tag

    try:
        return check_tag(text)
    except ChatkeepError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _port(text: str) -> int:
    port = _positive(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"a port is at most 65535, got {port}")
    return port


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _report(exc: BaseException, *, as_json: bool) -> None:
    from chatkeep.core._errors import redact_url
    from chatkeep.core.cli._output import say

    message = redact_url(str(exc))
    if as_json:
        print(json.dumps({"error": {"type": type(exc).__name__, "message": message}}), file=sys.stderr, flush=True)
    else:
        say(f"chatkeep: {message}", err=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 done, 1 error, 2 usage, 3 damaged sessions skipped)."""
    from chatkeep.core.cli._output import UsageError

    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on -h (0) and on usage errors (2); a caller of main() gets the code
        return exc.code if isinstance(exc.code, int) else 0
    if args.command is None:
        parser.print_help()
        return 2
    as_json = bool(getattr(args, "json", False))
    from chatkeep.core._errors import ChatkeepError

    try:
        module, _, name = str(args.handler).partition(":")
        package = "" if module.startswith("chatkeep.") else "chatkeep.core.cli."
        handler = getattr(importlib.import_module(f"{package}{module}"), name)
        result = handler(args)
        if inspect.iscoroutine(result):
            result = asyncio.run(result)
        return int(result)
    except BrokenPipeError:  # the reader went away (chatkeep export | head): stop quietly, as Unix tools do
        with contextlib.suppress(OSError, ValueError):  # no second error when Python flushes stdout at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except UsageError as exc:
        _report(exc, as_json=as_json)
        return 2
    except (ChatkeepError, ValueError, OSError) as exc:  # the store's, the data's or a file's: the user's to fix
        _report(exc, as_json=as_json)
        return 1
    except KeyboardInterrupt:
        return 130
