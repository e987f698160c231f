"""The labelling page's web app: one HTML page and a small JSON API over a `LabelSession`.

Routes (every one behind a token, see `TokenGuard`; each call is made as the member the token is,
`team.py`, "" without a team):
  GET  /             the page (page.html, plain HTML + inline JS/CSS)
  GET  /api/state    the session's state for this member (their current item and history, the
                     counts, estimates, guidelines, the team's progress) + where export/fit write
  GET  /api/agreement  the agreement between annotators (`agreement.py`), JSON
  POST /api/answer   {"row": int, "label": str}  (Enter on the page sends the guess it shows: a
                                                 refit may have changed the session's guess since;
                                                 multi-label: "label": [str, ...], the labels toggled on;
                                                 a task of questions: "label": {question: str or [str, ...]})
  POST /api/skip     {"row": int}
  POST /api/undo     {}
  POST /api/export   {}                         writes the fixed export path given at start
  POST /api/fit      {}                         writes the fixed head path given at start
  GET  /api/suspects  the answered items whose gold an out-of-fold head finds least likely

Invariants: no request reaches a handler without a member's token (403 otherwise); an annotator's
calls never return another person's answers (their item, history and skipped rows are their own;
agreement is counts over items; the suspects, which show the gold, and Export and Fit, which write
everyone's answers, are the reviewers' where the team has any); no request names a file (bodies are
closed models, `extra="forbid"`, and the only paths written are the two fixed at start); item texts
reach the page as JSON and are shown with textContent, never as HTML. Handlers call the session
in a worker thread, so a slow write or fit never stalls the page's other requests.
"""

from __future__ import annotations

import asyncio
from importlib import resources
from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException

from ..errors import SlmClassifyError, TaskError
from ..web.guard import bearer, header, query_value, send_error
from .answers import InvalidAnswer
from .store import StaleAnswer
from .team import Member, Team

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
    """ASGI middleware: every HTTP request needs a member's token, as `?token=` (how the page is
    opened), `Authorization: Bearer TOKEN` or `X-Label-Token: TOKEN` (how the page's script calls
    the API); 403 when none or a wrong one is given, each compared in constant time. The request
    goes on as that member (`scope["state"]["member"]`). `team`: a `Team`, or the one token of a
    session without one."""

    def __init__(self, app, team: Team | str):
        if isinstance(team, str):
            if not team:
                raise TaskError("the labelling page needs a non-empty token (--api-key), or none for a random one")
            team = Team.alone(team)
        self.app, self.team = app, team

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self.app(scope, receive, send)
        send = _with_page_headers(send)  # every answer, the refusals and the API's JSON included
        given = self._given(scope)
        member = self.team.member_of(given)
        if member is None:
            if scope["type"] == "websocket":
                return await send({"type": "websocket.close", "code": 1008})
            if given is None:
                return await send_error(send, 403, "this page needs its token: open the URL that `slmclassify label` "
                                                   "printed")
            return await send_error(send, 403, "wrong token: open the URL that `slmclassify label` printed")
        await self.app({**scope, "state": {**scope.get("state", {}), "member": member}}, receive, send)

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


def create_app(session, token: str | None, *, export_path: str | Path, fit_path: str | Path):
    """The ASGI app for `session` (a started `LabelSession`), guarded by its team's tokens, or by
    `token` for a session without a team.

    `export_path` and `fit_path` are the only files the page can write (its Export and Fit
    buttons), fixed here by the caller; the session itself is closed by the caller."""
    export_path, fit_path = Path(export_path), Path(fit_path)
    team = getattr(session, "team", None) or token or ""
    reviewers = team.reviewers if isinstance(team, Team) else ()
    page = page_html()
    app = FastAPI(title="slmclassify label", docs_url=None, redoc_url=None, openapi_url=None)
    _error_handlers(app)

    def member(request: Request) -> Member:
        return request.state.member

    def reviewer(who: Member = Depends(member)) -> Member:
        """The member, where the call is the reviewers' (a team with reviewers): 403 for an annotator."""
        if reviewers and who.role != "reviewer":
            raise HTTPException(403, "this is the reviewers' (it shows or writes everyone's answers): ask "
                                     f"{', '.join(reviewers)}")
        return who

    def state(who: Member) -> dict:
        ready = session.ready()
        body = session.state(who.name) if ready else {}
        return {**body, "ready": ready, "export_path": str(export_path), "fit_path": str(fit_path)}

    async def act(who: Member, call, *args, **kwargs) -> dict:
        await asyncio.to_thread(call, *args, who=who.name, **kwargs)
        return await asyncio.to_thread(state, who)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index():
        return HTMLResponse(page, headers=PAGE_HEADERS)

    @app.get("/api/state")
    async def get_state(who: Member = Depends(member)):
        return await asyncio.to_thread(state, who)

    @app.exception_handler(StaleAnswer)
    async def _stale(request: Request, exc: StaleAnswer):
        return JSONResponse({"error": str(exc), "state": await asyncio.to_thread(state, request.state.member)},
                            status_code=409)

    @app.post("/api/answer")
    async def answer(body: Answer, who: Member = Depends(member)):
        return await act(who, session.answer, body.row, body.label, body.version)

    @app.post("/api/skip")
    async def skip(body: Versioned, who: Member = Depends(member)):
        return await act(who, session.skip, body.row, body.version)

    @app.post("/api/show")
    async def show(body: Row, who: Member = Depends(member)):
        return await act(who, session.show, body.row)

    @app.post("/api/undo")
    async def undo(_body: Empty, who: Member = Depends(member)):
        return await act(who, session.undo)

    @app.get("/api/agreement")
    async def agreement(_who: Member = Depends(member)):
        return await asyncio.to_thread(session.agreement)

    @app.get("/api/suspects")
    async def suspects(_who: Member = Depends(reviewer)):
        return await asyncio.to_thread(session.suspects)

    @app.post("/api/export")
    async def export(_body: Empty, _who: Member = Depends(reviewer)):
        rows = await asyncio.to_thread(session.export, export_path)
        return {"written": str(export_path), "rows": rows}

    @app.post("/api/fit")
    async def fit(_body: Empty, _who: Member = Depends(reviewer)):
        await asyncio.to_thread(session.fit, fit_path)
        return {"written": str(fit_path)}

    return TokenGuard(app, team)


def _error_handlers(app: FastAPI) -> None:
    """Errors as {"error": what is wrong}: 422 for a malformed request or answer, 409 for a refusal."""

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
