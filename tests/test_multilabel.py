"""Multi-label tasks: every label a yes/no question answered in the item's one pass (`core/multilabel.py`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from slmclassify import Classifier, EngineSettings, Task, TaskError
from slmclassify.core import multilabel
from slmclassify.jobs.sources import read_task

from helpers import assert_matches_reference, interrupt_after, random_texts, wait_for

LABELS = ("billing", "technical", "account", "shipping", "feedback")


def test_one_pass_equals_the_per_label_reference(tiny_loaded):
    """Both branches of every label, from the one pass, equal the reference's full prompts."""
    task = Task(labels=LABELS, multi_label=True, user_template="Ticket: {text}")
    clf = Classifier(task, model=tiny_loaded, settings=EngineSettings(token_budget=200, max_rows=4))
    assert clf.trie.labels == multilabel.branches(LABELS) and clf.mode == "full"
    scored = assert_matches_reference(clf, random_texts(11, seed=5))
    assert scored.scores.shape == (11, 2 * len(LABELS))
    # the name and colon are fed once per label and shared by its two answers: the trie has a node
    # per label name token, not per branch
    assert clf.trie.n_nodes < sum(len(s) - 1 for s in clf.trie.sequences)


def test_results_are_per_label_probabilities_thresholds_and_review(tiny_loaded):
    task = Task(labels=LABELS, multi_label=True, thresholds=(0.5, 0.01, 0.99, 0.5, 0.5), min_confidence=0.6)
    clf = Classifier(task, model=tiny_loaded)
    texts = random_texts(6, seed=2) + [""]
    out = clf.classify(texts)
    assert out[-1].status == "empty" and out[-1].label is None and out[-1].needs_review
    encoded = clf.encode(texts)
    p = multilabel.probabilities(clf.calibration.calibrated(clf.score(encoded).scores))
    for r, row in zip(out[:-1], p[:-1]):
        assert list(r.probabilities) == list(LABELS)
        assert np.allclose([r.probabilities[name] for name in LABELS], row)
        chosen = tuple(name for name, q, t in zip(LABELS, row, task.thresholds) if q >= t)
        assert r.labels == chosen and r.label == ";".join(chosen)
        assert r.confidence == pytest.approx(float(np.maximum(row, 1 - row).min()))
        assert r.needs_review == (r.confidence < 0.6 or not chosen)
        assert set(r.scores) == set(multilabel.branches(LABELS))


def test_calibration_removes_each_labels_content_free_prior(tiny_loaded):
    """With calibration the content-free inputs' mean P(yes) is 0.5 for every label, by construction
    of the prior (log-odds of the mean), up to the mean of a sigmoid vs the sigmoid of a mean."""
    task = Task(labels=LABELS, multi_label=True)
    clf = Classifier(task, model=tiny_loaded)
    raw = Classifier(Task(labels=LABELS, multi_label=True, calibrate=False), model=tiny_loaded)
    assert clf.bias.shape == (len(LABELS),) and raw.bias is None
    from slmclassify.core.calibration import CONTENT_FREE

    encoded = clf.scorer.encode(list(CONTENT_FREE), score_empty=True)
    scores = clf.score(encoded).scores
    p = multilabel.probabilities(clf.calibration.calibrated(scores)).mean(axis=0)
    p_raw = multilabel.probabilities(raw.calibration.calibrated(scores)).mean(axis=0)
    assert np.allclose(multilabel.prior_log_odds(scores), clf.bias)
    assert np.abs(p - 0.5).max() < np.abs(p_raw - 0.5).max() or np.allclose(p_raw, 0.5, atol=1e-3)


def test_the_prompt_asks_for_every_label_and_says_how_to_answer():
    task = Task(labels=("billing", "technical"), descriptions=("charges", ""), multi_label=True)
    system = task.system_turn()
    assert task.instruction.startswith("You tag short texts with every label")
    assert "- billing: charges\n- technical" in system and '"billing: yes"' in system
    assert Task(labels=("a", "b"), instruction="Mine.", multi_label=True).instruction == "Mine."


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "first"}, "mode"), ({"mode": "full-mean"}, "mode"),
    ({"thresholds": (0.5,)}, "1 thresholds for 2 labels"), ({"thresholds": (0.5, 1.0)}, "between 0 and 1"),
    ({"label_separator": " "}, "label_separator"), ({"label_separator": "b"}, "label_separator"),
])
def test_bad_multi_label_settings_are_refused(kwargs, message):
    with pytest.raises(TaskError, match=message):
        Task(labels=("a", "b"), multi_label=True, **kwargs)


