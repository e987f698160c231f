"""Labelling as a team (issue "Labelling for a team"): each member's own token, item, history and
undo; overlap items handed to further annotators first and never to more at once than they need;
disputed items to the reviewer, whose answer is final; the consensus the head and the exports learn
from; agreement over the items several answered; a store of before teams opens as one person's."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest

from slmclassify import Task
from slmclassify.errors import FieldError, TaskError
from slmclassify.label.store import LabelStore
from slmclassify.label.team import Team, TeamSpec, consensus, read_names

from helpers import tickets

pytest.importorskip("sklearn")

FINGERPRINT = {"input": {"rows": 3}, "task": "abc", "labels": ["billing", "technical"], "model": {"name": "m"},
               "sample": 10, "seed": 0}


@pytest.mark.parametrize("spec, field, words", [
    (dict(annotators=("alice", "alice")), "annotators", "named twice"),
    (dict(annotators=("alice",), reviewers=("alice",)), "annotators", "named twice"),
    (dict(annotators=("al ice",)), "annotators", "is not a name"),
    (dict(annotators=("",)), "annotators", "is not a name"),
    (dict(reviewers=("dana",)), "reviewers", "give --annotators too"),
    (dict(annotators=("alice", "bob"), overlap=3), "overlap", "needs that many annotators"),
    (dict(annotators=("alice", "bob"), overlap=0), "overlap", "positive"),
    (dict(annotators=("alice", "bob"), overlap=2, overlap_share=0), "overlap_share", "in \\(0, 1\\]"),
    (dict(annotators=("alice", "bob"), overlap=2, overlap_share=1.5), "overlap_share", "in \\(0, 1\\]"),
])
def test_a_team_is_checked_where_it_enters(spec, field, words):
    with pytest.raises(FieldError, match=words) as caught:
        TeamSpec(**spec)
    assert caught.value.field == field


def test_names_come_as_a_list_or_a_file(tmp_path):
    assert read_names("alice, bob,carol") == ("alice", "bob", "carol")
    names = tmp_path / "team.txt"
    names.write_text("alice\n# the night shift\nbob  # part time\n\n")
    assert read_names(str(names)) == ("alice", "bob")


def test_consensus_is_the_reviewers_else_the_majority_else_none():
    assert consensus([0, 0], 2) == consensus([0, 0], 2) and consensus([0, 0], 2).status == "unanimous"
    assert consensus([0], 2).status == "open" and consensus([0], 2).gold is None
    assert consensus([0, 1, 1], 3).gold == 1 and consensus([0, 1, 1], 3).status == "majority"
    tie = consensus([0, 1], 2)
    assert tie.gold is None and tie.status == "tie" and tie.disputed
    assert consensus([0, 1], 2, reviewed=0).gold == 0 and not consensus([0, 1], 2, reviewed=0).disputed


def test_the_overlap_share_holds_at_every_moment():
    team = Team.of(TeamSpec(("a", "b"), overlap=2, overlap_share=0.2), {})
    needs = team.needs(list(range(20)))
    doubled = [i for i, need in needs.items() if need == 2]
    assert doubled == [0, 5, 10, 15]  # a fifth, from the first item on
    for n in range(1, 21):
        assert sum(1 for i in range(n) if needs[i] == 2) >= 0.2 * n - 1e-9
    assert set(Team.of(TeamSpec(("a", "b"), overlap=2), {}).needs(list(range(5))).values()) == {2}
    assert set(Team.of(TeamSpec(("a", "b")), {}).needs(list(range(5))).values()) == {1}


def test_tokens_are_kept_and_matched_to_their_member():
    team = Team.of(TeamSpec(("alice", "bob"), ("dana",)), {"alice": {"role": "annotator", "token": "kept"}})
    assert team.member_of("kept").name == "alice"
    assert team.member_of(team.kept()["dana"]["token"]).role == "reviewer"
    assert team.member_of("nope") is None and team.member_of(None) is None and team.member_of("") is None
    assert len({m.token for m in team.members}) == 3


def test_a_store_of_before_teams_opens_as_one_persons(tmp_path):
    """Schema 1 had no `who`: its events are the one person's ("") after the upgrade in place."""
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, row INTEGER NOT NULL, text_hash TEXT "
                 "NOT NULL, label TEXT, kind TEXT NOT NULL DEFAULT '', undone INTEGER NOT NULL DEFAULT 0, at REAL NOT NULL)")
    conn.executemany("INSERT INTO meta VALUES (?, ?)", [("schema", "1"), ("fingerprint", json.dumps(FINGERPRINT))])
    conn.execute("INSERT INTO events (row, text_hash, label, kind, at) VALUES (1, 'h', 'billing', 'random', 0)")
    conn.commit()
    conn.close()
    store = LabelStore.open(path, FINGERPRINT)
    assert store.answers() == {1: "billing"} and store.row_version(1) == 1
    store.answer(2, "h2", "technical", who="alice")
    assert store.answers() == {1: "billing"} and store.answers("alice") == {2: "technical"}
    assert store.undo() == 1 and store.answers("alice") == {2: "technical"}  # undo is one person's
    store.close()
    store = LabelStore.open(path, FINGERPRINT)  # upgraded once: opens again as schema 2
    assert store.everyone().keys() == {(2, "alice")} and store.row_version(1) == 2
    store.close()


