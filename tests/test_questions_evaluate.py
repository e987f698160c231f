"""`evaluate` of a task with questions (`--gold-column NAME=COLUMN`): every item scored once, each
question measured from its own columns against its own gold column, with the figures its own
Results give; the flags that measure or write one question refused in one line."""

from __future__ import annotations

import json
import math
import random
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from slmclassify import Classifier
from slmclassify.core import multilabel
from slmclassify.jobs.sources import read_task

from helpers import random_texts
from test_questions import SMALL


TEAMS, PRIORITIES = ("billing", "technical", "account"), ("low", "normal", "urgent")


def write_items(tmp_path, n: int = 10) -> tuple[list[str], dict[str, list[str]]]:
    """A task file and a table of `n` items (one empty) with a gold column per question, plus one row
    past `n` whose gold labels no question has (`--n` must stop before it)."""
    (tmp_path / "triage.toml").write_text(SMALL)
    rng = random.Random(3)
    texts = random_texts(n, seed=11, max_words=20)
    texts[4] = ""
    gold = {"g_team": [rng.choice(TEAMS) for _ in texts], "g_priority": [rng.choice(PRIORITIES) for _ in texts],
            "g_topics": [rng.choice(["", "refund", "delay", "refund;delay"]) for _ in texts]}
    frame = pd.DataFrame({"text": texts + ["one more"], **{k: v + ["nonsense"] for k, v in gold.items()}})
    frame.to_csv(tmp_path / "items.csv", index=False)
    return texts, gold


def _macro_f1(gold: list[str], predicted: list[str]) -> float:
    scores = []
    for label in set(gold):
        tp = sum(g == p == label for g, p in zip(gold, predicted))
        fp, fn = sum(p == label != g for g, p in zip(gold, predicted)), sum(g == label != p for g, p in zip(gold, predicted))
        scores.append(2 * tp / (2 * tp + fp + fn))
    return sum(scores) / len(scores)


def _ece(correct: list[bool], confidence: list[float], bins: int = 15) -> float:
    which = [min(max(math.ceil(c * bins) - 1, 0), bins - 1) for c in confidence]
    total = 0.0
    for b in set(which):
        inside = [i for i, w in enumerate(which) if w == b]
        total += abs(sum(correct[i] for i in inside) / len(inside) - sum(confidence[i] for i in inside) / len(inside)) \
            * len(inside)
    return total / len(correct)


def test_each_question_is_measured_from_its_own_results_in_one_pass(tmp_path, llama_dir, llama_loaded, run_main,
                                                                    one_torch_thread, monkeypatch):
    texts, gold = write_items(tmp_path)
    passes = []
    score = Classifier.score
    monkeypatch.setattr(Classifier, "score", lambda self, *a, **k: passes.append(1) or score(self, *a, **k))
    code, out, err = run_main("evaluate", tmp_path / "items.csv", "--model", llama_dir, "--task",
                              tmp_path / "triage.toml", "--gold-column", "team=g_team", "--gold-column",
                              "topics=g_topics", "--n", 10, "--json", tmp_path / "eval.json")
    assert code == 0, err
    assert len(passes) == 1  # every question from the same scores
    figures = json.loads((tmp_path / "eval.json").read_text())
    assert figures["items"] == 9 and figures["not_reported"] == ["priority"]
    assert list(figures["questions"]) == ["team", "topics"]

    monkeypatch.setattr(Classifier, "score", score)
    results = Classifier(read_task(str(tmp_path / "triage.toml")), model=llama_loaded).classify(texts)
    kept = [i for i, r in enumerate(results) if r.status != "empty"]
    assert kept == [i for i in range(10) if i != 4]

    team = figures["questions"]["team"]
    answers = [results[i].answers["team"] for i in kept]
    g = [gold["g_team"][i] for i in kept]
    predicted = [a.label for a in answers]
    correct = [x == y for x, y in zip(g, predicted)]
    assert team["kind"] == "single" and team["gold_column"] == "g_team" and team["items"] == 9
    assert team["accuracy"] == pytest.approx(sum(correct) / 9)
    assert team["macro_f1"] == pytest.approx(_macro_f1(g, predicted))
    assert team["ece"] == pytest.approx(_ece(correct, [a.confidence for a in answers]))
    assert team["majority"] == pytest.approx(Counter(g).most_common(1)[0][1] / 9)
    raw = [max(a.scores, key=a.scores.get) for a in answers]  # calibration off: the top raw score
    assert team["uncalibrated"]["accuracy"] == pytest.approx(sum(x == y for x, y in zip(g, raw)) / 9)
    assert team["uncalibrated"]["macro_f1"] == pytest.approx(_macro_f1(g, raw))

    topics = figures["questions"]["topics"]
    answers = [results[i].answers["topics"] for i in kept]
    g = [set(filter(None, gold["g_topics"][i].split(";"))) for i in kept]
    assert topics["kind"] == "multi-label" and topics["items"] == 9
    at_task = topics["at_task_thresholds"]
    assert at_task["subset_accuracy"] == pytest.approx(sum(set(a.labels) == s for a, s in zip(answers, g)) / 9)
    tp = sum(len(set(a.labels) & s) for a, s in zip(answers, g))
    wrong = sum(len(set(a.labels) ^ s) for a, s in zip(answers, g))
    assert at_task["micro_f1"] == pytest.approx(2 * tp / (2 * tp + wrong) if tp + wrong else 0.0)
    assert topics["majority"] == pytest.approx(Counter(frozenset(s) for s in g).most_common(1)[0][1] / 9)
    probs = np.array([[a.probabilities[k] for k in ("refund", "delay")] for a in answers])
    truth = np.array([[k in s for k in ("refund", "delay")] for s in g])
    expected = multilabel.cross_fitted(probs, truth, ("refund", "delay"))
    assert topics["cross_fitted"]["micro_f1"] == pytest.approx(expected["micro_f1"])
    assert topics["cross_fitted"]["subset_accuracy"] == pytest.approx(expected["subset_accuracy"])

    # the printed table: a row per question with a gold column, the figures of the JSON
    rows = {}
    for line in out.splitlines():
        if line.split()[:1] in (["team"], ["topics"]):
            rows.setdefault(line.split()[0], line.split())  # the table's row comes before the notes
    assert rows["team"][1:7] == ["g_team", "single", f"{team['accuracy']:.3f}", f"{team['macro_f1']:.3f}", "-",
                                 f"{team['ece']:.3f}"]
    cross = topics["cross_fitted"]
    assert rows["topics"][1:6] == ["g_topics", "multi-label", f"{cross['subset_accuracy']:.3f}",
                                   f"{cross['macro_f1']:.3f}", f"{cross['micro_f1']:.3f}"]
    assert "not reported (scored, no gold column): priority; add --gold-column priority=COLUMN" in out


