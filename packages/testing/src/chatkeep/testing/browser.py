"""What browser tests of a web page need: headless Chromium as Debian ships it, and an ASGI app served in a thread.

``chatkeep ui``'s tests and its benchmark drive Debian's Chromium (``scripts/chromium`` installs it) with
Playwright, pointed at :data:`CHROMIUM` with :data:`CHROMIUM_ARGS`: nothing downloads a browser build. They serve
the application with :func:`serving` (needs uvicorn: ``chatkeep-core[ui]``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["CHROMIUM", "CHROMIUM_ARGS", "serving"]

#: The Chromium executable: ``$CHATKEEP_CHROMIUM``, else Debian's.
CHROMIUM = os.environ.get("CHATKEEP_CHROMIUM", "/usr/bin/chromium")
#: Headless, without a sandbox (CI runs as root), and without anything that reaches out to the network by itself.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


@contextlib.contextmanager
def serving(app: Any, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve the ASGI ``app`` with uvicorn on a free port of ``host``, in a thread, until the block ends.

    Yields the base URL to open, on loopback (``http://127.0.0.1:PORT/``). The socket is bound and listening
    before uvicorn starts, so a client may connect at once: the kernel holds the connection until uvicorn, its
    application started, accepts it. Nothing waits on a clock.
    """
    import uvicorn

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, 0))
    listener.listen(64)
    config = uvicorn.Config(app, ws="none", access_log=False, log_level="warning", lifespan="on", server_header=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/"
    finally:
        server.should_exit = True
        thread.join()
        listener.close()