def test_thresholds_need_a_multi_label_task():
    with pytest.raises(TaskError, match="multi_label"):
        Task(labels=("a", "b"), thresholds=(0.5, 0.5))


def test_task_file_reads_multi_label_keys(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text('labels = ["a", "b"]\nmulti_label = true\nthresholds = [0.3, 0.7]\nlabel_separator = "|"\n')
    task = read_task(path)
    assert task.multi_label and task.thresholds == (0.3, 0.7) and task.label_separator == "|"
    path.write_text('labels = ["a", "b"]\nmulti_label = true\nthresholds = ["x", 0.7]\n')
    with pytest.raises(TaskError, match="list of numbers"):
        read_task(path)


def write_tickets(path, rows):
    import csv

    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "text", "gold"])
        writer.writerows(rows)


def test_classify_writes_a_labels_column_and_probes_every_branch(tmp_path, llama_dir, run_main, one_torch_thread):
    """`classify --multi-label`: one row per input row, in order, `labels` (chosen ones joined by ;),
    a p_ column per label, the probes comparing every branch with the reference; the gold column is
    compared as a set (`b;a` equals `a;b`)."""
    import pandas as pd

    texts = random_texts(9, seed=4) + [""]
    gold = ["billing;technical", "account", "technical;billing", "", "shipping", "feedback", "billing", "account",
            "technical", "billing"]
    write_tickets(tmp_path / "in.csv", [(i, t, g) for i, (t, g) in enumerate(zip(texts, gold))])
    code, out, err = run_main("classify", tmp_path / "in.csv", "-o", tmp_path / "out.csv", "--model", llama_dir,
                              "--labels", ",".join(LABELS), "--multi-label", "--gold-column", "gold",
                              "--probes", "4")
    assert code == 0, err
    frame = pd.read_csv(tmp_path / "out.csv", keep_default_na=False)
    assert frame["id"].tolist() == list(range(10))
    assert list(frame.columns) == ["id", "text", "gold", "labels", "confidence", "needs_review",
                                   *(f"p_{name}" for name in LABELS), "status"]
    assert frame["status"].tolist()[-1] == "empty"
    for _, row in frame.iloc[:-1].iterrows():
        chosen = [name for name in LABELS if float(row[f"p_{name}"]) >= 0.5]
        assert row["labels"] == ";".join(chosen)
    assert "verify: 4/4 probes agree with the per-item path" in err
    assert "exact label sets (subset accuracy) vs gold" in err and "not a label of the task" not in err
    assert "warning" not in err.split("labels:")[1].split("\n")[0]  # the single-label token warnings do not apply


def _multilabel_rows(n, seed=0):
    """Tickets whose words decide their labels (1-2 of billing / technical / account each)."""
    rng = np.random.default_rng(seed)
    words = {"billing": "card charged twice refund", "technical": "app crashes error screen",
             "account": "password login locked"}
    rows = []
    for i in range(n):
        chosen = [lab for lab in words if rng.random() < 0.45] or [list(words)[i % 3]]
        rows.append((i, " and ".join(words[lab] for lab in chosen) + f" {i}", ";".join(chosen)))
    return rows


