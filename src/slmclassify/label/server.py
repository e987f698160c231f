"""Run the labelling page: bind 127.0.0.1, start the session, wait for its first slice, serve.

The port is bound before the model loads, so a taken port fails at once. The page's URL (with the
token) is handed to the caller's `on_ready` once the first slice is scored: the library prints
nothing. SIGTERM / Ctrl-C stop uvicorn (requests in flight finish), then the session is closed;
answers need no saving at exit, the store has each one when it is acknowledged.
"""

from __future__ import annotations

import secrets
import socket
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import TaskError
from ..web.bind import bind as web_bind

HOST = "127.0.0.1"  # never another interface: the page shows the input's texts


def new_token() -> str:
    """A random token for the page's URL (128 bits)."""
    return secrets.token_urlsafe(16)


def page_url(port: int, token: str) -> str:
    return f"http://{HOST}:{port}/?token={token}"


def bind(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:port (0: a free port); errors name the port."""
    try:
        return web_bind(HOST, port, backlog=64)
    except OSError as exc:
        raise TaskError(f"cannot listen on {HOST}:{port}: {exc.strerror}; pick another --port (0: any free one)") \
            from None


def run_page(start_session: Callable[[], object], *, port: int, token: str, export_path: str | Path,
             fit_path: str | Path, on_ready: Callable[[str, object], None], poll_s: float = 0.1,
             fallback_port: bool = False, on_progress: Callable[[str], None] | None = None,
             progress_s: float = 5.0) -> None:
    """Bind, call `start_session()` (a started `LabelSession`), wait until it is ready, call
    `on_ready(url, session)` (a team's: each member's address is the URL with their token), then
    serve the page until SIGTERM/SIGINT; the session is closed on the way out.
    `fallback_port`: `port` is the one a previous start served (kept in the store): when it is taken
    now, any free port. `on_progress` gets a line while the model loads and the first slice is scored
    (every `progress_s`), so the terminal is not silent for the minute before the URL."""
    from .app import create_app

    try:
        sock = bind(port)
    except TaskError:
        if not fallback_port:
            raise
        sock = bind(0)
    say = on_progress or (lambda _line: None)
    session = None
    try:
        say("loading the model and the input…")
        session = start_session()
        said = time.monotonic()
        while not session.ready():
            if time.monotonic() - said >= progress_s:
                done, total = session.first_slice_progress()
                say(f"scoring the first {total} items: {done} done")
                said = time.monotonic()
            time.sleep(poll_s)
        address = sock.getsockname()[1]
        session.store.save_page_address(address, token)
        app = create_app(session, token, export_path=export_path, fit_path=fit_path)
        server = _server(app)
        on_ready(page_url(address, token), session)
        server.run(sockets=[sock])
    finally:
        if session is not None:
            session.close()
        sock.close()


def _server(app):
    """A uvicorn server for `app` that exits 0 after SIGTERM/SIGINT (uvicorn would raise the signal
    again once shut down; stopping the page is how a labelling session normally ends)."""
    import uvicorn

    class StoppingServer(uvicorn.Server):
        def handle_exit(self, sig, frame):
            super().handle_exit(sig, frame)
            self._captured_signals.clear()

    return StoppingServer(uvicorn.Config(app, lifespan="off", access_log=False, log_level="warning",
                                         timeout_graceful_shutdown=10))
