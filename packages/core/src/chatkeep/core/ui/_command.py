"""The ``chatkeep ui`` command: check where it may listen, print the URL to open, serve until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import socket

from chatkeep.core._errors import ChatkeepError, InvalidArgumentError, MissingExtraError
from chatkeep.core.backend import SessionKey
from chatkeep.core.cli._app import store_url
from chatkeep.core.cli._inspect import first_round_trip, open_existing_store, tenant_of
from chatkeep.core.cli._output import UsageError, emit_json, say
from chatkeep.core.ui._app import UI_EXTRA, UIConfig, create_app
from chatkeep.core.ui._guard import check_bind

__all__ = ["TOKEN_ENV", "UIListenError", "ui", "ui_token", "ui_url"]

TOKEN_ENV = "CHATKEEP_UI_TOKEN"
#: What a token given by the user must look like: long enough not to be guessed, safe in a cookie and a URL.
_TOKEN = re.compile(r"[A-Za-z0-9._~-]{16,512}")


def ui_token(given: str | None) -> str | None:
    """The token to require: ``--token VALUE``, a new random one for a bare ``--token``, else ``$CHATKEEP_UI_TOKEN``.

    Raises:
        InvalidArgumentError: the token is shorter than 16 characters or holds others than letters, digits, ``._~-``.
    """
    if given == "":
        return secrets.token_urlsafe(32)
    token = given if given is not None else os.environ.get(TOKEN_ENV) or None
    if token is not None and not _TOKEN.fullmatch(token):
        raise InvalidArgumentError(
            "the UI token must be 16 to 512 letters, digits or . _ ~ - (a long random string); give a bare --token "
            "to have one made"
        )
    return token


def ui_url(host: str, port: int, token: str | None) -> str:
    """The URL to open: with ``?token=`` when there is one (opening it sets a cookie, and drops it from the URL)."""
    shown = f"[{host}]" if ":" in host else host
    if shown in ("0.0.0.0", "[::]"):  # every address: loopback reaches it from this machine
        shown = "127.0.0.1"
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


def ui(args: argparse.Namespace) -> int:
    """Serve the store read-only on ``--host``:``--port`` until interrupted (Ctrl-C)."""
    if args.all_tenants and args.tenant is not None:
        raise UsageError("give --tenant or --all-tenants, not both")
    token = ui_token(args.token)
    check_bind(args.host, token)
    try:
        import uvicorn
    except ImportError as exc:
        raise MissingExtraError(UI_EXTRA) from exc
    config = UIConfig(store_url(args), tenant=tenant_of(args), all_tenants=args.all_tenants, token=token)
    app = create_app(config)
    asyncio.run(_reachable(config))
    listener = _listen(args.host, args.port)
    url = ui_url(args.host, args.port, token)
    # Printed once the socket listens: whoever reads the URL can connect at once.
    if args.json:
        emit_json({"store": config.shown_url, "tenant": config.tenant, "all_tenants": config.all_tenants, "url": url})
    else:
        say(f"chatkeep ui: serving {config.shown_url} read-only; open {url}")
    # No access log: a request's query may carry the token. uvicorn's own errors still go to stderr.
    server = uvicorn.Server(
        uvicorn.Config(app, ws="none", access_log=False, server_header=False, log_level="warning", lifespan="on")
    )
    with listener:
        server.run(sockets=[listener])
    return 0


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host``:``port``, for uvicorn to serve on.

    Raises:
        UIListenError: the address cannot be listened on (in use, not this machine's, not allowed).
    """
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        listener = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise UIListenError(f"cannot listen on {host}: {exc}; give --host an address of this machine") from None
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(2048)
    except OSError as exc:
        listener.close()
        raise UIListenError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port (or stop what uses it)"
        ) from None
    return listener


class UIListenError(ChatkeepError):
    """``chatkeep ui`` could not listen on the address it was given."""


async def _reachable(config: UIConfig) -> None:
    """Fail now, with the store's own error, rather than in the server's start-up log."""
    async with open_existing_store(config.store_url) as store:
        await first_round_trip(store, SessionKey(config.tenant, "chatkeep-ui-probe"))