def test_one_vs_rest_head_fits_classifies_and_evaluates(tmp_path, llama_dir, run_main):
    """`fit` on a multi-label task trains one head per label; `classify --head` chooses the labels
    at the head's own thresholds; `evaluate --head` reports the head with zero-shot alongside and
    warns on the items that fitted it."""
    import json

    import pandas as pd

    from slmclassify.head.model import Head

    rows = _multilabel_rows(48)
    write_tickets(tmp_path / "fit.csv", rows[:30])
    write_tickets(tmp_path / "held.csv", rows[30:])
    task = tmp_path / "t.toml"
    task.write_text('labels = ["billing", "technical", "account"]\nmulti_label = true\n')
    code, out, err = run_main("fit", tmp_path / "fit.csv", "-o", tmp_path / "h.npz", "--model", llama_dir,
                              "--task", task, "--gold-column", "gold", "--folds", "3", "--json", tmp_path / "f.json")
    assert code == 0, err
    assert "one-vs-rest heads" in out and "zero-shot" in out and "head (3-fold CV)" in out, out
    head = Head.load(tmp_path / "h.npz")
    assert head.multi_label and head.labels == ("billing", "technical", "account") and len(head.thresholds) == 3
    assert head.coef.shape[0] == 3 and json.loads((tmp_path / "f.json").read_text())["per_label"]["billing"] > 0

    code, out, err = run_main("classify", tmp_path / "held.csv", "-o", tmp_path / "out.csv", "--model", llama_dir,
                              "--head", tmp_path / "h.npz", "--probes", "2")
    assert code == 0, err
    frame = pd.read_csv(tmp_path / "out.csv", keep_default_na=False)
    assert frame["id"].tolist() == list(range(30, 48))
    for _, row in frame.iterrows():  # the head's thresholds, not 0.5
        chosen = [lab for lab, t in zip(head.labels, head.thresholds) if float(row[f"p_{lab}"]) >= t]
        assert row["labels"] == ";".join(chosen)
    # the probabilities are the head's: sigmoid of its log-odds on the fast path's states
    from slmclassify import Classifier, load_model

    clf = Classifier(read_task(task), model=load_model(str(llama_dir)))
    scored = clf.score(clf.encode([r[1] for r in rows[30:]]), taps=head.taps)
    z = head.log_odds(head.features(scored.states, clf.calibration.calibrated(scored.scores)))
    np.testing.assert_allclose(frame[[f"p_{lab}" for lab in head.labels]].to_numpy(float), 1 / (1 + np.exp(-z)),
                               atol=1e-5)

    code, out, err = run_main("evaluate", tmp_path / "held.csv", "--gold-column", "gold", "--model", llama_dir,
                              "--head", tmp_path / "h.npz")
    assert code == 0, err
    assert "scorer: head" in out and "at the head's thresholds" in out and "zero-shot, at thresholds" in out, out
    assert "fitted the head" not in out
    code, out, err = run_main("evaluate", tmp_path / "fit.csv", "--gold-column", "gold", "--model", llama_dir,
                              "--head", tmp_path / "h.npz")
    assert code == 0 and "warning: 30 of these 30 items fitted the head" in out, out
    code, _, err = run_main("evaluate", tmp_path / "held.csv", "--gold-column", "gold", "--model", llama_dir,
                            "--head", tmp_path / "h.npz", "--task", task, "--write-task")
    assert code == 2 and "keeps its own thresholds" in err, err


def test_heads_and_tasks_of_the_other_kind_are_refused(tmp_path, llama_dir, run_main):
    rows = [(i, f"{'card charged twice' if i % 2 else 'app crashes'} {i}", "a" if i % 2 else "b") for i in range(12)]
    write_tickets(tmp_path / "in.csv", rows)
    code, _, err = run_main("fit", tmp_path / "in.csv", "-o", tmp_path / "h.npz", "--model", llama_dir,
                            "--labels", "a,b", "--gold-column", "gold", "--folds", "3", "--curve", "2")
    assert code == 0, err
    code, out, err = run_main("classify", tmp_path / "in.csv", "-o", tmp_path / "out.csv", "--model", llama_dir,
                              "--labels", "a,b", "--multi-label", "--head", tmp_path / "h.npz")
    assert code == 2 and "fitted for another task" in err and "multi_label" in err, err
    # a label on fewer items than the folds: named, before the model loads
    code, _, err = run_main("fit", tmp_path / "in.csv", "-o", tmp_path / "h2.npz", "--model", llama_dir,
                            "--labels", "a,b,c", "--multi-label", "--gold-column", "gold", "--folds", "3")
    assert code == 2 and "label 'c' is on 0 of 12 items" in err and "--folds" in err, err


