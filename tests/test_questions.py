"""Several questions about one item in its one pass (`core/questions.py`): every question's answers
are branches of the label trie after the generation prompt, exact against the reference path per
question, with per-question probabilities, calibration, review flags and output columns."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from slmclassify import Classifier, EngineSettings, Task, TaskError
from slmclassify.core import questions as qs
from slmclassify.core.calibration import CONTENT_FREE, prior_from_scores
from slmclassify.core.labels import build_trie
from slmclassify.core.reference import reference_scores
from slmclassify.core.results import softmax
from slmclassify.core.task import Question, merge_task
from slmclassify.jobs.sources import read_task

from helpers import assert_matches_reference, interrupt_after, random_texts

TRIAGE = """
instruction = "You triage customer support tickets."
user_template = "Ticket: {text}"

[[questions]]
name = "team"
question = "Which team should handle it?"
labels = [{name = "billing", description = "payments and invoices"},
          {name = "technical", description = "bugs and errors"},
          {name = "account", description = "logins and passwords"}]

[[questions]]
name = "priority"
labels = ["low", "normal", "urgent"]
min_confidence = 0.4

[[questions]]
name = "topics"
multi_label = true
labels = ["refund", "delay"]
calibrate = false
"""


SMALL = """
instruction = "Triage."

[[questions]]
name = "team"
labels = ["billing", "technical", "account"]

[[questions]]
name = "priority"
labels = ["low", "normal", "urgent"]
min_confidence = 0.4

[[questions]]
name = "topics"
multi_label = true
labels = ["refund", "delay"]
calibrate = false
"""
"""The triage questions in a system turn that fits the tiny test models' 256-token context."""


def triage_task(tmp_path, text: str = SMALL) -> Task:
    path = tmp_path / "triage.toml"
    path.write_text(text)
    return read_task(str(path))


def test_a_task_file_of_questions_is_read_with_each_questions_settings(tmp_path):
    task = triage_task(tmp_path, TRIAGE)
    assert [q.name for q in task.questions] == ["team", "priority", "topics"] and task.labels == ()
    team, priority, topics = task.questions
    assert team.labels == ("billing", "technical", "account") and team.question == "Which team should handle it?"
    assert team.task.descriptions[0] == "payments and invoices"
    assert priority.task.min_confidence == 0.4 and team.task.min_confidence == 0.5
    assert topics.multi_label and not topics.task.calibrate and task.calibrate  # calibrated when any question is
    assert qs.scored_names(task) == ("team: billing", "team: technical", "team: account", "priority: low",
                                     "priority: normal", "priority: urgent", "topics: refund: yes",
                                     "topics: refund: no", "topics: delay: yes", "topics: delay: no")
    turn = task.system_turn()
    assert turn.startswith("You triage customer support tickets.\nAnswer each question with its name, a colon")
    assert "- team: Which team should handle it? Answer with exactly one of these labels:\n  - billing: payments" in turn
    assert "- priority: Answer with exactly one of: low, normal, urgent." in turn
    assert '"topics: refund: yes"' in turn
    # the whole task's options on the command line apply to every question
    merged = merge_task({"questions": [{"name": "a", "labels": ["x", "y"]}, {"name": "b", "labels": ["u", "v"],
                                                                            "calibrate": False}]},
                        min_confidence=0.8, calibrate=True)
    assert [q.task.min_confidence for q in merged.questions] == [0.8, 0.8]
    assert [q.task.calibrate for q in merged.questions] == [True, True]


