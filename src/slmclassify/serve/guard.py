"""ASGI middleware in front of every endpoint: API key, request-size limit, access log, metrics.

Order for each HTTP request: the API key is checked first (`Authorization: Bearer KEY` only,
`web/guard.py`; 401; the paths in `open_paths` skip it), then the body is read up to `max_body_bytes` (413 beyond, so a
huge body is never buffered) and replayed to the app; when the response is done, one JSON
access-log line is written and the request is counted by path and status.
"""

from __future__ import annotations

import json
import logging
import time
import uuid

from ..web.guard import bearer, header, matches, send_error

access_log = logging.getLogger("slmclassify.access")

OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/tokenize", "/detokenize",
                "/tokenizer_info", "/v1/tokenize", "/v1/detokenize", "/v1/tokenizer_info")
"""The routes whose clients (OpenAI's SDK, LangChain, lm-eval, vLLM's) read errors in OpenAI's shape."""
KNOWN_PATHS = ("/v1/classify", "/v1/tasks", "/healthz", "/readyz", "/metrics", "/docs", "/openapi.json", *OPENAI_PATHS)
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                 413: "invalid_request_error", 503: "service_unavailable_error", 504: "timeout_error"}


def openai_error(status: int, message: str, param: str | None = None) -> dict:
    """OpenAI's error object, {"message", "type", "param", "code"} (the value of "error")."""
    return {"message": message, "type": _OPENAI_TYPES.get(status, "api_error"), "param": param, "code": status}


class Guard:
    """Wraps the FastAPI app (see the module docstring)."""

    def __init__(self, app, *, api_key: str | None, max_body_bytes: int, metrics, open_paths=("/healthz",)):
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.open_paths = tuple(open_paths)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        state = scope.setdefault("state", {})
        request_id = header(scope, b"x-request-id") or uuid.uuid4().hex[:16]
        status = [None]

        async def send_logged(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"x-request-id", request_id.encode())]}
            await send(message)

        try:
            checked = self.api_key is not None and scope["path"] not in self.open_paths
            if checked and not matches(bearer(scope), self.api_key):
                await self._error(scope, send_logged, 401, "missing or wrong API key: send 'Authorization: Bearer "
                                  "<key>'", [(b"www-authenticate", b"Bearer")])
                return
            body = await self._read_body(scope, receive, send_logged)
            if body is None:
                return
            await self.app(scope, _replay(body, receive), send_logged)
        finally:
            code = status[0] if status[0] is not None else 499  # no response: the client went away
            path = scope["path"] if scope["path"] in KNOWN_PATHS else "other"
            self.metrics.requests.labels(path, str(code)).inc()
            access_log.info(json.dumps({
                "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z",
                "request_id": request_id,
                "client": (scope.get("client") or ("-",))[0],
                "method": scope["method"], "path": scope["path"], "status": code,
                "ms": round(1000 * (time.perf_counter() - started), 2),
                **{k: state[k] for k in ("task", "texts") if k in state},
            }))

    @staticmethod
    async def _error(scope, send, status: int, message: str, headers=()) -> None:
        """An error answered before the app, in the shape the route's clients read."""
        error = openai_error(status, message) if scope["path"] in OPENAI_PATHS else None
        await send_error(send, status, message, headers, error=error)

    async def _read_body(self, scope, receive, send) -> bytes | None:
        """The whole body, or None after answering 413 (or when the client left)."""
        declared = header(scope, b"content-length")
        too_large = (f"request body over the limit of {self.max_body_bytes} bytes "
                     "(--max-body-bytes); send fewer or shorter texts per request")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._error(scope, send, 413, too_large)
            return None
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._error(scope, send, 413, too_large)
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive):
    """A receive callable that returns the buffered body once, then waits on the real one
    (which reports the client's disconnect)."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
