"""``chatkeep ui``: a read-only browser for a store's sessions, safe enough to point at production.

Run ``chatkeep ui --store URL`` (extra ``ui``: ``pip install "chatkeep-core[ui]"``) and open the URL it prints.
To serve it from your own ASGI server, build the application with :func:`create_app`.
"""

from chatkeep.core.ui._app import UIConfig, create_app
from chatkeep.core.ui._guard import UnsafeBindError

__all__ = ["UIConfig", "UnsafeBindError", "create_app"]
