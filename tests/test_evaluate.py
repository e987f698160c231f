"""Calibration, temperature scaling and the evaluate command's metrics on hand-computed fixtures."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from slmclassify import Classifier, Task
from slmclassify.core.calibration import adjust, fit_temperature, prior_from_scores
from slmclassify.cli.main import cli
from slmclassify.core.metrics import Evaluation
from slmclassify.io.labelled import Labelled, read_labelled
from slmclassify.io.plots import write_plots
from slmclassify.jobs.sources import read_task
from slmclassify.jobs.evaluate import EvaluateRequest, evaluate_file, task_for_file
from slmclassify.errors import TaskError
from slmclassify.core.labels import describe_labels

LABELS = ("a", "b", "c")


def small_eval(**kw) -> Evaluation:
    # gold:      a a a b b c
    # predicted: a a b b c c
    return Evaluation(LABELS, gold=np.array([0, 0, 0, 1, 1, 2]), predicted=np.array([0, 0, 1, 1, 2, 2]),
                      confidence=np.array([0.9, 0.8, 0.6, 0.7, 0.5, 0.95]), **kw)


def test_metrics_match_hand_computed_confusion():
    ev = small_eval()
    assert ev.confusion.tolist() == [[2, 1, 0], [0, 1, 1], [0, 0, 1]]
    assert ev.accuracy == pytest.approx(4 / 6)
    per = ev.per_label()
    assert per["a"] == pytest.approx({"precision": 1.0, "recall": 2 / 3, "f1": 0.8, "support": 3})
    assert per["b"] == pytest.approx({"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2})
    assert per["c"] == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1})
    assert ev.macro_f1 == pytest.approx((0.8 + 0.5 + 2 / 3) / 3)


def test_ece_and_coverage_curve():
    ev = small_eval(target_accuracy=1.0)
    # bins of width 1/15: each confidence sits in its own bin; |acc - conf| per item, averaged
    correct = np.array([1, 1, 0, 1, 0, 1])
    assert ev.ece == pytest.approx(np.abs(correct - ev.confidence).mean())
    curve = ev.coverage_curve()
    assert [round(c[1], 3) for c in curve] == [round(k / 6, 3) for k in range(1, 7)]
    assert curve[0] == (0.95, 1 / 6, 1.0) and curve[2] == (0.8, 0.5, 1.0)
    assert ev.threshold_for(1.0) == (0.7, 4 / 6)  # 0.95, 0.9, 0.8, 0.7 are all right
    assert ev.threshold_for(0.5) == (0.5, 1.0)
    summary = ev.summary()
    assert summary["threshold"] == 0.7 and summary["coverage"] == pytest.approx(4 / 6)
    assert set(summary) >= {"accuracy", "macro_f1", "ece", "per_label", "threshold", "coverage", "confusion"}


def test_plots_are_written(tmp_path):
    paths = write_plots(small_eval(name="test", target_accuracy=0.9), str(tmp_path))
    assert [p.name for p in paths] == ["confusion.png", "reliability.png", "coverage.png"]
    assert all(p.stat().st_size > 5000 for p in paths)


def test_temperature_recovers_known_value():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4000, 4)) * 3
    true_t = 2.5
    probs = np.exp(logits / true_t)
    probs /= probs.sum(1, keepdims=True)
    gold = np.array([rng.choice(4, p=p) for p in probs])
    assert fit_temperature(logits, gold) == pytest.approx(true_t, rel=0.1)


def test_calibration_removes_the_prior():
    cf = np.log(np.array([[0.7, 0.2, 0.1], [0.5, 0.3, 0.2]]))
    bias = prior_from_scores(cf)
    np.testing.assert_allclose(np.exp(bias), [0.6, 0.25, 0.15])
    flat = adjust(np.log(np.array([[0.6, 0.25, 0.15]])), bias, 1.0)
    np.testing.assert_allclose(flat - flat.max(), 0, atol=1e-12)  # the prior itself becomes uniform


def test_calibration_is_deterministic_and_reuses_the_prefix(tiny_loaded):
    task = Task(labels=("billing", "technical", "account"), calibrate=True)
    first = Classifier(task, model=tiny_loaded)
    second = Classifier(task, model=tiny_loaded)
    np.testing.assert_array_equal(first.bias, second.bias)
    assert first.bias.shape == (3,) and np.isfinite(first.bias).all()
    off = Classifier(task.with_overrides(calibrate=False), model=tiny_loaded)
    assert off.bias is None
    texts = ["card charged twice", "app crashes"]
    raw = first.score(first.encode(texts)).scores
    on = first.classify(texts)
    expected = np.exp(raw - first.bias)
    expected /= expected.sum(1, keepdims=True)
    assert [r.probabilities["billing"] for r in on] == pytest.approx(expected[:, 0].tolist())
    assert [r.scores["billing"] for r in on] == pytest.approx(raw[:, 0].tolist())  # raw scores kept


def test_describe_labels_warns(tiny_tokenizer):
    labels = ("account", "accounting", "billing")
    seqs = [tuple(tiny_tokenizer.encode(x)) for x in labels]
    lines = describe_labels(tiny_tokenizer, labels, seqs)
    assert lines[0].startswith("  'account' -> ") and "(3 tokens)" in lines[0]
    assert any("share their first token" in line and "accounting" in line for line in lines)
    assert any("starts with the fragment" in line for line in lines)


@pytest.fixture
def bigbench(tmp_path):
    examples = [
        {"input": "Utterance: my card was charged twice", "target_scores": {"billing": 1, "technical": 0}},
        {"input": "Utterance: the app crashes", "target_scores": {"billing": 0, "technical": 1}},
        {"input": "Utterance: refund please", "target_scores": {"billing": 1, "technical": 0}},
        {"input": "Utterance: login error", "target_scores": {"billing": 0, "technical": 1}},
    ]
    path = tmp_path / "task.json"
    path.write_text(json.dumps({"name": "x", "examples": examples}))
    return path


def test_read_bigbench(bigbench):
    data = read_labelled(str(bigbench), "text", "label")
    assert data == Labelled(
        texts=["Utterance: my card was charged twice", "Utterance: the app crashes", "Utterance: refund please",
               "Utterance: login error"],
        gold=[("billing",), ("technical",), ("billing",), ("technical",)],
        labels=("billing", "technical"), instruction=None)


def test_evaluate_cli(bigbench, llama_dir, llama_loaded, tmp_path):
    task = tmp_path / "task.toml"
    task.write_text('labels = ["billing", "technical"]\n')
    out = tmp_path / "eval.json"
    plots = tmp_path / "plots"
    result = CliRunner().invoke(cli, [
        "evaluate", str(bigbench), "--model", str(llama_dir), "--task", str(task), "--compare-modes",
        "--fit-temperature", "--target-accuracy", "0.5", "--write-task", "--plots", str(plots),
        "--json", str(out), "--fewshot-cost", "1"], catch_exceptions=False)
    summary = json.loads(out.read_text())
    # The expected figures, from the library on the same items (temperature does not move the argmax).
    texts = read_labelled(str(bigbench), "text", "label").texts
    gold = ["billing", "technical", "billing", "technical"]
    clf = Classifier(Task(labels=("billing", "technical")), model=llama_loaded)
    predicted = [r.label for r in clf.classify(texts)]
    index = {"billing": 0, "technical": 1}
    confusion = np.zeros((2, 2), dtype=int)
    for g, p in zip(gold, predicted):
        confusion[index[g], index[p]] += 1
    assert summary["items"] == 4
    assert summary["accuracy"] == sum(g == p for g, p in zip(gold, predicted)) / 4
    assert summary["confusion"] == confusion.tolist()
    raw = clf.score(clf.encode(texts)).scores
    assert summary["temperature"] == pytest.approx(fit_temperature(adjust(raw, clf.bias, 1.0), np.array([0, 1, 0, 1])))
    assert {(r["mode"], r["calibrated"]) for r in summary["modes"]} == {
        (m, c) for m in ("first", "full", "full-mean") for c in (False, True)}
    assert summary["fewshot_cost"]["1_per_label"]["prefix_tokens"] > summary["fewshot_cost"]["zero_shot"]["prefix_tokens"]
    assert sorted(p.name for p in plots.iterdir()) == ["confusion.png", "coverage.png", "reliability.png"]
    written = read_task(task)
    assert written.temperature == pytest.approx(round(summary["temperature"], 4))
    assert written.min_confidence == pytest.approx(round(summary["threshold"], 4))
    assert "label tokens" in result.stdout and "accuracy" in result.stdout
    # calibrated and uncalibrated side by side, from the same scores
    uncal = Classifier(Task(labels=("billing", "technical"), calibrate=False), model=llama_loaded)
    uncal_predicted = [r.label for r in uncal.classify(texts)]
    assert summary["uncalibrated"]["accuracy"] == sum(g == p for g, p in zip(gold, uncal_predicted)) / 4
    assert (f"without calibration (same scores): accuracy {summary['uncalibrated']['accuracy']:.3f}, "
            f"macro-F1 {summary['uncalibrated']['macro_f1']:.3f}") in result.stdout


def _bigbench_file(path, examples, **extra):
    path.write_text(json.dumps({"name": "x", **extra, "examples": examples}))
    return str(path)


def test_evaluate_keeps_labels_with_commas(tmp_path, llama_loaded):
    """Regression: the labels of a BIG-bench file were joined with commas and split again, so
    'yes, definitely' became two labels and every gold row failed."""
    path = _bigbench_file(tmp_path / "t.json", [
        {"input": "card charged twice", "target_scores": {"yes, definitely": 1, "no": 0}},
        {"input": "app crashes", "target_scores": {"yes, definitely": 0, "no": 1}}])
    task = task_for_file(path)
    assert task.labels == ("yes, definitely", "no")
    summary = evaluate_file(EvaluateRequest(path), task, model=llama_loaded).figures
    assert summary["labels"] == ["yes, definitely", "no"] and summary["items"] == 2


def test_evaluate_label_with_outer_spaces_is_named(tmp_path):
    path = _bigbench_file(tmp_path / "t.json", [{"input": "x", "target_scores": {" yes": 1, "no": 0}}])
    with pytest.raises(TaskError, match=r"^label ' yes' has leading or trailing whitespace$"):
        task_for_file(path)


def test_evaluate_uses_the_task_prefix_as_instruction(tmp_path, llama_dir):
    """Regression: a BIG-bench task's own question (task_prefix) was dropped for the default instruction."""
    path = _bigbench_file(tmp_path / "t.json", [
        {"input": "you are an idiot", "target_scores": {"yes": 1, "no": 0}},
        {"input": "have a nice day", "target_scores": {"yes": 0, "no": 1}}],
        task_prefix="Is the sentence toxic?\n\n")
    task = task_for_file(path)
    assert task.instruction == "Is the sentence toxic?"
    assert task.system_turn() == "Is the sentence toxic?\nAnswer with exactly one of: yes, no."
    assert task_for_file(path, instruction="Mine.").instruction == "Mine."
    task_file = tmp_path / "task.toml"
    task_file.write_text('instruction = "From the file."\nlabels = ["yes", "no"]\n')
    assert task_for_file(path, task_file=task_file).instruction == "From the file."
    task_file.write_text('labels = ["yes", "no"]\n')
    assert task_for_file(path, task_file=task_file).instruction == "Is the sentence toxic?"
    result = CliRunner().invoke(cli, ["evaluate", path, "--model", str(llama_dir)], catch_exceptions=False)
    assert "instruction: 'Is the sentence toxic?'\n" in result.stdout