@pytest.fixture
def team_session(tmp_path, llama_dir, one_torch_thread):
    from slmclassify.label.session import LabelRequest, LabelSession

    data = tmp_path / "tickets.csv"
    gold = tickets(data)
    spec = TeamSpec(("alice", "bob", "carol"), ("dana",), overlap=2)
    session = LabelSession.start(LabelRequest(str(data), tmp_path / "s.sqlite", first_slice=30, team=spec),
                                 Task(labels=("billing", "technical")), model=str(llama_dir))
    assert session.wait_ready(120)
    yield session, gold, data
    session.close()


def _other(label: str) -> str:
    return "technical" if label == "billing" else "billing"


def test_a_team_labels_each_item_twice_and_the_reviewer_decides(team_session, tmp_path):
    session, gold, data = team_session
    a, b, c = (session.state(who)["item"] for who in ("alice", "bob", "carol"))
    assert len({a["row"], b["row"], c["row"]}) == 3  # nothing asks for a second answer yet: one item, one person
    session.answer(a["row"], gold[a["text"]], version=a["version"], who="alice")
    session.answer(b["row"], gold[b["text"]], version=b["version"], who="bob")
    # alice's item needs a second annotator: bob, who asks next, gets it, before any new item
    second = session.state("bob")["item"]
    assert second["row"] == a["row"] and "agreement" in second["reason"]
    assert "team_answers" not in second  # no anchoring: nobody else's answer on an annotator's page
    assert [h["row"] for h in session.state("bob")["history"]] == [b["row"]]
    # carol's next: not alice's item (bob holds it, and it needs one more answer), but bob's
    session.answer(c["row"], gold[c["text"]], version=c["version"], who="carol")
    assert session.state("carol")["item"]["row"] == b["row"]
    session.answer(a["row"], _other(gold[a["text"]]), version=second["version"], who="bob")
    state = session.state("dana")
    assert state["me"] == {"name": "dana", "role": "reviewer"} and state["team"]["disputed"] == 1
    review = state["item"]
    assert review["row"] == a["row"] and review["team_answers"] == {
        "alice": gold[a["text"]], "bob": _other(gold[a["text"]])}
    assert state["labelled"] == 0  # a tie has no gold, the others wait for their second answer
    session.answer(review["row"], gold[review["text"]], version=review["version"], who="dana")
    state = session.state("dana")
    assert state["team"]["disputed"] == 0 and state["team"]["reviewed"] == 1 and state["labelled"] == 1
    assert state["item"] is None  # nothing else disputed
    out = tmp_path / "out.csv"  # the consensus is what the export holds
    assert session.export(out) == 1
    assert gold[a["text"]] in out.read_text()
    # each person's history is their own; an undo takes back only their own answer
    assert [h["row"] for h in session.state("alice")["history"]] == [a["row"]]
    assert session.undo(who="bob") == a["row"]
    assert session.state("dana")["team"]["reviewed"] == 1  # dana's decision stands
    assert session.store.answers("alice") == {a["row"]: gold[a["text"]]}