def test_one_vs_rest_equals_a_binary_logistic_regression_per_label():
    from sklearn.linear_model import LogisticRegression

    from slmclassify.head.one_vs_rest import fit_one_vs_rest

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 5))
    gold = np.stack([X[:, 0] + 0.3 * rng.normal(size=60) > 0, X[:, 1] - X[:, 2] > 0.5], axis=1)
    fitted = fit_one_vs_rest(X, gold, ("p", "q"), folds=3)
    Z = (X - X.mean(0)) / X.std(0)
    for j in range(2):
        ref = LogisticRegression(C=fitted.C[j], max_iter=1000).fit(Z, gold[:, j])
        np.testing.assert_allclose(((X - fitted.mean) / fitted.scale) @ fitted.coef[j] + fitted.intercept[j],
                                   ref.decision_function(Z), atol=2e-2)  # LogisticRegressionCV's refit: its own tolerance


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 truncated"])
def test_an_empty_or_broken_head_file_is_a_clear_error(tmp_path, llama_dir, run_main, content):
    """Before: an empty head file's EOFError reached click, which says "interrupted" (exit 130)."""
    write_tickets(tmp_path / "in.csv", [(0, "hello", "a")])
    (tmp_path / "h.npz").write_bytes(content)
    code, out, err = run_main("classify", tmp_path / "in.csv", "-o", tmp_path / "out.csv", "--model", llama_dir,
                              "--labels", "a,b", "--head", tmp_path / "h.npz")
    assert code == 2 and "is not a head file written by `slmclassify fit`" in err, err


def test_metrics_by_hand():
    probs = np.array([[0.9, 0.2], [0.6, 0.7], [0.1, 0.8], [0.4, 0.1]])
    gold = np.array([[1, 0], [0, 1], [0, 1], [1, 0]], dtype=bool)
    m = multilabel.metrics(probs, gold, [0.5, 0.5], ("a", "b"))
    # a: predicted rows 0, 1; gold rows 0, 3 -> tp 1 fp 1 fn 1; b: predicted 1, 2 = gold: tp 2
    assert m["per_label"]["a"] == {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2, "threshold": 0.5}
    assert m["per_label"]["b"]["f1"] == 1.0
    assert m["macro_f1"] == pytest.approx(0.75) and m["micro_f1"] == pytest.approx(2 * 3 / (2 * 3 + 1 + 1))
    assert m["subset_accuracy"] == 0.5 and m["hamming_loss"] == pytest.approx(2 / 8)


def test_thresholds_f1_optimal_and_for_a_target_precision():
    p = np.array([[0.95], [0.9], [0.8], [0.7], [0.3], [0.2]])
    g = np.array([[1], [1], [0], [1], [0], [0]], dtype=bool)
    (t,) = multilabel.pick_thresholds(p, g)
    assert 0.3 < t <= 0.7  # all three positives, one false positive: F1 6/7, the best
    (t,) = multilabel.pick_thresholds(p, g, target_precision=1.0)
    assert 0.8 < t <= 0.9  # only the two top items keep precision 1
    assert multilabel.pick_thresholds(p, np.zeros_like(g)) == [None]
    assert multilabel.pick_thresholds(np.array([[0.1], [0.9]]), np.array([[1], [0]], bool), 0.99) == [None]


def test_gold_cells_name_their_row():
    from slmclassify.errors import InputError

    assert multilabel.gold_matrix(["a; b", "", "b"], ("a", "b")).tolist() == [[True, True], [False, False],
                                                                               [False, True]]
    with pytest.raises(InputError, match="row 2 has gold label 'c'"):
        multilabel.gold_matrix(["a", "a;c"], ("a", "b"))