def test_tied_gold_labels_all_count_as_correct():
    # item 0: gold a or b, predicted b -> right; item 1: gold c, predicted a -> wrong;
    # item 2: gold a or c, predicted b -> wrong (its gold stays the first tied label, a)
    accepted = np.array([[True, True, False], [False, False, True], [True, False, True]])
    ev = Evaluation(LABELS, gold=np.array([0, 2, 0]), predicted=np.array([1, 0, 1]),
                    confidence=np.array([0.9, 0.6, 0.5]), accepted=accepted, target_accuracy=1.0)
    assert ev.accuracy == pytest.approx(1 / 3)
    assert ev.confusion.tolist() == [[0, 1, 0], [0, 1, 0], [1, 0, 0]]
    assert ev.per_label()["b"] == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1})
    assert ev.coverage_curve() == [(0.9, 1 / 3, 1.0), (0.6, 2 / 3, 0.5), (0.5, 1.0, pytest.approx(1 / 3))]
    assert ev.threshold_for(1.0) == (0.9, 1 / 3)


def test_evaluate_counts_any_tied_label(tmp_path, llama_loaded):
    """Regression: an item whose gold scores tie counted only the first tied label as correct.
    The same text twice, its tie listed in both orders: exactly one of the two rows was right before."""
    ties = [{"billing": 1, "technical": 1, "account": 0}, {"technical": 1, "billing": 1, "account": 0}]
    path = _bigbench_file(tmp_path / "t.json", [
        {"input": "my card was charged twice and the app crashes", "target_scores": scores} for scores in ties])
    task = Task(labels=("billing", "technical", "account"), calibrate=False)
    predicted = Classifier(task, model=llama_loaded).classify(["my card was charged twice and the app crashes"])[0]
    summary = evaluate_file(EvaluateRequest(path), task, model=llama_loaded).figures
    expected = 1.0 if predicted.label in ("billing", "technical") else 0.0
    assert summary["accuracy"] == expected


def test_evaluate_rejects_unknown_gold_label(tmp_path, llama_dir):
    path = tmp_path / "gold.csv"
    path.write_text("text,label\nhello,billing\nbye,shipping\n")
    from slmclassify.errors import InputError

    with pytest.raises(InputError, match="row 2 has gold label 'shipping'"):
        CliRunner().invoke(cli, ["evaluate", str(path), "--labels", "billing,technical", "--model", str(llama_dir)],
                           catch_exceptions=False)
