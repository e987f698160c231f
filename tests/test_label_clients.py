"""The labelling store under several clients at once, with real processes: a `slmclassify label`
server and client processes that answer, skip and undo concurrently. Before: the page's counts and
the store disagreed (page 48 labelled / 6 skipped, store 39 / 2), the refit, Export and Fit used the
page's in-memory answers, and of two clients answering the same item the later silently replaced
the earlier. Now the store is the single source of truth and a stale answer gets 409."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("sklearn")

from slmclassify.label.store import LabelStore  # noqa: E402

from helpers import tickets  # noqa: E402
from label_server import Page  # noqa: E402

WAIT = 180

CLIENT = r"""
import json, random, sys, urllib.error, urllib.request
url, token, seed, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
def call(method, path, body=None):
    req = urllib.request.Request(url + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
statuses = []
for _ in range(n):
    status, state = call("GET", "/api/state")
    item = state.get("item")
    what = rng.random()
    if item is None or what < 0.15:
        status, _ = call("POST", "/api/undo", {})
    elif what < 0.3:
        status, _ = call("POST", "/api/skip", {"row": item["row"], "version": item["version"]})
    else:
        status, _ = call("POST", "/api/answer", {"row": item["row"], "label": rng.choice(state["labels"]),
                                                 "version": item["version"]})
    statuses.append(status)
print(json.dumps(statuses))
"""


class Server(Page):
    """The `slmclassify label` process (`test_label_browser.Page`), called over HTTP like the page."""

    def __init__(self, args: list[str], cwd: Path):
        super().__init__(args, cwd=str(cwd))
        self.base, self.token = self.url.split("/?token=")

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        req = urllib.request.Request(self.base + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {self.token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def ready_state(self) -> dict:
        deadline = time.monotonic() + WAIT
        while True:
            status, state = self.call("GET", "/api/state")
            if status == 200 and state.get("ready") and state.get("item"):
                return state
            assert time.monotonic() < deadline, (status, state, "".join(self.errors))
            time.sleep(0.2)

@pytest.fixture
def server(tmp_path, llama_dir):
    tickets(tmp_path / "in.csv", n=40)
    store = tmp_path / "in.labels.sqlite"
    srv = Server([str(tmp_path / "in.csv"), "--labels", "billing,technical", "--model", str(llama_dir),
                  "--store", str(store), "--port", "0"], cwd=tmp_path)
    yield srv, store
    srv.kill()


def _store_counts(store: Path) -> tuple[int, int]:
    import sqlite3

    conn = sqlite3.connect(str(store))
    try:
        fingerprint = json.loads(conn.execute("SELECT value FROM meta WHERE key = 'fingerprint'").fetchone()[0])
    finally:
        conn.close()
    opened = LabelStore.open(store, fingerprint)
    try:
        return len(opened.answers()), len(opened.skipped())
    finally:
        opened.close()


def test_three_clients_at_once_and_the_store_agree(server):
    srv, store = server
    srv.ready_state()
    clients = [subprocess.Popen([sys.executable, "-c", CLIENT, srv.base, srv.token, str(seed), "50"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in range(3)]
    statuses = []
    for client in clients:
        out, err = client.communicate(timeout=WAIT)
        assert client.returncode == 0, err
        statuses += json.loads(out)
    assert set(statuses) <= {200, 409}, statuses  # 409: an item another client changed first
    assert statuses.count(200) > 50
    status, state = srv.call("GET", "/api/state")
    assert status == 200
    srv.kill()  # kill -9: every acknowledged change is in the store
    labelled, skipped = _store_counts(store)
    assert (state["labelled"], state["skipped"]) == (labelled, skipped)
    assert sum(state["counts"].values()) == labelled


def test_a_second_answer_to_an_item_changed_since_gets_409_with_the_current_state(server):
    srv, store = server
    item = srv.ready_state()["item"]
    first = srv.call("POST", "/api/answer", {"row": item["row"], "label": "billing", "version": item["version"]})
    assert first[0] == 200
    status, body = srv.call("POST", "/api/answer", {"row": item["row"], "label": "technical",
                                                    "version": item["version"]})
    assert status == 409, body
    assert "answered, skipped or undone elsewhere" in body["error"]
    assert body["state"]["labelled"] == 1 and body["state"]["item"]["row"] != item["row"]
    status, body = srv.call("POST", "/api/skip", {"row": item["row"], "version": item["version"]})
    assert status == 409
    srv.kill()
    assert _store_counts(store) == (1, 0)