def test_evaluate_reports_f1_subset_accuracy_and_writes_thresholds(tmp_path, llama_dir, run_main):
    import json

    texts = random_texts(24, seed=9)
    cells = ["billing;technical" if i % 3 == 0 else ("account" if i % 3 == 1 else "") for i in range(24)]
    write_tickets(tmp_path / "gold.csv", [(i, t, g) for i, (t, g) in enumerate(zip(texts, cells))])
    task = tmp_path / "t.toml"
    task.write_text('# my task\nlabels = ["billing", "technical", "account"]\nmulti_label = true\n')
    code, out, err = run_main("evaluate", tmp_path / "gold.csv", "--gold-column", "gold", "--task", task,
                              "--model", llama_dir, "--write-task", "--json", tmp_path / "e.json")
    assert code == 0, err
    assert "at the task's thresholds: micro-F1 " in out and "subset accuracy" in out and "Hamming loss" in out
    assert "at thresholds picked on the other half (cross-fitted)" in out
    figures = json.loads((tmp_path / "e.json").read_text())
    assert figures["items"] == 24 and set(figures["at_task_thresholds"]["per_label"]) == {"billing", "technical",
                                                                                          "account"}
    assert figures["at_task_thresholds"]["per_label"]["account"]["support"] == 8
    written = read_task(task)
    assert written.multi_label and len(written.thresholds) == 3 and task.read_text().startswith("# my task")
    # the picked thresholds are the F1-optimal ones on these items: at them F1 is no lower than at 0.5
    code, out2, err = run_main("evaluate", tmp_path / "gold.csv", "--gold-column", "gold", "--task", task,
                               "--model", llama_dir)
    first = lambda text: float(text.split("at the task's thresholds: micro-F1 ")[1].split()[2])  # macro-F1
    assert first(out2) >= first(out) - 1e-9


def test_evaluate_multi_label_refusals(tmp_path, llama_dir, run_main):
    write_tickets(tmp_path / "gold.csv", [(0, "a text", "billing;nope")])
    code, _, err = run_main("evaluate", tmp_path / "gold.csv", "--gold-column", "gold", "--labels",
                            "billing,technical", "--multi-label", "--model", llama_dir)
    assert code == 2 and "row 1 has gold label 'nope'" in err, err
    code, _, err = run_main("evaluate", tmp_path / "gold.csv", "--gold-column", "gold", "--labels",
                            "billing,technical", "--target-precision", "0.9", "--model", llama_dir)
    assert code == 2 and "--target-precision picks a multi-label task's thresholds" in err
    code, _, err = run_main("evaluate", tmp_path / "gold.csv", "--gold-column", "gold", "--labels",
                            "billing,technical", "--multi-label", "--compare-modes", "--model", llama_dir)
    assert code == 2 and "--compare-modes is for single-label tasks" in err


def test_items_of_several_fields(tmp_path, llama_dir, run_main, tiny_loaded):
    """`user_template = "Subject: {subject}\\n\\n{body}"`: both columns read, one composed item per row;
    an item whose fields are all empty is empty; a missing column is named before any work."""
    import pandas as pd

    task = Task(labels=("billing", "technical"), user_template="Subject: {subject}\n\n{body}")
    assert task.fields == ("subject", "body") and task.multi_field
    clf = Classifier(task, model=tiny_loaded)
    plain = Classifier(Task(labels=("billing", "technical")), model=tiny_loaded)
    out = clf.classify([{"subject": "Refund", "body": "charged twice"}, {"subject": "", "body": None},
                        {"subject": "Crash", "body": ""}])
    assert [r.status for r in out] == ["ok", "empty", "ok"]
    same = plain.classify(["Subject: Refund\n\ncharged twice"])[0]
    assert out[0].scores == pytest.approx(same.scores, abs=1e-4)
    with pytest.raises(Exception, match="has no field 'body'"):
        clf.classify([{"subject": "x"}])
    with pytest.raises(Exception, match="pass a dict"):
        clf.classify(["just a text"])

    pd.DataFrame({"id": [1, 2, 3], "subject": ["Refund", "", "Crash"], "body": ["charged twice", "", "on start"]}
                 ).to_csv(tmp_path / "in.csv", index=False)
    args = ("classify", tmp_path / "in.csv", "-o", tmp_path / "out.csv", "--model", llama_dir,
            "--labels", "billing,technical")
    code, _, err = run_main(*args, "--user-template", "Subject: {subject}\\n\\n{body}")
    assert code == 0, err
    frame = pd.read_csv(tmp_path / "out.csv", keep_default_na=False)
    assert frame["status"].tolist() == ["ok", "empty", "ok"] and frame["id"].tolist() == [1, 2, 3]
    code, _, err = run_main(*args, "--user-template", "Subject: {subject}\\n\\n{message}")
    assert code == 2 and "no column 'message', which the user template names as {message}" in err, err
    assert "model:" not in err  # refused before the model loads
    # verify reads the same items (before: "no column 'text'" where classify worked)
    code, _, err = run_main("verify", tmp_path / "in.csv", "--model", llama_dir, "--labels", "billing,technical",
                            "--user-template", "Subject: {subject}\\n\\n{body}", "--n", "2")
    assert code == 0 and "2/2 probes agree with the per-item path" in err, err


