"""`slmclassify serve`: a real uvicorn server on 127.0.0.1 (ephemeral port) over a tiny random
Llama; every answer is compared with offline `classify` on the same texts."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from slmclassify.models.loading import model_id  # noqa: E402
from slmclassify import Classifier, EngineSettings, Task  # noqa: E402
from slmclassify.serve import ServeSettings  # noqa: E402
from slmclassify.serve.adapter import TaskRunner  # noqa: E402
from slmclassify.serve.app import create_app  # noqa: E402
from slmclassify.serve.scheduler import POOL_BUDGETS, Scheduler, Ticket, batch_wait  # noqa: E402
from slmclassify.serve.server import bind, build_service, make_server  # noqa: E402

TASK = Task(labels=("billing", "technical", "account"), user_template="Ticket: {text}")
TEXTS = [
    "My card was charged twice for the same invoice.",
    "The mobile app crashes whenever I open the settings page.",
    "I need to change the email address on my profile.",
    "refund",
    "I have been waiting for a response for several days now and would really appreciate an update.",
    "login error crash",
    "parcel delivery invoice refund password",
    "",
    "The mobile app crashes whenever I open the settings page. I need to change the email address.",
]
WAIT = 30  # seconds: the bound on every wait in these tests (never reached when they pass)


def offline(loaded, texts, **engine):
    """Offline classify: Results and raw scores, with the server's default engine settings."""
    clf = Classifier(TASK, model=loaded, settings=EngineSettings(**engine))
    encoded = clf.encode(texts)
    return clf.classify(texts), clf.score(encoded).scores


@contextmanager
def running(loaded, engine=None, **settings):
    """A uvicorn server in a thread on an ephemeral loopback port; yields (url, FastAPI app)."""
    service = build_service({"support": TASK}, loaded, engine or EngineSettings(), ServeSettings(**settings))
    guarded = create_app(service)
    sock = bind("127.0.0.1", 0)
    server = make_server(guarded, service.settings)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", guarded.app
    finally:
        server.should_exit = True
        thread.join(WAIT)
        sock.close()


def post(url, body, **kw):
    return httpx.post(f"{url}/v1/classify", json=body, timeout=WAIT, **kw)


def metric(url, name, **kw) -> float:
    """The value of one sample in /metrics (0 when absent)."""
    text = httpx.get(f"{url}/metrics", timeout=WAIT, **kw).text
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_for(condition, what):
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def assert_same(got: dict, want):
    """The service's result equals offline `want` exactly: the same bits (an item's scores do not depend
    on the batch it ran in, and JSON keeps every digit of a float)."""
    assert got["status"] == want.status
    assert got["label"] == want.label, (got, want)
    assert got["needs_review"] == want.needs_review
    assert got["probabilities"] == want.probabilities, (got["probabilities"], want.probabilities)


def test_concurrent_requests_are_batched_together_and_split_back(llama_loaded):
    """Requests of 16 concurrent clients arriving within max_wait share engine batches; each gets its own
    texts' results, in order, with the bits of each text scored alone."""
    want, _ = offline(llama_loaded, TEXTS, max_rows=1)
    requests = [TEXTS[i:i + k] for i, k in ((0, 1), (1, 3), (4, 1), (5, 4), (3, 1), (8, 1), (7, 1), (2, 2),
                                            (6, 2), (0, 4), (4, 2), (1, 1), (3, 5), (8, 1), (5, 1), (0, 9))]
    with running(llama_loaded, max_wait_ms=4000) as (url, _app):
        with ThreadPoolExecutor(len(requests)) as pool:
            answers = list(pool.map(lambda texts: post(url, {"task": "support", "texts": texts}), requests))
        batches = metric(url, "slmclassify_batch_rows_count")
        rows = metric(url, "slmclassify_batch_rows_sum")
    assert [a.status_code for a in answers] == [200] * len(requests)
    for texts, answer in zip(requests, answers):
        results = answer.json()["results"]
        assert len(results) == len(texts)
        for text, got in zip(texts, results):
            assert_same(got, want[TEXTS.index(text)])
    scored = sum(1 for texts in requests for t in texts if t.strip())
    assert rows == scored  # every text ran exactly once (the empty one not at all)
    assert batches < len([r for r in requests if any(t.strip() for t in r)])  # requests shared batches


