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
    assert report["items"] == len(both) and report["annotators"] == ["alice", "bob"]
    labels = ("billing", "technical")
    table = np.array([[labels.index(given[r]["alice"]), labels.index(given[r]["bob"])] for r in both])
    want = agreement(table, labels, ("alice", "bob"), bootstrap=50, seed=0)
    assert report["questions"][0]["overall"] == want["overall"]
    ties = sum(1 for r in both if given[r]["alice"] != given[r]["bob"])
    assert ties and report["questions"][0]["overall"]["raw"]["value"] == pytest.approx(1 - ties / len(both))
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