def test_serve_answers_multi_label_and_multi_field_tasks(tiny_loaded):
    """`serve`: a multi-label task's results carry `labels`, equal to offline classify; a task whose
    template names fields takes `items` (and refuses `texts`)."""
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from test_serve import post, running
    from slmclassify.serve.server import build_service

    import test_serve

    multi = Task(labels=LABELS, multi_label=True)
    fields = Task(labels=("billing", "technical"), user_template="Subject: {subject}\n\n{body}")
    texts = random_texts(5, seed=8) + [""]
    want = Classifier(multi, model=tiny_loaded).classify(texts)
    want_items = Classifier(fields, model=tiny_loaded).classify([{"subject": "Refund", "body": "twice"}])
    original = test_serve.build_service
    test_serve.build_service = lambda tasks, *a, **k: build_service({"multi": multi, "fields": fields}, *a, **k)
    try:
        with running(tiny_loaded) as (url, _):
            got = post(url, {"task": "multi", "texts": texts}).json()["results"]
            for g, w in zip(got, want):
                assert g["labels"] == list(w.labels) and g["label"] == w.label and g["status"] == w.status
                if w.probabilities:
                    assert g["probabilities"] == pytest.approx(w.probabilities, abs=1e-4)
            got = post(url, {"task": "fields", "items": [{"subject": "Refund", "body": "twice"}]}).json()["results"]
            assert got[0]["label"] == want_items[0].label
            assert got[0]["probabilities"] == pytest.approx(want_items[0].probabilities, abs=1e-4)
            refused = post(url, {"task": "fields", "texts": ["a text"]})
            assert refused.status_code == 422 and "'items' with the fields subject, body" in refused.text
            refused = post(url, {"task": "fields", "items": [{"subject": "x"}]})
            assert refused.status_code == 422 and "items[0] has no field 'body'" in refused.text
            tasks = httpx.get(f"{url}/v1/tasks", timeout=30).json()
            assert "multi_label" in json_text(tasks)
    finally:
        test_serve.build_service = original


def json_text(value) -> str:
    import json

    return json.dumps(value)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_jsonl_and_parquet_get_a_list_column(tmp_path, llama_dir, run_main, suffix):
    import pandas as pd

    write_tickets(tmp_path / "in.csv", [(i, t, "") for i, t in enumerate(random_texts(4, seed=1) + [""])])
    out = tmp_path / f"out{suffix}"
    code, _, err = run_main("classify", tmp_path / "in.csv", "-o", out, "--model", llama_dir, "--labels",
                            ",".join(LABELS), "--multi-label", "--no-verify")
    assert code == 0, err
    frame = pd.read_json(out, lines=True) if suffix == ".jsonl" else pd.read_parquet(out)
    for value, p in zip(frame["labels"][:-1], frame[[f"p_{n}" for n in LABELS]].to_numpy()[:-1]):
        assert list(value) == [n for n, q in zip(LABELS, p) if q >= 0.5]
    assert frame["labels"].iloc[-1] is None and frame["status"].iloc[-1] == "empty"


