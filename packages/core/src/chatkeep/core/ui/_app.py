"""The Starlette application of ``chatkeep ui``: its settings, its routes, the store it holds open, its templates.

Pages are rendered on the server with Jinja2 (every value escaped); one small script, one stylesheet and an icon
are the only other files. The store is opened once, for the life of the server (as the read commands open it: a
store whose storage does not exist is an error, not created), and closed when it stops.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from chatkeep.core._errors import MissingExtraError, redact_url
from chatkeep.core._session import DEFAULT_TENANT
from chatkeep.core.backend import HistoryStore
from chatkeep.core.cli._inspect import open_existing_store

__all__ = ["UI_EXTRA", "UIConfig", "create_app"]

UI_EXTRA = 'chatkeep ui needs Starlette, uvicorn and Jinja2: pip install "chatkeep-core[ui]"'


@dataclass(frozen=True, slots=True)
class UIConfig:
    """What one ``chatkeep ui`` serves.

    Attributes:
        store_url: the store (its password, if any, is never shown: pages and logs use :attr:`shown_url`).
        tenant: the tenant shown; the only one unless ``all_tenants``.
        all_tenants: let the pages pick any tenant of the store.
        token: the token every request must carry (``None``: none, allowed on loopback only).
    """

    store_url: str
    tenant: str = DEFAULT_TENANT
    all_tenants: bool = False
    token: str | None = None

    @property
    def shown_url(self) -> str:
        """The store URL with passwords and secret parameters hidden."""
        return redact_url(self.store_url)


@dataclass
class UIState:
    """What the routes share: the settings, the open store and the template environment."""

    config: UIConfig
    store: HistoryStore
    templates: Any  # jinja2.Environment


def _templates() -> Any:
    import jinja2

    # autoescape=True for every template: whatever a message, a title or an id holds is shown as text.
    return jinja2.Environment(
        loader=jinja2.PackageLoader("chatkeep.core.ui", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def create_app(config: UIConfig) -> Any:
    """The ASGI application serving ``config``'s store, read-only, behind :class:`~chatkeep.core.ui._guard.Guard`.

    The store is opened when the server starts (its lifespan) and closed when it stops.

    Raises:
        MissingExtraError: Starlette or Jinja2 is not installed (the ``ui`` extra).
    """
    try:
        from starlette.applications import Starlette
        from starlette.routing import Route
    except ImportError as exc:
        raise MissingExtraError(UI_EXTRA) from exc
    from chatkeep.core.ui import _views
    from chatkeep.core.ui._guard import Guard

    templates = _templates()

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async with open_existing_store(config.store_url) as store:
            app.state.ui = UIState(config, store, templates)
            yield

    routes = [
        Route("/", _views.sessions, methods=["GET"], name="sessions"),
        Route("/session", _views.session, methods=["GET"], name="session"),
        Route("/session/export", _views.export, methods=["GET"], name="export"),
        Route("/store", _views.store_page, methods=["GET"], name="store"),
        Route("/tenants", _views.tenants, methods=["GET"], name="tenants"),
        Route("/static/{name}", _views.static, methods=["GET"], name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=_views.EXCEPTION_HANDLERS)
    return Guard(app, token=config.token)