@pytest.mark.parametrize("text, message", [
    ('labels = ["a", "b"]\n[[questions]]\nname = "q"\nlabels = ["x", "y"]', "lists the labels in each question"),
    ('[[questions]]\nname = "q"\nlabels = ["x", "y"]\n[[questions]]\nname = "q"\nlabels = ["u", "v"]',
     "'q' is asked twice"),
    ('[[questions]]\nname = "two words"\nlabels = ["x", "y"]', "letters, digits and _"),
    ('[[questions]]\nname = "q"\nlabels = ["x"]', "at least two labels"),
    ('[[questions]]\nname = "q"\nlabels = ["x", "y"]\ncolour = "red"', "unknown key(s) in question 1"),
    ('[[questions]]\nlabels = ["x", "y"]', "question 1 needs a 'name' and 'labels'"),
    ('questions = []', "one or more [[questions]] tables"),
    ('mode = "first"\n[[questions]]\nname = "q"\nlabels = ["x", "y"]', "needs mode full or auto"),
    ('[[questions]]\nname = "q"\nlabels = ["x", "y"]\nthresholds = [0.5, 0.5]', "multi-label task"),
])
def test_bad_questions_are_refused_in_one_line(tmp_path, text, message):
    with pytest.raises(TaskError) as info:
        triage_task(tmp_path, text)
    assert message in str(info.value) and "\n" not in str(info.value)


def _per_question_reference(clf, encoded, index):
    """Each question's branches scored alone: a trie of that question's sequences only, through the
    unmodified Hugging Face forward on the same rendered tokens."""
    out = []
    for q, span in qs.branch_spans(clf.task):
        trie = build_trie(q.branches(), list(clf.trie.sequences[span]), "full")
        out.append(reference_scores(clf.loaded.model, encoded.ids[index], trie).double().numpy())
    return np.concatenate(out)


def test_one_pass_equals_each_questions_reference(tmp_path, tiny_loaded):
    """Every question's branches from the one pass (padded batches, the prefix cache, duplicates)
    equal that question scored alone through the reference path; the question names are fed once."""
    task = triage_task(tmp_path)
    clf = Classifier(task, model=tiny_loaded, settings=EngineSettings(token_budget=200, max_rows=4))
    assert clf.trie.labels == qs.scored_names(task) and clf.mode == "full"
    texts = random_texts(9, seed=7)
    texts = texts + texts[:2]
    scored = assert_matches_reference(clf, texts)
    encoded = clf.encode(texts)
    for i in (0, 4, 10):
        assert np.abs(scored.scores[i] - _per_question_reference(clf, encoded, i)).max() <= 1e-4
    # one node per name token, shared by every answer of the question
    assert clf.trie.n_nodes < sum(len(s) - 1 for s in clf.trie.sequences)


@pytest.mark.parametrize("family", ["gemma3_text", "qwen3", "phi3", "lfm2"])
def test_every_family_scores_questions_exactly(tmp_path, tiny_tokenizer, family):
    from family_models import family_model
    from slmclassify import load_model

    family_model(family, len(tiny_tokenizer), seed=3).save_pretrained(tmp_path / "m")
    tiny_tokenizer.save_pretrained(tmp_path / "m")
    loaded = load_model(str(tmp_path / "m"), precision="fp32")
    clf = Classifier(triage_task(tmp_path), model=loaded, settings=EngineSettings(token_budget=150, max_rows=3))
    assert_matches_reference(clf, random_texts(5, seed=11))


def test_results_are_each_questions_own_softmax_calibration_and_review(tmp_path, tiny_loaded):
    task = triage_task(tmp_path)
    clf = Classifier(task, model=tiny_loaded)
    texts = random_texts(6, seed=2) + [""]
    out = clf.classify(texts)
    scores = clf.score(clf.encode(texts)).scores
    free = clf.score(clf.scorer.encode(list(CONTENT_FREE), score_empty=True)).scores
    team, priority, topics = (span for _, span in qs.branch_spans(task))
    # a single-choice question: the softmax of its own branches, less its own content-free prior
    p_team = softmax(scores[:, team] - prior_from_scores(free[:, team]))
    # calibrated: each question's prior from the same content-free passes; topics is not calibrated
    assert np.allclose(clf.bias[6:], 0.0)
    for r, row, scores_row in zip(out[:-1], p_team[:-1], scores[:-1]):
        assert set(r.answers) == {"team", "priority", "topics"} and r.label is None
        a = r.answers["team"]
        assert np.allclose([a.probabilities[k] for k in ("billing", "technical", "account")], row)
        assert a.label == ("billing", "technical", "account")[int(np.argmax(row))]
        p = r.answers["priority"]
        assert p.needs_review == (p.confidence < 0.4)
        t = r.answers["topics"]
        yes = 1 / (1 + np.exp(-(scores_row[topics][0::2] - scores_row[topics][1::2])))
        assert np.allclose([t.probabilities["refund"], t.probabilities["delay"]], yes)
        assert r.needs_review == any(x.needs_review for x in r.answers.values())
        assert r.confidence == min(x.confidence for x in r.answers.values())
        assert set(r.scores) == set(qs.scored_names(task))
    assert out[-1].status == "empty" and out[-1].needs_review
    assert all(a.label is None for a in out[-1].answers.values())