@pytest.mark.parametrize("flags, message", [
    (["--gold-column", "gold"], "this task asks questions (team, priority, topics): give each one's gold column as "
                                "--gold-column NAME=COLUMN, e.g. --gold-column team=COLUMN"),
    ([], "e.g. --gold-column team=COLUMN"),
    (["--gold-column", "colour=g_team"], "gold column 'g_team' is for question 'colour', which the task does not ask; "
                                         "its questions are team, priority, topics"),
    (["--gold-column", "team=g_nothing"], "no column 'g_nothing' for question 'team''s gold labels; columns are: "
                                          "text, g_team, g_priority, g_topics"),
    (["--gold-column", "team=g_team", "--gold-column", "gold"], "give one COLUMN (a task of labels) or NAME=COLUMN"),
    (["--gold-column", "team="], "--gold-column 'team=': give a question's NAME=COLUMN"),
    (["--gold-column", "team=g_team", "--gold-column", "team=g_priority"], "names question 'team' twice"),
    (["--gold-column", "team=g_priority"], "row 1 has gold label"),
    (["--gold-column", "team=g_team", "--compare-modes"], "--compare-modes measures a task of one question"),
    (["--gold-column", "team=g_team", "--fit-temperature"], "--fit-temperature measures a task of one question"),
    (["--gold-column", "team=g_team", "--write-task"], "--write-task measures a task of one question"),
    (["--gold-column", "team=g_team", "--plots", "plots"], "--plots measures a task of one question"),
    (["--gold-column", "team=g_team", "--fewshot-cost", "2"], "--fewshot-cost measures a task of one question"),
    (["--gold-column", "team=g_team", "--target-precision", "0.8", "--n", "3"], None),
])
def test_what_a_task_with_questions_cannot_take_is_refused_in_one_line(tmp_path, llama_dir, run_main,
                                                                      one_torch_thread, flags, message):
    write_items(tmp_path)
    code, out, err = run_main("evaluate", tmp_path / "items.csv", "--model", llama_dir, "--task",
                              tmp_path / "triage.toml", *flags)
    if message is None:  # --target-precision is a multi-label question's: taken
        assert code == 0, err
        return
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_name_column_pairs_are_refused_for_a_task_of_labels(tmp_path, llama_dir, run_main):
    write_items(tmp_path)
    (tmp_path / "labels.toml").write_text('labels = ["billing", "technical", "account"]\n')
    code, _, err = run_main("evaluate", tmp_path / "items.csv", "--model", llama_dir, "--task",
                            tmp_path / "labels.toml", "--gold-column", "team=g_team")
    assert code == 2 and err.count("\n") == 1
    assert ("--gold-column team=g_team: NAME=COLUMN is for a task with questions, and this task has none; give its "
            "gold column alone, --gold-column COLUMN") in err
    code, _, err = run_main("evaluate", tmp_path / "items.csv", "--model", llama_dir, "--task",
                            tmp_path / "labels.toml", "--gold-column", "g_team", "--gold-column", "g_priority")
    assert code == 2 and "--gold-column names one column for a task of labels" in err


def test_classify_points_a_gold_column_of_a_task_with_questions_to_evaluate(tmp_path, llama_dir, run_main):
    write_items(tmp_path)
    code, _, err = run_main("classify", tmp_path / "items.csv", "-o", tmp_path / "out.csv", "--model", llama_dir,
                            "--task", tmp_path / "triage.toml", "--gold-column", "g_team")
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "out.csv").exists()
    assert ("--gold-column counts one label per row, and this task asks questions: measure each question with "
            "`slmclassify evaluate FILE --task TASK --gold-column NAME=COLUMN`") in err
