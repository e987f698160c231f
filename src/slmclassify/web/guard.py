"""The token check in front of both web apps, on raw ASGI scopes.

Each app picks where its token may come from: the service reads only `Authorization: Bearer KEY`;
the labelling page also takes its own header and `?token=` (how its URL is opened). Whatever the
source, a token is compared in constant time (`hmac.compare_digest` takes the same time wherever
the strings differ), and a refusal is a JSON body {"error": message}. A header named twice is read
at its first occurrence.
"""

from __future__ import annotations

import hmac
import json
from urllib.parse import parse_qs


def header(scope, name: bytes) -> str | None:
    """The first `name` header of `scope` (a lower-case name, as ASGI gives them), as Latin-1 text."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


def bearer(scope) -> str | None:
    """The token of `Authorization: Bearer TOKEN` (any case of "Bearer", stripped); None when the
    header is missing, names another scheme or holds no token."""
    scheme, _, value = (header(scope, b"authorization") or "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def query_value(scope, name: str) -> str | None:
    """The last non-empty `name=` value of the query string, or None."""
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get(name)
    return values[-1] if values else None


def matches(given: str | None, token: bytes) -> bool:
    """Whether `given` is `token`, in constant time; a missing token (None) never matches."""
    return given is not None and hmac.compare_digest(given.encode(), token)


async def send_error(send, status: int, message: str, headers=(), *, error=None) -> None:
    """A JSON error response: {"error": message} (or {"error": error} where the route's clients read
    another shape), with `headers` after the content headers."""
    body = json.dumps({"error": message if error is None else error}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})