@pytest.mark.parametrize("groups", [[9], [1] * 9, [3, 1, 5], [2, 7]])
def test_scheduler_scores_equal_offline_however_requests_are_grouped(llama_loaded, groups):
    """Raw label log-probs the same bits as offline classify for any grouping and a small token budget
    (several engine batches per pool, items of different requests in one batch)."""
    _, want = offline(llama_loaded, TEXTS)
    runner = TaskRunner("support", Classifier(TASK, model=llama_loaded,
                                              settings=EngineSettings(token_budget=48, max_rows=3)))
    order = np.random.default_rng(len(groups)).permutation(len(TEXTS))
    scheduler = Scheduler(max_wait_ms=0, max_queue_items=100)
    tickets, start = [], 0
    for size in groups:
        idx = order[start:start + size]
        start += size
        ticket = Ticket(runner, runner.encode([TEXTS[i] for i in idx]))
        if ticket.size:
            scheduler.submit(ticket)  # all queued before the worker starts: one pool
        tickets.append((idx, ticket))
    scheduler.start()
    try:
        for idx, ticket in tickets:
            if ticket.size:
                results = ticket.future.result(WAIT)
                assert [r.status for r in results] == ["empty" if not TEXTS[i].strip() else "ok" for i in idx]
            np.testing.assert_array_equal(ticket.scores, want[idx])
    finally:
        scheduler.stop(WAIT)


def test_batch_wait_keeps_the_pool_open_while_requests_arrive():
    """The idle engine waits a gap after the latest arrival, at most max_wait in all, never when full."""
    wait = dict(max_wait=0.1, gap=0.025, full=False)
    idle_since = 0.0
    # a lone request on an idle engine waits one gap, not max_wait
    assert batch_wait(10.0, first=10.0, last=10.0, free_since=idle_since, **wait) == pytest.approx(0.025)
    # each arrival keeps the pool open for another gap ...
    assert batch_wait(10.03, first=10.0, last=10.02, free_since=idle_since, **wait) == pytest.approx(0.015)
    # ... until max_wait after the first
    assert batch_wait(10.09, first=10.0, last=10.09, free_since=idle_since, **wait) == pytest.approx(0.01)
    assert batch_wait(10.1, first=10.0, last=10.1, free_since=idle_since, **wait) <= 0
    assert batch_wait(10.0, first=10.0, last=10.0, free_since=idle_since, **{**wait, "full": True}) == 0
    # batching off: never waits
    assert batch_wait(10.0, first=10.0, last=10.0, free_since=idle_since, max_wait=0.0, gap=0.0, full=False) <= 0


def test_batch_wait_counts_from_the_engine_becoming_free():
    """Regression (issue 11): a ticket that arrived while the engine was busy used to be taken the
    moment the engine finished, alone or with a few others, because its own max_wait had passed;
    the clients the pool's last batch just answered sent their next requests a few ms later and
    waited a whole pool for the next one. Now the engine waits one gap after it became free."""
    wait = dict(max_wait=0.1, gap=0.025, full=False)
    busy_until = 20.0
    assert batch_wait(busy_until, first=15.0, last=18.0, free_since=busy_until, **wait) == pytest.approx(0.025)
    # a returning client arrives 10 ms later: another gap from it
    assert batch_wait(20.01, first=15.0, last=20.01, free_since=busy_until, **wait) == pytest.approx(0.025)
    # at most max_wait after the engine became free
    assert batch_wait(20.1, first=15.0, last=20.1, free_since=busy_until, **wait) <= 0


def test_scheduler_waits_for_returning_clients_until_the_pool_is_full(llama_loaded):
    """Wired into the scheduler: tickets queued while the engine ran wait one gap after it is free;
    a pool of POOL_BUDGETS token budgets is taken at once."""
    runner = TaskRunner("support", Classifier(TASK, model=llama_loaded, settings=EngineSettings(token_budget=48)))
    scheduler = Scheduler(max_wait_ms=100, max_queue_items=1000)
    old = Ticket(runner, runner.encode([TEXTS[0]]), enqueued=5.0)  # queued while the engine was busy
    scheduler.submit(old)
    scheduler._free_since = 9.0  # the engine finished its last pool at t = 9 s
    assert scheduler._wait_left(9.0) == pytest.approx(0.025)  # max_wait / 4
    assert scheduler._wait_left(9.03) <= 0  # no one came back within the gap
    back = Ticket(runner, runner.encode([TEXTS[1]]), enqueued=9.02)
    scheduler.submit(back)
    assert scheduler._wait_left(9.03) == pytest.approx(0.015)
    while scheduler._queue[-1].tokens and sum(t.tokens for t in scheduler._queue) < POOL_BUDGETS * 48:
        scheduler.submit(Ticket(runner, runner.encode([TEXTS[4]]), enqueued=9.03))
    assert scheduler._wait_left(9.03) == 0  # full: no reason to wait
    pool = scheduler._next_pool()
    assert pool[:2] == [old, back] and scheduler.queued_items == 0