def test_resume_with_a_multi_label_task_is_byte_identical(tmp_path, llama_dir, run_main, monkeypatch):
    """Interrupted in its fourth window and resumed: the output equals an uninterrupted run's."""
    write_tickets(tmp_path / "in.csv", [(i, t, "") for i, t in enumerate(random_texts(40, seed=3))])
    base = ["classify", tmp_path / "in.csv", "--model", llama_dir, "--labels", ",".join(LABELS), "--multi-label",
            "--window", "8", "--quiet"]
    code, _, err = run_main(*base, "-o", tmp_path / "whole.csv")
    assert code == 0, err
    with monkeypatch.context() as m:
        interrupt_after(m, 3)
        assert run_main(*base, "-o", tmp_path / "part.csv")[0] == 130
    code, _, err = run_main(*base, "-o", tmp_path / "part.csv", "--resume")
    assert code == 0, err
    assert (tmp_path / "part.csv").read_bytes() == (tmp_path / "whole.csv").read_bytes()


def test_fit_and_label_refuse_a_multi_label_task_and_read_items_of_several_fields(tmp_path, llama_dir, run_main):
    """Heads and the labelling page are single-label: a multi-label task is refused before any work.
    A template naming columns is read from those columns by `fit` too (before: the text column was
    read and the template ignored)."""
    import pandas as pd

    from slmclassify.label.session import LabelRequest, LabelSession

    rows = [(i, "Refund" if i % 2 else "Crash", f"{'card charged twice' if i % 2 else 'app crashes'} {i}",
             "billing" if i % 2 else "technical") for i in range(12)]
    pd.DataFrame(rows, columns=["id", "subject", "body", "gold"]).to_csv(tmp_path / "in.csv", index=False)
    fit = ["fit", tmp_path / "in.csv", "-o", tmp_path / "h.npz", "--model", llama_dir, "--labels", "billing,technical",
           "--gold-column", "gold", "--folds", "3", "--curve", "2", "--user-template", "Subject: {subject}\\n\\n{body}"]
    for multi in ((), ("--multi-label",)):
        code, _, err = run_main(*fit, *multi)
        assert code == 0, err
    session = LabelSession.start(LabelRequest(str(tmp_path / "in.csv"), tmp_path / "s.sqlite", first_slice=12),
                                 Task(labels=("billing", "technical"), multi_label=True,
                                      user_template="Subject: {subject}\n\n{body}"), model=str(llama_dir))
    try:
        assert session.wait_ready(120)
        assert session.state()["item"]["text"].startswith("Subject: ")
    finally:
        session.close()


def test_label_session_takes_label_sets(tmp_path, llama_dir, one_torch_thread):
    """A multi-label task on the labelling loop: answers are lists (maybe empty), the guess a list
    at the task's thresholds with each label's P(yes), counts per label, the loop's one-vs-rest heads
    refitted, the export's gold joined by the separator, Fit a
    one-vs-rest head; the answers survive a restart, and a single label is refused."""
    import pandas as pd

    from slmclassify.head.model import Head
    from slmclassify.label.session import LabelRequest, LabelSession

    rows = _multilabel_rows(30, seed=1)
    write_tickets(tmp_path / "in.csv", rows)
    gold = {text: cell.split(";") for _, text, cell in rows}
    task = Task(labels=("billing", "technical", "account"), multi_label=True, label_separator="|")
    request = LabelRequest(str(tmp_path / "in.csv"), tmp_path / "s.sqlite", first_slice=30, seed=3)
    session = LabelSession.start(request, task, model=str(llama_dir))
    given = {}
    try:
        assert session.wait_ready(120)
        item = session.state()["item"]
        assert session.state()["multi_label"] and isinstance(item["guess"], list)
        assert set(item["probabilities"]) == set(task.labels)
        assert item["guess"] == [lab for lab in task.labels if item["probabilities"][lab] >= 0.5]
        with pytest.raises(TaskError, match="a multi-label task's answer is a list"):
            session.answer(item["row"], "billing")
        with pytest.raises(TaskError, match="'nope' is not one of the task's labels"):
            session.answer(item["row"], ["billing", "nope"])
        session.answer(item["row"], [])  # none applies
        given[item["row"]] = []
        for _ in range(11):
            item = session.state()["item"]
            session.answer(item["row"], gold[item["text"]][::-1])  # any order: kept in the task's
            given[item["row"]] = gold[item["text"]]
        wait_for(lambda: session.head is not None and not session.state()["fitting"])
        state = session.state()
        assert state["counts"] == {lab: sum(lab in v for v in given.values()) for lab in task.labels}
        assert state["history"][-1]["label"] == "none of them"
        session.export(str(tmp_path / "out.csv"))
        out = pd.read_csv(tmp_path / "out.csv", keep_default_na=False)
        order = {lab: i for i, lab in enumerate(task.labels)}
        assert list(out["gold"]) == ["|".join(sorted(given[r], key=order.get)) for r in sorted(given)]
        head = session.fit(str(tmp_path / "h.npz"))
        assert head.multi_label and Head.load(tmp_path / "h.npz").thresholds == (0.5, 0.5, 0.5)
    finally:
        session.close()
    again = LabelSession.start(request, task, model=str(llama_dir))
    try:
        assert again.state()["labelled"] == len(given)
    finally:
        again.close()


