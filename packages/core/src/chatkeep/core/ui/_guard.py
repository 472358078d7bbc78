"""What every request to ``chatkeep ui`` passes through, before any page: the method, the host, the token, headers.

* Read-only: only GET and HEAD are served; any other method is refused with 405, whatever the path.
* A token, when the UI has one (always on an address other than loopback): an ``Authorization: Bearer`` header,
  the cookie a ``?token=`` link sets, or that link itself (which then redirects to the same page without the
  token, so that it stays out of the history, the address bar and any ``Referer``). Compared in constant time.
* Without a token (loopback only), the ``Host`` header must name loopback: a page elsewhere that points its own
  domain at 127.0.0.1 (DNS rebinding) then still cannot read the UI.
* Every response says: no inline script and nothing from elsewhere (CSP), no MIME sniffing, no referrer, no frames,
  no caching.
* An error that is not chatkeep's (a driver's, say, whose message may hold the store's URL) never reaches the
  server's log as it is: it is logged here with every URL's secrets hidden, and the request gets a plain 500.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import traceback
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

from chatkeep.core._errors import ChatkeepError, redact_url

__all__ = ["COOKIE", "HEADERS", "READ_METHODS", "Guard", "UnsafeBindError", "check_bind", "is_loopback"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

READ_METHODS = frozenset({"GET", "HEAD"})
COOKIE = "chatkeep_ui_token"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; object-src 'none'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
)
_LOOPBACK_NAMES = frozenset({"localhost", "localhost."})
_log = logging.getLogger("chatkeep.ui")


class UnsafeBindError(ChatkeepError):
    """``chatkeep ui`` was asked to listen beyond loopback without a token; it did not start."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 in brackets or not) is this machine's loopback only."""
    name = host.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve on an address other than loopback without a token.

    Raises:
        UnsafeBindError: ``host`` is not loopback and ``token`` is empty.
    """
    if not token and not is_loopback(host):
        raise UnsafeBindError(
            f"chatkeep ui will not listen on {host} without a token: anyone who reaches that address could read "
            "every conversation. Add --token (a random one is made and printed) or set CHATKEEP_UI_TOKEN, or "
            "listen on 127.0.0.1 and reach it through an SSH tunnel"
        )


def _host_of(header: str) -> str:
    """The host of a ``Host`` header, without its port."""
    if header.startswith("["):
        return header.split("]", 1)[0] + "]"
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard:
    """The ASGI middleware that applies the rules above to every request (static files included)."""

    def __init__(self, app: ASGIApp, *, token: str | None) -> None:
        """Wrap ``app``; ``token``: the one every request must carry (``None``: loopback, checked by ``Host``)."""
        self._app = app
        self._token = token.encode() if token else None

    @property
    def app(self) -> ASGIApp:
        """The application behind the guard (its routes are what the read-only test walks)."""
        return self._app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # the UI has none: refused before any route sees it
            await receive()
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":  # lifespan: the store opens and closes
            await self._app(scope, receive, send)
            return

        started = False

        async def secured(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
                started = True
            await send(message)

        if scope["method"] not in READ_METHODS:
            await _plain(secured, 405, "chatkeep ui is read-only: only GET and HEAD", [(b"allow", b"GET, HEAD")])
            return
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        if self._token is None:
            if not is_loopback(_host_of(headers.get("host", ""))):
                await _plain(secured, 421, "this UI answers only to a loopback address such as 127.0.0.1")
                return
        else:
            query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
            given = dict(query).get("token")
            if given is not None and self._matches(given):
                await self._remember(secured, scope, query)
                return
            if not (self._matches(_bearer(headers)) or self._matches(_cookie(headers))):
                await _plain(
                    secured,
                    401,
                    "this UI needs its token: open the URL chatkeep ui printed (it ends in ?token=...), "
                    "or send Authorization: Bearer <token>",
                    [(b"www-authenticate", b'Bearer realm="chatkeep ui"')],
                )
                return
        try:
            await self._app(scope, receive, secured)
        except Exception as exc:  # not chatkeep's (those are pages): log it with its URLs' secrets hidden
            _log.error("%s %s failed:\n%s", scope["method"], scope["path"], redact_url(_formatted(exc)))
            if not started:
                await _plain(secured, 500, "chatkeep ui met an unexpected error; the server's log says which")

    def _matches(self, given: str | None) -> bool:
        assert self._token is not None
        return given is not None and hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self._token)

    async def _remember(self, send: Send, scope: Scope, query: list[tuple[str, str]]) -> None:
        """Set the token's cookie and redirect to the same page without ``token`` in its query."""
        rest = urlencode([(name, value) for name, value in query if name != "token"])
        # One leading slash: "//host/..." would send the browser to another site.
        location = "/" + (scope.get("root_path", "") + scope["path"]).lstrip("/") + (f"?{rest}" if rest else "")
        assert self._token is not None
        cookie = f"{COOKIE}={self._token.decode()}; HttpOnly; SameSite=Strict; Path=/"
        await _plain(send, 303, "signed in", [(b"location", location.encode()), (b"set-cookie", cookie.encode())])


def _bearer(headers: dict[str, str]) -> str | None:
    scheme, _, value = headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def _cookie(headers: dict[str, str]) -> str | None:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except CookieError:  # a malformed Cookie header carries no token
        return None
    morsel = jar.get(COOKIE)
    return None if morsel is None else morsel.value


async def _plain(send: Send, status: int, text: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = (text + "\n").encode()
    start = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": [*start, *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


def _formatted(exc: BaseException) -> str:
    """``exc``'s traceback as the log would print it (with the exceptions it was raised from)."""
    return "".join(traceback.format_exception(exc)).rstrip()