def test_cancelled_ticket_is_dropped_before_it_runs(llama_loaded):
    runner = TaskRunner("support", Classifier(TASK, model=llama_loaded))
    scheduler = Scheduler(max_wait_ms=0, max_queue_items=100)
    gone, kept = Ticket(runner, runner.encode(TEXTS[:3])), Ticket(runner, runner.encode(TEXTS[3:5]))
    scheduler.submit(gone)
    scheduler.submit(kept)
    scheduler.cancel(gone)
    assert scheduler.queued_items == 2
    scheduler.start()
    try:
        assert len(kept.future.result(WAIT)) == 2
        assert not gone.future.done() and np.isnan(gone.scores).all()
    finally:
        scheduler.stop(WAIT)


def test_error_paths(llama_loaded):
    with running(llama_loaded, max_texts=4, max_body_bytes=2000) as (url, _app):
        unknown = post(url, {"task": "nope", "text": "hi"})
        assert unknown.status_code == 404
        assert unknown.json() == {"error": "unknown task 'nope'; tasks are: support"}
        for body in ({"task": "support"}, {"task": "support", "text": "a", "texts": ["b"]},
                     {"task": "support", "texts": []}, {"task": "support", "texts": "abc"},
                     {"task": "support", "text": "a", "extra": 1}, {"text": "a"}):
            bad = post(url, body)
            assert bad.status_code == 422, body
            assert bad.json()["error"].startswith("invalid request body: "), bad.json()
        many = post(url, {"task": "support", "texts": ["a"] * 5})
        assert many.status_code == 413
        assert "5 texts in one request, over the limit of 4" in many.json()["error"]
        big = post(url, {"task": "support", "text": "x" * 3000})
        assert big.status_code == 413 and "over the limit of 2000 bytes" in big.json()["error"]
        chunked = httpx.post(f"{url}/v1/classify", content=iter([b'{"task": "support", "text": "', b"x" * 3000, b'"}']),
                             headers={"content-type": "application/json"}, timeout=WAIT)
        assert chunked.status_code == 413  # no Content-Length: counted while reading
        assert post(url, {"task": "support", "text": "refund"}).status_code == 200