def test_loop_heads_estimate_and_picks_for_label_sets():
    """`refit.estimate_multi` is None below the random picks it needs, then the out-of-fold share
    of exact label sets; the picker's uncertain pick is the item with a label nearest 0.5."""
    from slmclassify.label import refit
    from slmclassify.label.strategy import Picker, PoolView

    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 6))
    Y = np.stack([X[:, 0] > 0, X[:, 1] > 0.3], axis=1)
    fair = np.zeros(80, bool)
    fair[: refit.MIN_FAIR - 1] = True
    assert refit.estimate_multi(X, Y, 0, fair) is None
    fair[:60] = True
    est = refit.estimate_multi(X, Y, 0, fair)
    assert est is not None and est.n == 60 and est.mean > 0.7 and est.low <= est.mean <= est.high
    assert np.array_equal(est.correct, ((est.out_of_fold >= 0.5) == Y[est.tested]).all(1))
    head = refit.fit_multi_head(X, np.stack([Y[:, 0], np.zeros(80, bool)], axis=1))
    assert head.fitted[1] is None and np.allclose(head.probabilities(X[:3])[:, 1], 1 / 82)  # (0 + 1) / (80 + 2)

    probs = np.full((50, 2), 0.95)
    probs[17] = [0.05, 0.52]  # its second label is the least sure of the pool
    pool = PoolView(zero_shot=probs, features=rng.normal(size=(50, 4)).astype(np.float32), scored=np.ones(50, bool),
                    head=probs, labels=("a", "b"), multi_label=True)
    picker = Picker(2, seed=0, random_share=0.0, cold_per_label=0)
    pick = picker.pick(pool, {0: (0, 1), 1: (1,), 2: ()}, set())
    assert pick.row == 17 and pick.reason == "the model is unsure whether b applies (P 0.52)"


def test_gold_held_as_lists_is_read_as_label_sets(tmp_path, llama_dir, run_main, one_torch_thread):
    """Before: a gold column held as a list (JSONL) or list<string> (Parquet) — the form `classify` writes a
    multi-label result in — was one label "['billing', 'account']", refused as not in the label set.
    Read as the set it is, in `evaluate` and in `classify --gold-column`; a missing cell is no label."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from slmclassify.io.labelled import gold_text

    assert gold_text(["billing", "account"], ";") == "billing;account" and gold_text(None) == ""
    texts = random_texts(6, seed=9)
    gold = [["billing", "technical"], ["account"], [], ["technical", "billing"], None, ["billing"]]
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t, "gold": g}) + "\n" for t, g in zip(texts, gold)))
    parquet = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": texts, "gold": pa.array(gold, pa.list_(pa.string()))}), parquet)
    for src in (jsonl, parquet):
        code, out, err = run_main("evaluate", src, "--gold-column", "gold", "--model", llama_dir,
                                  "--labels", ",".join(LABELS), "--multi-label")
        assert code == 0 and "not in the label set" not in err, err
        code, _, err = run_main("classify", src, "-o", tmp_path / f"out{src.suffix}", "--model", llama_dir,
                                "--labels", ",".join(LABELS), "--multi-label", "--gold-column", "gold", "--no-verify")
        assert code == 0 and "exact label sets (subset accuracy) vs gold" in err, err
        assert "not a label of the task" not in err, err