def write_rows(path, texts):
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "text"])
        writer.writerows(enumerate(texts))


COLUMNS = ["team", "team_confidence", "team_needs_review", "p_team_billing", "p_team_technical", "p_team_account",
           "priority", "priority_confidence", "priority_needs_review", "p_priority_low", "p_priority_normal",
           "p_priority_urgent", "topics_labels", "topics_confidence", "topics_needs_review", "p_topics_refund",
           "p_topics_delay", "needs_review", "status"]


def test_classify_writes_each_questions_columns_and_probes_every_branch(tmp_path, llama_dir, run_main,
                                                                        one_torch_thread):
    import pandas as pd

    triage_task(tmp_path)
    texts = random_texts(9, seed=4) + [""]
    write_rows(tmp_path / "in.csv", texts)
    code, out, err = run_main("classify", tmp_path / "in.csv", "-o", tmp_path / "out.csv", "--model", llama_dir,
                              "--task", tmp_path / "triage.toml", "--probes", "4")
    assert code == 0, err
    frame = pd.read_csv(tmp_path / "out.csv", keep_default_na=False)
    assert list(frame.columns) == ["id", "text", *COLUMNS]
    assert frame["id"].tolist() == list(range(10)) and frame["status"].tolist()[-1] == "empty"
    for _, row in frame.iloc[:-1].iterrows():
        p = [float(row[f"p_team_{k}"]) for k in ("billing", "technical", "account")]
        assert row["team"] == ("billing", "technical", "account")[int(np.argmax(p))]
        assert abs(sum(p) - 1) < 1e-6
        chosen = [k for k in ("refund", "delay") if float(row[f"p_topics_{k}"]) >= 0.5]
        assert row["topics_labels"] == ";".join(chosen)
        assert str(row["needs_review"]) == str(any(str(row[f"{q}_needs_review"]) == "True"
                                                   for q in ("team", "priority", "topics")))
    assert "verify: 4/4 probes agree with the per-item path" in err
    # a prefix keeps the columns apart from the input's
    write_rows(tmp_path / "clash.csv", texts)
    frame = pd.read_csv(tmp_path / "clash.csv").rename(columns={"text": "text"}).assign(team="x")
    frame.to_csv(tmp_path / "clash.csv", index=False)
    code, _, err = run_main("classify", tmp_path / "clash.csv", "-o", tmp_path / "o2.csv", "--model", llama_dir,
                            "--task", tmp_path / "triage.toml")
    assert code == 2 and "already has column 'team'" in err and "--result-prefix" in err
    code, _, err = run_main("classify", tmp_path / "clash.csv", "-o", tmp_path / "o2.jsonl", "--model", llama_dir,
                            "--task", tmp_path / "triage.toml", "--result-prefix", "pred_")
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "o2.jsonl").read_text().splitlines()]
    assert rows[0]["team"] == "x" and "pred_team" in rows[0] and isinstance(rows[0]["pred_topics_labels"], list)


