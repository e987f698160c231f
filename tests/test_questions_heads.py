"""Heads for a task with questions (`head/questions.py`): `fit` reads every question's features in
one pass and fits a head per question with a gold column, kept in one file; `classify --head`
answers those questions from their heads and the others zero-shot, from the same pass."""

from __future__ import annotations

import csv
import dataclasses

import numpy as np
import pandas as pd
import pytest

from slmclassify import Classifier, EngineSettings
from slmclassify.core import questions as qs
from slmclassify.head.features import feature_sets
from slmclassify.head.fitting import fit
from slmclassify.head.model import Head
from slmclassify.head.one_vs_rest import fit_one_vs_rest
from slmclassify.head.model import QuestionHeads
from slmclassify.head.questions import head_states, tap_columns
from slmclassify.jobs.sources import read_task

from helpers import interrupt_after
from test_questions import SMALL

TEAM = {"billing": "card charged twice", "technical": "app crashes on start", "account": "password login locked"}
PRIORITY = {"low": "no rush", "normal": "please look", "urgent": "right now"}
TOPICS = {"refund": "refund", "delay": "late"}


def _rows(n: int, seed: int = 0):
    """Tickets whose words decide each question's answer: (id, text, team, priority, topics)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        team, priority = list(TEAM)[i % 3], list(PRIORITY)[(i // 3) % 3]
        topics = [t for t in TOPICS if rng.random() < 0.5]
        text = " ".join([TEAM[team], PRIORITY[priority], *(TOPICS[t] for t in topics), str(i)])
        rows.append((i, text, team, priority, ";".join(topics)))
    return rows


def _write(path, rows):
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "text", "gold_team", "gold_priority", "gold_topics"])
        writer.writerows(rows)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory, llama_dir):
    """The heads of `team` and `topics` (priority has no gold column), fitted by the library with
    the pass counted and its states kept."""
    from slmclassify.jobs import fit as fit_job

    folder = tmp_path_factory.mktemp("question-heads")
    (folder / "triage.toml").write_text(SMALL)
    _write(folder / "train.csv", _rows(36))
    task = read_task(str(folder / "triage.toml"))
    passes = []
    original = fit_job.collect

    def counted(classifier, encoded, taps, progress=None):
        passes.append(original(classifier, encoded, taps, progress))
        return passes[-1]

    request = fit_job.FitRequest(str(folder / "train.csv"), str(folder / "heads.npz"), folds=3,
                                 gold_columns=(("team", "gold_team"), ("topics", "gold_topics")))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(fit_job, "collect", counted)
        summary = fit_job.fit_file(request, task, EngineSettings(), model=str(llama_dir))
    return folder, task, summary, passes


def test_fit_reads_every_question_in_one_pass_and_each_head_is_that_questions_fit(fitted):
    folder, task, summary, passes = fitted
    assert len(passes) == 1  # one feature pass for every question
    _, calibrated, states = passes[0]
    heads = Head.load(folder / "heads.npz")
    assert isinstance(heads, QuestionHeads) and list(heads.heads) == ["team", "topics"]
    assert [f.name for f in summary.fits] == ["team", "topics"] and summary.not_fitted == ("priority",)
    rows = _rows(36)
    spans = dict((q.name, labels) for q, labels in qs.label_spans(task))
    hidden = states.shape[1] // len(summary.taps)

    # team: the fit of a task of that question alone, on the same states
    gold = np.array([r[2] for r in rows])
    sets = feature_sets(summary.taps, hidden)
    alone = fit(states.astype(np.float64), gold, seed=0, folds=3,
                candidates={name: columns for name, (_, columns) in sets.items()})
    team = heads.heads["team"]
    assert team.taps == sets[alone.choice][0] and team.labels == alone.labels
    np.testing.assert_array_equal(team.coef, alone.coef)
    np.testing.assert_array_equal(team.intercept, alone.intercept)
    zero = np.exp(calibrated[:, spans["team"]]).argmax(1)
    assert summary.fits[0].zero_shot["accuracy"] == pytest.approx(np.mean(np.array(task.questions[0].labels)[zero] == gold))

    # topics: one-vs-rest on the mean-pooled layers, as fit does for a multi-label task
    topics = heads.heads["topics"]
    gold_topics = np.array([[t in r[4].split(";") for t in TOPICS] for r in rows])
    X = states[:, tap_columns(summary.taps, topics.taps, hidden)].astype(np.float64)
    ovr = fit_one_vs_rest(X, gold_topics, tuple(TOPICS), seed=0, folds=3)
    assert topics.multi_label and topics.taps.mean == summary.taps.mean and not topics.taps.last
    np.testing.assert_array_equal(topics.coef, ovr.coef)
    assert heads.task["questions"][1]["name"] == "priority"  # the whole task is recorded


def test_classify_answers_from_the_heads_and_the_rest_zero_shot(fitted, llama_dir, llama_loaded, run_main, tmp_path):
    folder, task, _, _ = fitted
    rows = _rows(12, seed=5)
    _write(tmp_path / "in.csv", rows)
    base = ["classify", tmp_path / "in.csv", "--model", llama_dir, "--task", folder / "triage.toml", "--quiet"]
    code, _, err = run_main(*base, "-o", tmp_path / "zero.csv")
    assert code == 0, err
    code, _, err = run_main(*base, "-o", tmp_path / "heads.csv", "--head", folder / "heads.npz")
    assert code == 0, err
    zero, got = pd.read_csv(tmp_path / "zero.csv"), pd.read_csv(tmp_path / "heads.csv")
    assert list(got.columns) == list(zero.columns)
    priority = [c for c in zero.columns if c.startswith("priority") or c.startswith("p_priority_")]
    pd.testing.assert_frame_equal(got[priority], zero[priority])  # no head: zero-shot, from the same pass

    heads = Head.load(folder / "heads.npz")
    clf = Classifier(task, model=llama_loaded)
    scored = clf.score(clf.encode([r[1] for r in rows]), taps=heads.taps)
    calibrated = clf.calibration.calibrated(scored.scores)
    spans = dict((q.name, labels) for q, labels in qs.label_spans(task))
    team = heads.heads["team"]
    p = np.exp(team.log_probabilities(team.features(head_states(team, heads.taps, scored.states),
                                                    calibrated[:, spans["team"]])))
    for j, label in enumerate(team.labels):
        np.testing.assert_allclose(got[f"p_team_{label}"], p[:, j], atol=1e-5)
    assert got["team"].tolist() == [team.labels[k] for k in p.argmax(1)]
    topics = heads.heads["topics"]
    odds = topics.log_odds(topics.features(head_states(topics, heads.taps, scored.states),
                                           calibrated[:, spans["topics"]]))
    for j, label in enumerate(topics.labels):
        np.testing.assert_allclose(got[f"p_topics_{label}"], 1 / (1 + np.exp(-odds[:, j])), atol=1e-5)


def test_heads_for_another_task_are_refused_naming_the_question(fitted, llama_dir, run_main, tmp_path):
    folder, _, _, _ = fitted
    _write(tmp_path / "in.csv", _rows(4))
    (tmp_path / "other.toml").write_text(SMALL.replace('"low", "normal", "urgent"', '"low", "high"'))
    code, _, err = run_main("classify", tmp_path / "in.csv", "-o", tmp_path / "o.csv", "--model", llama_dir,
                            "--task", tmp_path / "other.toml", "--head", folder / "heads.npz")
    assert code == 2 and "fitted for another task (question 'priority': labels:" in err, err
    assert not (tmp_path / "o.csv").exists()


def test_fit_on_the_command_line_and_resume_with_the_heads(fitted, llama_dir, run_main, monkeypatch, tmp_path):
    folder, _, _, _ = fitted
    task = ["--model", llama_dir, "--task", folder / "triage.toml"]
    code, _, err = run_main("fit", folder / "train.csv", "-o", tmp_path / "h.npz", *task, "--gold-column", "gold_team")
    assert code == 2 and "--gold-column NAME=COLUMN" in err and "team, priority, topics" in err, err
    code, out, err = run_main("fit", folder / "train.csv", "-o", tmp_path / "h.npz", *task, "--folds", "3",
                              "--gold-column", "team=gold_team", "--gold-column", "priority=gold_priority")
    assert code == 0, err
    lines = out.splitlines()
    assert "one fast-path pass" in out and "no head (no gold column): topics" in out, out
    assert any(line.startswith("team ") and "single" in line for line in lines)
    assert any(line.startswith("priority ") for line in lines) and "wrote" in lines[-1]
    assert list(Head.load(tmp_path / "h.npz").heads) == ["team", "priority"]

    # resume with the heads: byte-identical; another heads file is refused
    _write(tmp_path / "in.csv", _rows(20, seed=7))
    base = ["classify", tmp_path / "in.csv", *task, "--head", tmp_path / "h.npz", "--window", "4", "--quiet"]
    code, _, err = run_main(*base, "-o", tmp_path / "whole.csv")
    assert code == 0, err
    with monkeypatch.context() as m:
        interrupt_after(m, 2)
        assert run_main(*base, "-o", tmp_path / "part.csv")[0] == 130
    heads = Head.load(tmp_path / "h.npz")
    dataclasses.replace(heads, info={**heads.info, "source": "elsewhere"}).save(tmp_path / "other.npz")
    other = [a if a != tmp_path / "h.npz" else tmp_path / "other.npz" for a in base]
    code, _, err = run_main(*other, "-o", tmp_path / "part.csv", "--resume")
    assert code == 2 and "the head or --scorer changed" in err, err
    code, _, err = run_main(*base, "-o", tmp_path / "part.csv", "--resume")
    assert code == 0, err
    assert (tmp_path / "part.csv").read_bytes() == (tmp_path / "whole.csv").read_bytes()
