"""The labelling page's app (label/app.py) with FastAPI's TestClient over a fake session: the token
guards every route, the answer / skip / undo flows reach the session, and no request can
name a file."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from slmclassify.errors import TaskError
from slmclassify.label.answers import InvalidAnswer  # noqa: E402
from slmclassify.label.app import create_app, page_html  # noqa: E402

TOKEN = "s3cret-token"
LABELS = ("billing", "technical", "account")
TEXTS = ["refund please", "app crashes", "change my email", "invoice twice", "login error"]


class FakeSession:
    """The LabelSession interface over a list of texts: items in order, the guess is always the
    first label, every call recorded."""

    def __init__(self, texts=TEXTS, ready=True):
        self.texts, self._ready = list(texts), ready
        self.answers: dict[int, str] = {}
        self.skipped: set[int] = set()
        self.history: list[int] = []
        self.calls: list[tuple] = []
        self.lock = threading.Lock()

    def ready(self):
        return self._ready

    def _current(self):
        for row, text in enumerate(self.texts):
            if row not in self.answers and row not in self.skipped:
                return row
        return None

    def state(self, who=""):
        with self.lock:
            row = self._current()
            item = None if row is None else {"row": row, "text": self.texts[row], "guess": LABELS[0],
                                             "confidence": 0.61, "reason": "a random pick"}
            counts = {label: sum(1 for a in self.answers.values() if a == label) for label in LABELS}
            return {"item": item, "labels": list(LABELS), "counts": counts, "labelled": len(self.answers), "skipped": len(self.skipped),
                    "pool": len(self.texts), "scored": len(self.texts), "sample_note": None,
                    "accuracy": None, "auto_share": None, "fitting": False}

    def _check(self, row):
        if row != self._current():
            raise TaskError(f"row {row} is not the item on the page")

    def answer(self, row, label, version=None, who=""):
        with self.lock:
            self.calls.append(("answer", row, label))
            self._check(row)
            if label not in LABELS:  # as the real session's `Answers.encode`
                raise InvalidAnswer(f"unknown label {label!r}")
            self.answers[row] = label
            self.history.append(row)

    def skip(self, row, version=None, who=""):
        with self.lock:
            self.calls.append(("skip", row))
            self._check(row)
            self.skipped.add(row)
            self.history.append(row)

    def undo(self, who=""):
        with self.lock:
            self.calls.append(("undo",))
            if self.history:
                row = self.history.pop()
                self.answers.pop(row, None)
                self.skipped.discard(row)

    def show(self, row, who=""):
        with self.lock:
            self.calls.append(("show", row))

    def export(self, path):
        self.calls.append(("export", str(path)))
        return len(self.answers)

    def fit(self, path):
        self.calls.append(("fit", str(path)))

    def close(self):
        self.calls.append(("close",))


@pytest.fixture
def page(tmp_path):
    session = FakeSession()
    app = create_app(session, TOKEN, export_path=tmp_path / "out.csv", fit_path=tmp_path / "head.npz")
    with TestClient(app) as client:
        yield client, session, tmp_path


AUTH = {"Authorization": f"Bearer {TOKEN}"}
ROUTES = [("GET", "/", None), ("GET", "/api/state", None), ("POST", "/api/answer", {"row": 0, "label": "billing"}),
("POST", "/api/skip", {"row": 0}), ("POST", "/api/undo", {}),
          ("POST", "/api/export", {}), ("POST", "/api/fit", {}), ("GET", "/docs", None),
          ("GET", "/openapi.json", None), ("GET", "/no-such-page", None)]


@pytest.mark.parametrize("method, path, body", ROUTES)
def test_every_route_needs_the_token(page, method, path, body):
    client, session, _ = page
    missing = client.request(method, path, json=body)
    assert missing.status_code == 403 and "needs its token" in missing.json()["error"]
    for wrong in ({"headers": {"Authorization": "Bearer nope"}}, {"params": {"token": "nope"}},
                  {"headers": {"X-Label-Token": TOKEN[:-1]}}, {"headers": {"Authorization": f"Basic {TOKEN}"}}):
        answer = client.request(method, path, json=body, **wrong)
        assert answer.status_code == 403, (wrong, answer.status_code)
    assert session.calls == []  # nothing reached the session


def test_token_as_query_bearer_or_header(page):
    client, _, _ = page
    for how in ({"params": {"token": TOKEN}}, {"headers": AUTH}, {"headers": {"X-Label-Token": TOKEN}}):
        assert client.get("/api/state", **how).status_code == 200


def test_page_is_served_with_strict_headers(page):
    client, _, _ = page
    answer = client.get("/", params={"token": TOKEN})
    assert answer.status_code == 200 and answer.text == page_html()
    assert "<title>slmclassify label</title>" in answer.text
    assert answer.headers["referrer-policy"] == "no-referrer"
    assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
    assert "innerHTML" not in answer.text  # item texts are shown with textContent only


def test_answer_skip_undo_flow(page):
    client, session, tmp_path = page
    state = client.get("/api/state", headers=AUTH).json()
    assert state["ready"] and state["item"]["row"] == 0 and state["item"]["text"] == TEXTS[0]
    assert state["export_path"] == str(tmp_path / "out.csv") and state["fit_path"] == str(tmp_path / "head.npz")
    state = client.post("/api/answer", json={"row": 0, "label": "technical"}, headers=AUTH).json()
    assert state["item"]["row"] == 1 and state["counts"]["technical"] == 1
    state = client.post("/api/skip", json={"row": 1}, headers=AUTH).json()
    assert state["item"]["row"] == 2 and state["skipped"] == 1
    state = client.post("/api/answer", json={"row": 2, "label": "billing"}, headers=AUTH).json()
    assert state["item"]["row"] == 3 and session.answers == {0: "technical", 2: "billing"}
    state = client.post("/api/undo", json={}, headers=AUTH).json()
    assert state["item"]["row"] == 2 and session.answers == {0: "technical"}
    state = client.post("/api/undo", json={}, headers=AUTH).json()
    assert state["item"]["row"] == 1 and state["skipped"] == 0
    assert session.calls == [("answer", 0, "technical"), ("skip", 1), ("answer", 2, "billing"), ("undo",), ("undo",)]


def test_refusals_are_json_errors(page):
    client, session, _ = page
    stale = client.post("/api/answer", json={"row": 3, "label": "billing"}, headers=AUTH)
    assert stale.status_code == 409 and stale.json() == {"error": "row 3 is not the item on the page"}
    unknown = client.post("/api/answer", json={"row": 0, "label": "shipping"}, headers=AUTH)
    assert unknown.status_code == 422 and "unknown label" in unknown.json()["error"]  # the request's fault
    bad = client.post("/api/answer", json={"row": "zero", "label": "billing"}, headers=AUTH)
    assert bad.status_code == 422 and bad.json()["error"].startswith("invalid request: row:")
    assert session.answers == {}


@pytest.mark.parametrize("path, body", [
    ("/api/export", {"path": "/etc/passwd"}), ("/api/fit", {"path": "/tmp/x.npz"}),
    ("/api/fit", {"fit_path": "x.npz"}), ("/api/export", {"export_path": "x.csv"}),
    ("/api/undo", {"path": "x"}), ("/api/answer", {"row": 0, "label": "billing", "path": "x"}),
])
def test_no_request_can_name_a_file(page, path, body):
    client, session, _ = page
    answer = client.post(path, json=body, headers=AUTH)
    assert answer.status_code == 422 and "extra" in answer.json()["error"].lower()
    with_query = client.post(path, json={k: v for k, v in body.items() if "path" not in k},
                             params={"path": "/etc/passwd"}, headers=AUTH)
    assert with_query.status_code == 200  # a query parameter is ignored: the fixed paths are written
    assert all("/etc/passwd" not in " ".join(map(str, call)) for call in session.calls)


def test_export_and_fit_write_only_the_fixed_paths(page):
    client, session, tmp_path = page
    assert client.post("/api/export", json={}, headers=AUTH).json() == {"written": str(tmp_path / "out.csv"), "rows": 0}
    assert client.post("/api/fit", json={}, headers=AUTH).json() == {"written": str(tmp_path / "head.npz")}
    assert session.calls == [("export", str(tmp_path / "out.csv")), ("fit", str(tmp_path / "head.npz"))]


def test_state_before_the_first_slice(tmp_path):
    app = create_app(FakeSession(ready=False), TOKEN, export_path=tmp_path / "a.csv", fit_path=tmp_path / "h.npz")
    with TestClient(app) as client:
        assert client.get("/api/state", headers=AUTH).json() == {
            "ready": False, "export_path": str(tmp_path / "a.csv"), "fit_path": str(tmp_path / "h.npz")}


def test_an_empty_token_is_refused():
    with pytest.raises(TaskError, match="non-empty token"):
        create_app(FakeSession(), "", export_path="a.csv", fit_path="h.npz")


TASK_TOML = 'labels = ["billing", "technical", "account"]\nuser_template = "Ticket: {text}"\n'


@pytest.mark.parametrize("args, message", [
    (["--sample", "0"], "--sample must be a positive number of rows, got 0"),
    (["--target-accuracy", "1.5"], "--target-accuracy must be in (0, 1], got 1.5"),
    (["--api-key", " "], "--api-key is empty"),
    (["--export", "{input}"], "--export {input} is the input {input}; write to another file"),
    (["--store", "{folder}/in.sqlite"], "the page's export file {folder}/in.labelled.csv is the input {input}"),
    (["--store", "{folder}/none.sqlite", "--export", "{folder}/out.csv"], "no label store at {folder}/none.sqlite: "
     "label first (`slmclassify label {input} --task ...`), or give the store with --store"),
])
def test_label_option_errors(tmp_path, run_main, args, message):
    """Checked before the model loads; no output path may be the input itself."""
    (tmp_path / "t.toml").write_text(TASK_TOML)
    where = {"input": tmp_path / "in.labelled.csv", "folder": tmp_path}
    code, out, err = run_main("label", where["input"], "--task", tmp_path / "t.toml",
                              *(a.format(**where) for a in args))
    assert code == 2 and out == "" and message.format(**where) in err, err


def test_export_and_fit_from_the_store_without_the_page(tmp_path, llama_dir, run_main, one_torch_thread):
    """Answers given in one session come out of `label --export/--fit` (no server): the labelled rows
    in input order with a gold column, and a head that `classify --head` applies."""
    import pandas as pd

    from slmclassify.head.model import Head
    from slmclassify.jobs.sources import read_task
    from slmclassify.label.session import LabelRequest, LabelSession

    pd.DataFrame({"id": range(12), "text": [f"{w} problem number {i}" for i, w in
                                            enumerate(["refund", "crash", "password"] * 4)]}).to_csv(
        tmp_path / "in.csv", index=False)
    (tmp_path / "t.toml").write_text(TASK_TOML)
    store = tmp_path / "in.labels.sqlite"
    session = LabelSession.start(LabelRequest(str(tmp_path / "in.csv"), store), read_task(tmp_path / "t.toml"),
                                 model=str(llama_dir))
    try:
        session.wait_ready()
        for row in (0, 3, 6, 9):
            session.answer(row, "billing")
        for row in (1, 4, 7):
            session.answer(row, "technical")
    finally:
        session.close()
    code, out, err = run_main("label", tmp_path / "in.csv", "--task", tmp_path / "t.toml", "--store", store,
                              "--model", llama_dir, "--export", tmp_path / "gold.csv", "--fit", tmp_path / "head.npz")
    assert code == 0, err
    assert out.splitlines() == [
        f"wrote 7 labelled rows to {tmp_path / 'gold.csv'}",
        f"wrote {tmp_path / 'head.npz'}: a head fitted on 7 answers; classify with it: "
        f"slmclassify classify {tmp_path / 'in.csv'} -o OUT --head {tmp_path / 'head.npz'}"]
    gold = pd.read_csv(tmp_path / "gold.csv")
    assert gold["id"].tolist() == [0, 1, 3, 4, 6, 7, 9]
    assert gold["gold"].tolist() == ["billing", "technical", "billing", "technical", "billing", "technical", "billing"]
    assert Head.load(tmp_path / "head.npz").labels == ("billing", "technical")
    code, _, err = run_main("classify", tmp_path / "in.csv", "-o", tmp_path / "out.csv", "--model", llama_dir,
                            "--head", tmp_path / "head.npz", "--quiet")
    assert code == 0, err


def test_a_taken_port_fails_before_the_model_loads(tmp_path, run_main):
    import socket

    (tmp_path / "t.toml").write_text(TASK_TOML)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code, out, err = run_main("label", tmp_path / "in.csv", "--task", tmp_path / "t.toml", "--model",
                                  tmp_path / "no-model", "--port", port)
    assert code == 2 and out == ""
    assert err.startswith(f"slmclassify: error: cannot listen on 127.0.0.1:{port}: ") and "pick another --port" in err


@pytest.mark.parametrize("body", [{"row": True, "label": "billing"}, {"row": "0", "label": "billing"},
                                  {"row": 0, "label": "billing", "version": "1"}])
def test_a_row_must_be_a_number(page, body):
    """Before: `{"row": true}` was taken as row 1."""
    client, session, _ = page
    answer = client.post("/api/answer", json=body, headers=AUTH)
    assert answer.status_code == 422 and "invalid request" in answer.json()["error"]
    assert session.calls == []


@pytest.mark.parametrize("method,path,body,status", [("GET", "/api/state", None, 200),
                                                      ("POST", "/api/answer", {"row": 0, "label": "billing"}, 200),
                                                      ("GET", "/api/state?token=wrong", None, 403)])
def test_every_answer_carries_the_page_headers(page, method, path, body, status):
    """The token is in the page's URL: every response, the API's JSON and the refusals included,
    says no-referrer and the content policy (before: only the page itself)."""
    client, _, _ = page
    headers = {} if "token=" in path else AUTH
    answer = client.request(method, path, json=body, headers=headers)
    assert answer.status_code == status
    assert answer.headers["referrer-policy"] == "no-referrer"
    assert "default-src 'none'" in answer.headers["content-security-policy"]


def test_an_answer_the_task_cannot_take_is_422_and_not_echoed_whole():
    """Before: an unknown label, or a bare string on a multi-label page, got 409 (meant for a stale answer)
    and a 30 MB label came back whole in the error. The task's own check (`Answers.encode`) says 422
    through the page's handler, with the value cut."""
    from slmclassify import Task
    from slmclassify.label.answers import codec_of

    multi = codec_of(Task(labels=("billing", "technical"), multi_label=True))  # the validation alone: no store
    with pytest.raises(InvalidAnswer, match="is a list of its labels"):
        multi.encode("billing")
    with pytest.raises(InvalidAnswer) as raised:
        multi.encode(["x" * 30_000_000])
    assert len(str(raised.value)) < 300 and "30000002 characters" in str(raised.value)
    one = codec_of(Task(labels=("billing", "technical")))
    with pytest.raises(InvalidAnswer, match=r"^label 'shipping' is not one of the task's labels"):
        one.encode("shipping")