def test_resume_with_questions_is_byte_identical(tmp_path, llama_dir, run_main, monkeypatch):
    triage_task(tmp_path)
    write_rows(tmp_path / "in.csv", random_texts(40, seed=3))
    base = ["classify", tmp_path / "in.csv", "--model", llama_dir, "--task", tmp_path / "triage.toml",
            "--window", "8", "--quiet"]
    code, _, err = run_main(*base, "-o", tmp_path / "whole.csv")
    assert code == 0, err
    with monkeypatch.context() as m:
        interrupt_after(m, 3)
        assert run_main(*base, "-o", tmp_path / "part.csv")[0] == 130
    code, _, err = run_main(*base, "-o", tmp_path / "part.csv", "--resume")
    assert code == 0, err
    assert (tmp_path / "part.csv").read_bytes() == (tmp_path / "whole.csv").read_bytes()
    # another question set is another task: refused, naming what changed
    (tmp_path / "triage.toml").write_text(SMALL.replace('min_confidence = 0.4', 'min_confidence = 0.3'))
    with monkeypatch.context() as m:
        interrupt_after(m, 1)
        assert run_main(*base, "-o", tmp_path / "p2.csv")[0] == 130
    (tmp_path / "triage.toml").write_text(SMALL)
    code, _, err = run_main(*base, "-o", tmp_path / "p2.csv", "--resume")
    assert code == 2 and "questions" in err


def test_a_question_needs_a_real_question_object():
    with pytest.raises(TaskError, match="Question objects"):
        Task(labels=(), questions=("priority",))
    with pytest.raises(TaskError, match="names the output's columns"):
        Question("1st", Task(labels=("a", "b")))


def test_what_does_not_take_questions_yet_says_so_in_one_line(tmp_path, llama_dir, run_main):
    """Fit (a head per question, tests/test_questions_heads.py) needs a gold column per question, and
    says so before the model loads (the labelling page takes questions: tests/test_label_questions.py)."""
    triage_task(tmp_path)
    with (tmp_path / "gold.csv").open("w", newline="") as f:
        csv.writer(f).writerows([("text", "label"), *((t, "low") for t in random_texts(6, seed=1))])
    task = ["--model", llama_dir, "--task", tmp_path / "triage.toml"]
    code, _, err = run_main("fit", tmp_path / "gold.csv", "-o", tmp_path / "h.npz", *task)
    assert code == 2 and "give each one's gold column as --gold-column NAME=COLUMN" in err
    assert not (tmp_path / "h.npz").exists()


@pytest.mark.isa
def test_int8_scores_every_questions_branches_within_its_tolerance(tmp_path, llama_dir, monkeypatch):
    """int8 (the engine's quantised GEMMs, on every x86 CPU) scores a task of questions within int8's
    tolerance of the float32 reference, every question's branches, as it scores one question's labels."""
    from test_families import TOLERANCE

    from slmclassify import load_model

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    loaded = load_model(str(llama_dir), precision="int8")
    clf = Classifier(triage_task(tmp_path), model=loaded, settings=EngineSettings(token_budget=200, max_rows=4))
    assert clf.engine.backend.precision == "int8"
    encoded = clf.encode(random_texts(8, seed=5))
    fast, ref = clf.score(encoded).scores, clf.reference(encoded, range(8))
    assert fast.shape == ref.shape == (8, len(qs.scored_names(clf.task)))
    assert 1e-4 < float(np.abs(fast - ref).max()) <= TOLERANCE["int8"]


def test_the_bench_rows_ratios_read_the_right_way(llama_loaded, monkeypatch):
    """Row (q) of `bench`: with one question's runs taking 2 s, the three questions' 2.5 s and three
    single-question runs 6 s, the row says 1.25x one question's cost and 2.4x faster than three runs
    (a fixed clock: the ratios' direction, not a speed); its agreement is against the reference."""
    import torch

    from slmclassify.bench import questions as bench_questions
    from slmclassify.timing import Timings

    seconds = {"questions": 2.5, "one": 2.0, "three": 6.0}

    def fixed(sides, rounds, **_):
        values = {side.name: [[side.run(None)] for _ in range(rounds)] for side in sides}
        return Timings(tuple(seconds), {n: np.full((rounds, 1), s) for n, s in seconds.items()}, values)

    monkeypatch.setattr(bench_questions, "interleave", fixed)
    row = bench_questions.questions_row(llama_loaded, random_texts(3, seed=1, max_words=8), EngineSettings(),
                                        torch.device("cpu"))
    assert row["cost_vs_one"] == pytest.approx(1.25) and row["faster_than_three"] == pytest.approx(2.4)
    assert row["faster_than_three_rounds"] == [2.4] * 3 and row["agree"] == 3 and row["max_abs_diff"] < 1e-4
