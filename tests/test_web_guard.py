"""The token check both web apps share (`web/guard.py`) and their one bind (`web/bind.py`): each
app's middleware over a trivial ASGI app, so that only the check is tested. The service reads only
`Authorization: Bearer`, 401 for a missing or wrong key; the labelling page also reads its own
header and `?token=`, 401 for a missing token and 403 for a wrong one."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
pytest.importorskip("prometheus_client")

from fastapi.testclient import TestClient  # noqa: E402

from slmclassify.errors import TaskError  # noqa: E402
from slmclassify.label.app import TokenGuard  # noqa: E402
from slmclassify.serve.guard import Guard  # noqa: E402
from slmclassify.serve.metrics import Metrics  # noqa: E402
from slmclassify.web.bind import bind  # noqa: E402
from slmclassify.web.guard import bearer, matches, query_value  # noqa: E402

TOKEN = "s3cret"


async def hello(scope, receive, send):
    """The app behind the guard: 200 "hello" to any request that reaches it."""
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"hello"})


def scope(headers=(), query=b""):
    return {"type": "http", "headers": [(k.lower().encode(), v.encode()) for k, v in headers], "query_string": query}


@pytest.mark.parametrize("headers,expected", [
    ([("Authorization", "Bearer abc")], "abc"),
    ([("Authorization", "bearer  abc ")], "abc"),
    ([("Authorization", "Basic abc")], None),
    ([("Authorization", "Bearer ")], None),
    ([("Authorization", "Bearer")], None),
    ([], None),
    ([("Authorization", "Bearer first"), ("Authorization", "Bearer second")], "first"),
])
def test_bearer_reads_the_authorization_header(headers, expected):
    assert bearer(scope(headers)) == expected


def test_query_value_and_matches():
    assert query_value(scope(query=b"a=1&token=x&token=y"), "token") == "y"
    assert query_value(scope(query=b"token="), "token") is None
    assert matches("s3cret", b"s3cret") and not matches("s3cres", b"s3cret") and not matches(None, b"s3cret")
    assert not matches("", b"s3cret")


@pytest.fixture
def service():
    return TestClient(Guard(hello, api_key=TOKEN, max_body_bytes=1000, metrics=Metrics()))


@pytest.fixture
def page():
    return TestClient(TokenGuard(hello, TOKEN))


def test_the_service_takes_only_the_right_bearer_key(service):
    assert service.get("/v1/tasks", headers={"Authorization": f"Bearer {TOKEN}"}).text == "hello"
    for headers in ({}, {"Authorization": "Bearer s3cres"}, {"Authorization": f"Basic {TOKEN}"},
                    {"X-Label-Token": TOKEN}):
        refused = service.get("/v1/tasks", headers=headers)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert refused.json() == {"error": "missing or wrong API key: send 'Authorization: Bearer <key>'"}
    assert service.get(f"/v1/tasks?token={TOKEN}").status_code == 401  # the page's ?token= is not the service's
    assert service.get("/healthz").text == "hello"  # an open path


@pytest.mark.parametrize("how", [{"headers": {"Authorization": f"Bearer {TOKEN}"}},
                                 {"headers": {"X-Label-Token": TOKEN}}, {"params": {"token": TOKEN}}])
def test_the_page_takes_its_token_from_a_header_or_the_url(page, how):
    ok = page.get("/api/state", **how)
    assert ok.status_code == 200 and ok.text == "hello" and ok.headers["cache-control"] == "no-store"


@pytest.mark.parametrize("how,missing", [
    ({}, True),
    ({"params": {"token": ""}}, True),
    ({"headers": {"Authorization": "Bearer s3cres"}}, False),
    ({"headers": {"X-Label-Token": "s3cres"}}, False),
    ({"headers": {"X-Label-Token": " "}}, False),  # a blank header is a wrong token, not a missing one
    ({"params": {"token": "s3cres"}}, False),
    ({"headers": {"Authorization": "Bearer s3cres"}, "params": {"token": TOKEN}}, False),  # the header comes first
])
def test_the_page_refuses_a_missing_or_wrong_token(page, how, missing):
    """403 either way (the issue "Labelling for a team": every route, every role); the message says which."""
    refused = page.get("/api/state", **how)
    assert refused.status_code == 403 and refused.headers["cache-control"] == "no-store"
    word = "this page needs its token" if missing else "wrong token"
    assert refused.json() == {"error": f"{word}: open the URL that `slmclassify label` printed"}


def test_the_page_needs_a_token():
    with pytest.raises(TaskError, match="non-empty token"):
        TokenGuard(hello, "")


def test_bind_listens_and_a_taken_port_raises_oserror():
    sock = bind("127.0.0.1", 0, backlog=8)
    try:
        port = sock.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        with pytest.raises(OSError):
            bind("127.0.0.1", port, backlog=8)
    finally:
        sock.close()