def test_agreement_and_exports_of_a_teams_answers(team_session, tmp_path):
    from slmclassify.label.agreement import agreement

    session, gold, data = team_session
    given: dict[int, dict[str, str]] = {}
    for _ in range(9):  # alice and bob each answer what they are handed; bob disagrees on rows divisible by 3
        for who in ("alice", "bob"):
            item = session.state(who)["item"]
            label = _other(gold[item["text"]]) if who == "bob" and item["row"] % 3 == 0 else gold[item["text"]]
            session.answer(item["row"], label, version=item["version"], who=who)
            given.setdefault(item["row"], {})[who] = label
    both = sorted(row for row, by in given.items() if len(by) == 2)
    assert len(both) >= 6  # the overlap items were handed on before new ones
    report = session.agreement(bootstrap=50)
    assert session.agreement(bootstrap=50) is report  # the pages ask every few seconds: the same answers, no new bootstrap
    assert report["items"] == len(both) and report["annotators"] == ["alice", "bob"]
    labels = ("billing", "technical")
    table = np.array([[labels.index(given[r]["alice"]), labels.index(given[r]["bob"])] for r in both])
    want = agreement(table, labels, ("alice", "bob"), bootstrap=50, seed=0)
    assert report["questions"][0]["overall"] == want["overall"]
    ties = sum(1 for r in both if given[r]["alice"] != given[r]["bob"])
    assert ties and report["questions"][0]["overall"]["raw"]["value"] == pytest.approx(1 - ties / len(both))
    found = session.suspects(3)
    assert found["items"] == len(session.answers.given) and len(found["suspects"]) == 3
    assert {"row", "text", "gold", "probability", "predicted", "status"} <= found["suspects"][0].keys()
    datasets = pytest.importorskip("datasets")
    parquet = tmp_path / "team.parquet"
    assert session.export(parquet) == len(given)  # every answered item, ties included (label -1)
    ds = datasets.load_dataset("parquet", data_files=str(parquet), cache_dir=str(tmp_path / "hf"))["train"]
    assert ds.features["label"].names == list(labels)
    assert ds.features["answer_alice"].names == list(labels) and "answer_carol" in ds.column_names
    split = [r for r in ds if r["answer_alice"] != r["answer_bob"] and min(r["answer_alice"], r["answer_bob"]) >= 0]
    assert len(split) == ties and all(r["label"] == -1 for r in split)
    studio = tmp_path / "tasks.json"
    assert session.export(studio, "label-studio") == len(given)
    tasks = json.loads(studio.read_text())
    assert sum(len(t["annotations"]) for t in tasks) == sum(len(by) for by in given.values())
    with pytest.raises(TaskError, match="path ending in .json"):
        session.export(tmp_path / "tasks.csv", "label-studio")


def test_the_team_is_kept_in_the_store(tmp_path, llama_dir, one_torch_thread):
    """A second start without --annotators is the same team with the same addresses."""
    from slmclassify.label.session import LabelRequest, LabelSession

    data = tmp_path / "tickets.csv"
    tickets(data)
    request = LabelRequest(str(data), tmp_path / "s.sqlite", first_slice=4,
                           team=TeamSpec(("alice", "bob"), ("dana",)))
    task = Task(labels=("billing", "technical"))
    first = LabelSession.start(request, task, model=str(llama_dir))
    tokens = first.team.kept()
    first.close()
    import dataclasses

    again = LabelSession.start(dataclasses.replace(request, team=TeamSpec()), task, model=str(llama_dir))
    try:
        assert again.team.kept() == tokens and again.team.reviewers == ("dana",)
    finally:
        again.close()


TEAM_ROUTES = [("GET", "/", None), ("GET", "/api/state", None), ("GET", "/api/agreement", None),
               ("GET", "/api/suspects", None), ("POST", "/api/answer", {"row": 0, "label": "billing"}),
               ("POST", "/api/skip", {"row": 0}), ("POST", "/api/show", {"row": 0}), ("POST", "/api/undo", {}),
               ("POST", "/api/export", {}), ("POST", "/api/fit", {}), ("GET", "/no-such-page", None)]


