"""The labelling page's web app: one HTML page and a small JSON API over a `LabelSession`.

Routes (every one behind the token, see `TokenGuard`):
  GET  /             the page (page.html, plain HTML + inline JS/CSS)
  GET  /api/state    the session's state (current item, counts, estimates) + where export/fit write
  POST /api/answer   {"row": int, "label": str}  (Enter on the page sends the guess it shows: a
                                                 refit may have changed the session's guess since;
                                                 multi-label: "label": [str, ...], the labels toggled on;
                                                 a task of questions: "label": {question: str or [str, ...]})
  POST /api/skip     {"row": int}
  POST /api/undo     {}
  POST /api/export   {}                         writes the fixed export path given at start
  POST /api/fit      {}                         writes the fixed head path given at start

Invariants: no request reaches a handler without the token; no request names a file (bodies are
closed models, `extra="forbid"`, and the only paths written are the two fixed at start); item texts
reach the page as JSON and are shown with textContent, never as HTML. Handlers call the session
in a worker thread, so a slow write or fit never stalls the page's other requests.
"""

from __future__ import annotations

import asyncio
from importlib import resources
from pathlib import Path

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException

from ..errors import SlmClassifyError, TaskError
from ..web.guard import bearer, header, matches, query_value, send_error
from .answers import InvalidAnswer
from .store import StaleAnswer

# The page loads nothing from elsewhere and may not be framed: its scripts and styles are inline.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                               "connect-src 'self'; img-src data:; frame-ancestors 'none'; base-uri 'none'; "
                               "form-action 'none'",
    "Referrer-Policy": "no-referrer",  # the token is in the page's URL
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}


class Row(BaseModel):
    """A request about one item; `row` is the item's row in the input, as the state gave it (strict:
    `true` or `"1"` is refused, not taken as row 1)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    row: int


class Versioned(Row):
    """An answer or skip may name the row's version the page showed (`item.version` of the state):
    one made on a version that is no longer current gets 409 with the current state."""

    version: int | None = None


class Answer(Versioned):
    label: str | list[str] | dict[str, str | list[str]]
    """A label; in a multi-label task the list of labels that apply (maybe empty); in a task of
    questions {question: its label, or its list of labels}, every question."""


class Empty(BaseModel):
    """A request with no parameters (undo, export, fit): any field is refused."""

    model_config = ConfigDict(extra="forbid")


class TokenGuard:
    """ASGI middleware: every HTTP request needs the token, as `?token=` (how the page is opened),
    `Authorization: Bearer TOKEN` or `X-Label-Token: TOKEN` (how the page's script calls the API).
    401 when no token is given, 403 when a wrong one is; compared in constant time (`web/guard.py`)."""

    def __init__(self, app, token: str):
        if not token:
            raise TaskError("the labelling page needs a non-empty token (--api-key), or none for a random one")
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self.app(scope, receive, send)
        send = _with_page_headers(send)  # every answer, the refusals and the API's JSON included
        given = self._given(scope)
        if not matches(given, self.token):
            if scope["type"] == "websocket":
                return await send({"type": "websocket.close", "code": 1008})
            if given is None:
                return await send_error(send, 401, "this page needs its token: open the URL that `slmclassify label` "
                                                   "printed")
            return await send_error(send, 403, "wrong token: open the URL that `slmclassify label` printed")
        await self.app(scope, receive, send)

    @staticmethod
    def _given(scope) -> str | None:
        """The page's token rule: the bearer token, else `X-Label-Token`, else `?token=`."""
        token = bearer(scope)
        if token is not None:
            return token
        own = header(scope, b"x-label-token")
        if own:  # a blank one is a wrong token (403), not a missing one
            return own.strip()
        return query_value(scope, "token")


def _with_page_headers(send):
    """`send` that adds `PAGE_HEADERS` to each HTTP response that does not set them itself."""
    extra = [(k.lower().encode(), v.encode()) for k, v in PAGE_HEADERS.items()]

    async def sending(message):
        if message["type"] == "http.response.start":
            have = {name.lower() for name, _ in message.get("headers", ())}
            message = {**message, "headers": [*message.get("headers", ()), *[h for h in extra if h[0] not in have]]}
        await send(message)

    return sending


def page_html() -> str:
    """The page, shipped as package data next to this module."""
    return resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")


def create_app(session, token: str, *, export_path: str | Path, fit_path: str | Path):
    """The ASGI app for `session` (a started `LabelSession`), guarded by `token`.

    `export_path` and `fit_path` are the only files the page can write (its Export and Fit
    buttons), fixed here by the caller; the session itself is closed by the caller."""
    export_path, fit_path = Path(export_path), Path(fit_path)
    page = page_html()
    app = FastAPI(title="slmclassify label", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(HTTPException)
    async def _http_error(_request, exc: HTTPException):
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request, exc: RequestValidationError):
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}"
                             for e in exc.errors())
        return JSONResponse({"error": f"invalid request: {problems}"}, status_code=422)

    @app.exception_handler(SlmClassifyError)
    async def _refused(_request, exc: SlmClassifyError):
        return JSONResponse({"error": str(exc)}, status_code=409)

    @app.exception_handler(InvalidAnswer)
    async def _invalid_answer(_request, exc: InvalidAnswer):  # the request's fault, not a conflict
        return JSONResponse({"error": str(exc)}, status_code=422)

    def state() -> dict:
        ready = session.ready()
        body = session.state() if ready else {}
        return {**body, "ready": ready, "export_path": str(export_path), "fit_path": str(fit_path)}

    async def act(call, *args) -> dict:
        await asyncio.to_thread(call, *args)
        return await asyncio.to_thread(state)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index():
        return HTMLResponse(page, headers=PAGE_HEADERS)

    @app.get("/api/state")
    async def get_state():
        return await asyncio.to_thread(state)

    @app.exception_handler(StaleAnswer)
    async def _stale(_request, exc: StaleAnswer):
        return JSONResponse({"error": str(exc), "state": await asyncio.to_thread(state)}, status_code=409)

    @app.post("/api/answer")
    async def answer(body: Answer):
        return await act(session.answer, body.row, body.label, body.version)

    @app.post("/api/skip")
    async def skip(body: Versioned):
        return await act(session.skip, body.row, body.version)

    @app.post("/api/show")
    async def show(body: Row):
        return await act(session.show, body.row)

    @app.post("/api/undo")
    async def undo(_body: Empty):
        return await act(session.undo)

    @app.post("/api/export")
    async def export(_body: Empty):
        rows = await asyncio.to_thread(session.export, export_path)
        return {"written": str(export_path), "rows": rows}

    @app.post("/api/fit")
    async def fit(_body: Empty):
        await asyncio.to_thread(session.fit, fit_path)
        return {"written": str(fit_path)}

    return TokenGuard(app, token)