def test_api_key_compared_and_healthz_open(llama_loaded):
    with running(llama_loaded, api_key="s3cret") as (url, _app):
        assert post(url, {"task": "support", "text": "refund"}).status_code == 401
        wrong = post(url, {"task": "support", "text": "refund"}, headers={"authorization": "Bearer s3cres"})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        assert "API key" in wrong.json()["error"]
        assert httpx.get(f"{url}/metrics", timeout=WAIT).status_code == 401
        assert httpx.get(f"{url}/healthz", timeout=WAIT).status_code == 200
        ok = post(url, {"task": "support", "text": "refund"}, headers={"authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and len(ok.json()["results"]) == 1


def test_full_queue_answers_503_with_retry_after(llama_loaded):
    with running(llama_loaded, max_queue_items=3, max_wait_ms=12000) as (url, app):
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(post, url, {"task": "support", "texts": TEXTS[:3]})
            wait_for(lambda: app.state.scheduler.queued_items == 3, "the first request to be queued")
            full = post(url, {"task": "support", "text": "refund"})
            assert full.status_code == 503
            assert int(full.headers["retry-after"]) >= 1
            assert "queue is full" in full.json()["error"]
            assert first.result(WAIT).status_code == 200
        assert metric(url, 'slmclassify_requests_total{path="/v1/classify",status="503"}') == 1


def test_timeout_and_disconnect_drop_pending_texts(llama_loaded):
    with running(llama_loaded, max_wait_ms=12000, request_timeout_s=0.5) as (url, _app):
        late = post(url, {"task": "support", "texts": TEXTS[:2]})
        assert late.status_code == 504 and "--request-timeout" in late.json()["error"]
        assert metric(url, "slmclassify_items_dropped_total") == 2
    with running(llama_loaded, max_wait_ms=12000) as (url, app):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/classify", json={"task": "support", "texts": TEXTS[:3]}, timeout=0.5)
        wait_for(lambda: metric(url, "slmclassify_items_dropped_total") == 3, "the texts to be dropped")
        assert app.state.scheduler.queued_items == 0
        assert metric(url, "slmclassify_batch_rows_count") == 0  # the engine never ran them


def test_truncated_status_and_metrics_exposed(llama_loaded):
    long_text = " ".join(["parcel delivery invoice refund password"] * 8)
    want, _ = offline(llama_loaded, [long_text, "refund"], max_text_tokens=5)
    with running(llama_loaded, engine=EngineSettings(max_text_tokens=5)) as (url, _app):
        answer = post(url, {"task": "support", "texts": [long_text, "refund"]}).json()["results"]
        assert [r["status"] for r in answer] == ["truncated", "ok"]
        for got, w in zip(answer, want):
            assert_same(got, w)
        tasks = httpx.get(f"{url}/v1/tasks", timeout=WAIT).json()
        assert tasks["tasks"][0]["labels"] == list(TASK.labels) and tasks["limits"]["max_text_tokens"] == 5
        assert httpx.get(f"{url}/readyz", timeout=WAIT).json()["status"] == "ready"
        assert httpx.get(f"{url}/docs", timeout=WAIT).status_code == 200
        text = httpx.get(f"{url}/metrics", timeout=WAIT).text
        for name in ("slmclassify_requests_total", "slmclassify_request_seconds_bucket", "slmclassify_batch_rows_bucket",
                     "slmclassify_padding_share", "slmclassify_queue_items", "slmclassify_queue_wait_seconds_bucket",
                     'slmclassify_items_total{status="truncated",task="support"} 1.0'):
            assert name in text, name


def test_loadtest_checks_every_response(llama_loaded):
    from slmclassify.bench.service_load import run_load

    texts = [t for t in TEXTS if t.strip()]
    want, _ = offline(llama_loaded, texts)
    expected = [{"label": r.label, "status": r.status, "probabilities": r.probabilities} for r in want]
    with running(llama_loaded, max_wait_ms=20) as (url, _app):
        report = run_load(url, "support", texts, concurrency=4, duration=WAIT, max_requests=24, expected=expected,
                          tolerance=1e-4)
        wrong = list(reversed(expected))
        mixed = run_load(url, "support", texts, concurrency=2, duration=WAIT, max_requests=8, expected=wrong)
    assert report.statuses == {"200": 24} and report.ok == 24
    assert report.checked == 24 and report.mismatched == 0 and report.max_prob_diff <= 1e-4
    assert mixed.mismatched > 0 and mixed.examples  # the check can fail


def test_vllm_pooling_shape_answers_like_our_shape(llama_loaded):
    """vLLM's /v1/classify body ({model, input}), at /v1/classify and /classify: one `data` entry per text
    in order, `probs` in the task's label order equal to our shape's probabilities, `usage` the real
    prompt tokens; `model` a task or, with one task, the loaded model's name (as GET /v1/models lists)."""
    texts = TEXTS[:4] + [""]
    with running(llama_loaded) as (url, _app):
        ours = post(url, {"task": "support", "texts": texts}).json()["results"]
        listed = httpx.get(f"{url}/v1/models", timeout=WAIT).json()
        assert [m["id"] for m in listed["data"]] == ["support", model_id(llama_loaded.name)]
        answers = [httpx.post(f"{url}{path}", json={"model": model, "input": texts}, timeout=WAIT).json()
                   for path in ("/v1/classify", "/classify") for model in ("support", model_id(llama_loaded.name))]
        one = httpx.post(f"{url}/v1/classify", json={"model": "support", "input": texts[0]}, timeout=WAIT).json()
        unknown = httpx.post(f"{url}/v1/classify", json={"model": "other", "input": "hi"}, timeout=WAIT)
        empty = httpx.post(f"{url}/v1/classify", json={"model": "support", "input": []}, timeout=WAIT)
        ids = httpx.post(f"{url}/v1/classify", json={"model": "support", "input": [1, 2]}, timeout=WAIT)
    clf = Classifier(TASK, model=llama_loaded)
    encoded = clf.encode(texts)
    tokens = sum(encoded.prompt_length(i) for i in range(len(texts)))
    for answer in answers:
        assert answer["object"] == "list" and answer["id"].startswith("classify-")
        assert answer["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                                   "prompt_tokens_details": None}
        assert [d["index"] for d in answer["data"]] == list(range(len(texts)))
        for got, want in zip(answer["data"], ours):
            assert got["label"] == want["label"] and got["num_classes"] == 3
            assert got["probs"] == ([want["probabilities"][lab] for lab in TASK.labels] if want["label"] else [])
    assert one["data"][0]["probs"] == answers[0]["data"][0]["probs"] and one["model"] == "support"
    assert unknown.status_code == 404 and unknown.json()["error"].startswith("unknown model 'other': name a task")
    assert empty.status_code == 422 and "input is an empty list" in empty.json()["error"]
    assert ids.status_code == 422 and ids.json()["error"] == (
        "invalid request body: input: Value error, input must be a string or a list of strings (token ids are not "
        "taken: send texts)")