def test_every_route_every_role_and_no_annotator_reads_anothers_answers(team_session, tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from slmclassify.label.app import create_app

    session, gold, data = team_session
    tokens = {name: kept["token"] for name, kept in session.team.kept().items()}
    app = create_app(session, None, export_path=tmp_path / "out.parquet", fit_path=tmp_path / "head.npz")
    with TestClient(app) as client:
        def as_(who):
            return {"Authorization": f"Bearer {tokens[who]}"}

        for method, path, body in TEAM_ROUTES:
            assert client.request(method, path, json=body).status_code == 403, path
            for token in tokens.values():
                for wrong in (token[:-1], token + "x", token.upper()):
                    refused = client.request(method, path, json=body, headers={"Authorization": f"Bearer {wrong}"})
                    assert refused.status_code == 403, (path, refused.text)
        assert session.store.everyone() == {}  # nothing reached the session
        # alice answers; bob, through every route he has, sees nothing of it
        item = client.get("/api/state", headers=as_("alice")).json()["item"]
        secret = _other(gold[item["text"]])
        client.post("/api/answer", json={"row": item["row"], "label": secret, "version": item["version"]},
                    headers=as_("alice"))
        for method, path, body in [("GET", "/api/state", None), ("POST", "/api/show", {"row": item["row"]}),
                                   ("GET", "/api/agreement", None), ("POST", "/api/undo", {})]:
            answer = client.request(method, path, json=body, headers=as_("bob")).json()
            if path == "/api/agreement":  # counts over items two or more answered: none yet
                assert answer["items"] == 0
            else:
                assert answer["history"] == [] and "team_answers" not in (answer["item"] or {})
        for path in ("/api/suspects", "/api/export", "/api/fit"):
            method = "GET" if path == "/api/suspects" else "POST"
            refused = client.request(method, path, json=None if method == "GET" else {}, headers=as_("bob"))
            assert refused.status_code == 403 and "reviewers'" in refused.json()["error"], path
        # bob (who showed it) disagrees with alice: the reviewer reads both answers
        mine = client.get("/api/state", headers=as_("bob")).json()["item"]
        assert mine["row"] == item["row"]
        client.post("/api/answer", json={"row": item["row"], "label": gold[item["text"]], "version": mine["version"]},
                    headers=as_("bob"))
        review = client.get("/api/state", headers=as_("dana")).json()["item"]
        assert review["row"] == item["row"] and review["team_answers"] == {"alice": secret, "bob": gold[item["text"]]}
        assert client.get("/api/suspects", headers=as_("dana")).status_code in (200, 409)  # too few answers: 409
        written = client.post("/api/export", json={}, headers=as_("dana")).json()
        assert written == {"written": str(tmp_path / "out.parquet"), "rows": 1}


@pytest.mark.parametrize("flags, words", [
    (["--annotators", "alice,bob", "--api-key", "k"], "--api-key is the one token of a page without a team"),
    (["--format", "parquet"], "--format is the format of --export"),
    (["--suspects", "0"], "--suspects must be a positive number"),
    (["--annotators", "alice,alice"], "--annotators: alice is named twice"),
    (["--annotators", "alice", "--overlap", "2"], "--overlap 2 needs that many annotators"),
    (["--export", "x.csv", "--format", "label-studio"], "--format label-studio writes a JSON file"),
])
def test_the_team_flags_are_checked_before_anything_loads(tmp_path, run_main, flags, words):
    data = tmp_path / "tickets.csv"
    tickets(data)
    (tmp_path / "s.sqlite").touch()
    code, out, err = run_main("label", data, "--labels", "billing,technical", "--store", tmp_path / "s.sqlite", *flags)
    assert code != 0 and words in err, err


def test_a_labels_examples_are_for_people_and_change_no_prompt(tmp_path):
    """The `examples` of a `[[labels]]` table are shown as guidelines; the prompt and the task's
    hash (what stores and heads are checked against) are those of the task without them."""
    from slmclassify.head.model import task_hash

    plain = Task.from_dict({"labels": [{"name": "billing", "description": "money"}, {"name": "technical"}]})
    shown = Task.from_dict({"labels": [{"name": "billing", "description": "money", "examples": ["charged twice"]},
                                       {"name": "technical"}]})
    assert shown.label_examples == (("charged twice",), ())
    assert shown.system_turn() == plain.system_turn() and task_hash(shown) == task_hash(plain)
    with pytest.raises(TaskError, match="'examples' must be a list of texts"):
        Task.from_dict({"labels": [{"name": "billing", "examples": "charged twice"}, {"name": "technical"}]})
