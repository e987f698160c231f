"""Learned heads: the fast path's hidden states equal the Hugging Face forward's, a head fits,
saves and loads exactly, predicts deterministically, refuses features from another model or task,
and `fit` then `classify --head` / `evaluate --head` work end to end (tiny random models)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from slmclassify import Classifier, EngineSettings, Task
from slmclassify.cli.main import cli, main
from slmclassify.errors import TaskError
from slmclassify.head import Head, model_fingerprint, score_with_head
from slmclassify.core.taps import Taps
from slmclassify.head.features import candidate_taps, collect, default_taps, feature_sets, loop_taps
from slmclassify.head.fitting import cross_validated, fit

from helpers import fitted_head, labelled, random_texts


@pytest.mark.isa  # the engine's states: its kernels (the head's statistics need no ISA cap)
@pytest.mark.parametrize("mode,settings", [
    ("first", EngineSettings(token_budget=None, max_rows=3)),
    ("full", EngineSettings(token_budget=120, max_rows=8)),
    ("full", EngineSettings(prefix_cache=False)),
])
def test_states_equal_reference_hidden_states(tiny_loaded, mode, settings):
    """Every layer's state at the item's last token, and its mean over the item's own tokens (the
    prompt after the head every item shares), from padded batches with the prefix cache and
    label-trie nodes, equal `hidden_states` of the unmodified HF forward on the full prompt pooled
    the same way. With the cache off, the mean starts at the same place."""
    labels = ("billing", "technical", "account") if mode == "first" else ("billing", "account", "accounting")
    task = Task(labels=labels, mode=mode, instruction="Sort the ticket.")
    clf = Classifier(task, model=tiny_loaded, settings=settings)
    n_layers = tiny_loaded.model.config.num_hidden_layers
    taps = Taps(last=tuple(range(1, n_layers + 1)), mean=tuple(range(1, n_layers)))
    texts = random_texts(9, seed=5)
    encoded = clf.encode(texts)
    scored = clf.score(encoded, taps=taps)
    scores, states = scored.scores, scored.states
    assert states.shape == (9, (2 * n_layers - 1) * tiny_loaded.model.config.hidden_size)
    np.testing.assert_array_equal(scores, clf.score(encoded).scores)  # the taps change nothing
    head_tokens = clf.scorer.pool_from
    assert head_tokens == len(Classifier(task, model=tiny_loaded).prefix_ids) > 0
    for i in range(len(texts)):
        ids = encoded.ids[i]
        with torch.inference_mode():
            out = tiny_loaded.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        start = min(head_tokens, len(ids) - 1)
        ref = torch.stack([out.hidden_states[t][0, -1] for t in taps.last]
                          + [out.hidden_states[t][0, start:].mean(0) for t in taps.mean]).numpy()
        fast = states[i].reshape(len(taps), -1)
        diff = np.abs(fast - ref).max(axis=1)
        assert diff.max() <= 1e-4, f"item {i}: max |Δ| per layer {diff}\nfast:\n{fast[:, :6]}\nreference:\n{ref[:, :6]}"


def test_default_and_candidate_taps():
    assert default_taps(30) == Taps(mean=(6, 12, 18, 24))
    assert loop_taps(30) == Taps(mean=(24,)) and loop_taps(2) == Taps(mean=(1,))
    assert candidate_taps(30) == Taps(last=(15, 22, 30), mean=(6, 12, 18, 24))
    assert candidate_taps(2) == Taps(last=(1, 2), mean=(1,))  # a mean stops below the last layer
    assert Taps.parse(["15", "mean6", " MEAN12"]) == Taps(last=(15,), mean=(6, 12))
    with pytest.raises(ValueError, match="'x3' is not a layer number"):
        Taps.parse(["x3"])
    assert Taps(last=(31,), mean=(30, 2)).out_of_range(30) == ["31", "mean30"]


def test_feature_sets_name_their_columns():
    sets = feature_sets(Taps(last=(2,), mean=(1,)), hidden=3, extra=2)
    assert list(sets) == ["mean", "last", "mean+last"]
    assert sets["mean"][0] == Taps(mean=(1,)) and sets["mean"][1].tolist() == [3, 4, 5, 6, 7]
    assert sets["last"][0] == Taps(last=(2,)) and sets["last"][1].tolist() == [0, 1, 2, 6, 7]
    assert sets["mean+last"][1].tolist() == list(range(8))
    assert list(feature_sets(Taps(mean=(1,)), hidden=3)) == ["mean"]
    deep = feature_sets(Taps(last=(4,), mean=(1, 3)), hidden=2, extra=1)
    assert list(deep) == ["mean", "last", "mean+last", "mean-deep"]  # the deepest mean layer alone, then the scores
    assert deep["mean-deep"][0] == Taps(mean=(3,)) and deep["mean-deep"][1].tolist() == [4, 5, 6]


def test_feature_sets_of_two_passes_side_by_side():
    """`fit` reads the texts once and twice: each pass's block gives its sets, the echoed ones named
    so, and the label scores after both blocks."""
    once, twice = Taps(last=(2,), mean=(1,)), Taps(last=(2,), mean=(1,), echo=True)
    sets = feature_sets([once, twice], hidden=3, extra=2)
    assert list(sets) == ["mean", "last", "mean+last", "mean (echo)", "last (echo)", "mean+last (echo)"]
    assert sets["mean"][1].tolist() == [3, 4, 5, 12, 13] and not sets["mean"][0].echo
    assert sets["mean (echo)"][0] == Taps(mean=(1,), echo=True) and sets["mean (echo)"][1].tolist() == [9, 10, 11, 12, 13]
    assert sets["last (echo)"][1].tolist() == [6, 7, 8, 12, 13]
    assert sets["mean+last (echo)"][0] == twice and sets["mean+last (echo)"][1].tolist() == list(range(6, 14))
    assert feature_sets([once], hidden=3, extra=2).keys() == feature_sets(once, hidden=3, extra=2).keys()


def test_fit_breaks_a_tie_of_widths_by_the_better_log_loss(monkeypatch):
    """Of sets as wide within one standard error of the best (the same layers read once and twice),
    the one with the better cross-validated log-loss, whichever comes first."""
    from slmclassify.head import fitting

    real = fitting._fit
    rng = np.random.default_rng(2)
    y = np.repeat(["a", "b"], 20)
    X = rng.normal(size=(40, 4)) + (y == "a")[:, None]
    cv = {float(X[0, 0]): (-0.31, 0.05), float(X[0, 2]): (-0.30, 0.05)}  # first column → what the folds "measured"
    monkeypatch.setattr(fitting, "_fit", lambda X, y, *args: (real(X, y, *args)[0], *cv[float(X[0, 0])]))
    assert fit(X, y, candidates={"once": np.arange(2), "twice": np.arange(2, 4)}).choice == "twice"
    cv = {float(X[0, 0]): (-0.29, 0.05), float(X[0, 2]): (-0.30, 0.05)}
    assert fit(X, y, candidates={"once": np.arange(2), "twice": np.arange(2, 4)}).choice == "once"


def test_fit_chooses_the_feature_set_that_separates_the_labels():
    """Given candidates, cross-validation keeps the columns that carry the labels."""
    rng = np.random.default_rng(0)
    y = np.repeat(["a", "b"], 40)
    signal = rng.normal(size=(80, 4)) + (y == "a")[:, None] * 2.0
    X = np.concatenate([rng.normal(size=(80, 4)), signal], axis=1)
    head = fit(X, y, candidates={"noise": np.arange(4), "signal": np.arange(4, 8)})
    assert head.choice == "signal" and head.columns.tolist() == [4, 5, 6, 7]
    assert head.log_probabilities(X).shape == (80, 2)
    assert fit(X, y, candidates={"noise": np.arange(4)}).choice == "noise"


def test_fit_keeps_the_smaller_set_within_one_standard_error_of_the_best(monkeypatch):
    """The one-standard-error rule: a set with more columns must beat the smaller one by more than
    its folds' standard error to be chosen; without folds to compare by, the fewest columns."""
    from slmclassify.head import fitting

    real = fitting._fit
    cv = {}  # columns → (mean log-likelihood, its standard error) the folds "measured"

    def measured(X, y, *args):
        fitted, _, _ = real(X, y, *args)
        return (fitted, *cv[X.shape[1]])

    monkeypatch.setattr(fitting, "_fit", measured)
    rng = np.random.default_rng(1)
    y = np.repeat(["a", "b"], 20)
    X = rng.normal(size=(40, 8)) + (y == "a")[:, None]
    sets = {"wide": np.arange(8), "narrow": np.arange(2)}
    cv.update({8: (-0.30, 0.05), 2: (-0.32, 0.04)})
    assert fit(X, y, candidates=sets).choice == "narrow"  # 0.02 better: within the error
    cv.update({8: (-0.20, 0.05), 2: (-0.32, 0.04)})
    assert fit(X, y, candidates=sets).choice == "wide"
    cv.update({8: (-np.inf, 0.0), 2: (-np.inf, 0.0)})  # too few items to cross-validate
    assert fit(X, y, candidates=sets).choice == "narrow"


def test_fit_save_load_round_trip_and_determinism(llama_loaded, tmp_path):
    task = Task(labels=("billing", "technical"))
    texts, gold = labelled(12)
    head = fitted_head(llama_loaded, task, texts, gold)
    again = fitted_head(llama_loaded, task, texts, gold)
    np.testing.assert_array_equal(head.coef, again.coef)  # same items, same head
    assert head.labels == ("broken app", "money")  # any strings from the gold column

    loaded = Head.load(head.save(tmp_path / "head.npz"))
    for field in ("mean", "scale", "coef", "intercept"):
        np.testing.assert_array_equal(getattr(loaded, field), getattr(head, field))
    assert (loaded.labels, loaded.taps, loaded.model, loaded.task) == (head.labels, head.taps, head.model, head.task)

    clf = Classifier(task, model=llama_loaded, settings=EngineSettings(token_budget=None, max_rows=4))
    other = Classifier(task, model=llama_loaded, settings=EngineSettings(token_budget=64, max_rows=3))
    test_texts, _ = labelled(6, seed=1)
    _, first = score_with_head(clf, clf.encode(test_texts), loaded, "head")
    _, second = score_with_head(other, other.encode(test_texts), loaded, "head")
    assert [r.label for r in first] == [r.label for r in second]  # other batches, same predictions
    p1 = np.array([[r.probabilities[lab] for lab in loaded.labels] for r in first])
    p2 = np.array([[r.probabilities[lab] for lab in loaded.labels] for r in second])
    np.testing.assert_allclose(p1, p2, atol=1e-6)

    # the saved numbers give scikit-learn's own probabilities (binary: sklearn keeps one row of weights)
    from sklearn.linear_model import LogisticRegression

    fit_clf = Classifier(task, model=llama_loaded)
    _, calibrated, states = collect(fit_clf, fit_clf.encode(texts), loaded.taps)
    X = np.concatenate([states, calibrated], axis=1)
    sk = LogisticRegression(C=loaded.info["C"], max_iter=1000).fit((X - loaded.mean) / loaded.scale, gold)
    _, calibrated, states = collect(clf, clf.encode(test_texts), loaded.taps)
    X_test = np.concatenate([states, calibrated], axis=1)
    # (LogisticRegressionCV's refit starts from the folds' solutions: both stop within lbfgs's tolerance)
    np.testing.assert_allclose(p1, sk.predict_proba((X_test - loaded.mean) / loaded.scale), atol=2e-3)
    assert (p1.argmax(1) == sk.predict_proba((X_test - loaded.mean) / loaded.scale).argmax(1)).all()


def test_refuses_head_of_other_model_or_task(tiny_loaded, llama_loaded, tmp_path):
    task = Task(labels=("billing", "technical"))
    head = Head.load(fitted_head(llama_loaded, task, *labelled(6)).save(tmp_path / "h.npz"))
    head.check(model_fingerprint(llama_loaded), task)  # its own model and task pass
    if tiny_loaded.model.config.model_type != "llama":
        with pytest.raises(TaskError, match=r"fitted for model .*architecture.*differ"):
            head.check(model_fingerprint(tiny_loaded), task)
    with pytest.raises(TaskError, match=r"another task \(user_template: '\{text\}' in the head, 'Ticket: \{text\}' here\)"):
        head.check(model_fingerprint(llama_loaded), task.with_overrides(user_template="Ticket: {text}"))
    with pytest.raises(TaskError, match=r"another task \(labels: "):
        head.check(model_fingerprint(llama_loaded), Task(labels=("billing", "account")))


def test_cross_validated_probabilities_are_out_of_fold():
    rng = np.random.default_rng(0)
    y = np.array(["a", "b"] * 20)
    X = rng.normal(size=(40, 5)) + (y == "a")[:, None] * 3.0
    probs = cross_validated(X, y, ("a", "b"), folds=4)
    np.testing.assert_allclose(probs.sum(1), 1.0)
    assert ((probs.argmax(1) == (y == "b")).mean()) == 1.0


def test_fit_on_two_items_per_label_writes_a_head_without_a_curve(llama_dir, tmp_path):
    """Regression: with too few items for any curve size (here 3 per label, 2 folds) fit printed its
    CV table, then died in matplotlib (`Data cannot be log-scaled`) and wrote no head."""
    texts, gold = labelled(3)
    train = tmp_path / "train.csv"
    pd.DataFrame({"text": texts, "gold": gold}).to_csv(train, index=False)
    result = CliRunner().invoke(cli, ["fit", str(train), "--label-column", "gold", "--labels", "billing,technical",
                                      "--model", str(llama_dir), "-o", str(tmp_path / "head.npz"), "--folds", "2"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "learning curve: none (its smallest size, 4 per label, needs more than the 1 per label" in result.output
    assert Head.load(tmp_path / "head.npz").info["curve"] == [] and not (tmp_path / "head-curve.png").exists()



    texts, gold = labelled(10)
    train = tmp_path / "train.csv"
    pd.DataFrame({"text": texts, "gold": gold}).to_csv(train, index=False)
    head_path = tmp_path / "head.npz"
    runner = CliRunner()
    result = runner.invoke(cli, ["fit", str(train), "--gold-column", "gold", "--labels", "billing,technical",
                                 "--model", str(llama_dir), "-o", str(head_path), "--curve", "2,4", "--folds", "3"],
                           catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "zero-shot: not comparable" in result.output  # gold labels are not the task's labels
    assert "head (3-fold CV)" in result.output and "learning curve" in result.output
    assert ("(by cross-validation among mean, last, mean+last, mean (echo), last (echo), mean+last (echo): the fewest "
            "columns within one") in result.output
    assert "two fast-path passes (each text read once, then twice)" in result.output
    assert (tmp_path / "head-curve.png").stat().st_size > 1000
    head = Head.load(head_path)
    assert head.labels == ("broken app", "money") and head.info["items"] == 20

    test_texts, test_gold = labelled(5, seed=3)
    inp = tmp_path / "in.csv"
    pd.DataFrame({"text": test_texts + [""], "gold": test_gold + ["money"]}).to_csv(inp, index=False)
    out = tmp_path / "out.csv"
    result = runner.invoke(cli, ["classify", str(inp), "-o", str(out), "--head", str(head_path),
                                 "--model", str(llama_dir), "--quiet", "--gold-column", "gold"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(out, keep_default_na=False)
    assert list(frame.columns) == ["text", "gold", "label", "confidence", "needs_review", "p_broken app",
                                   "p_money", "status"]
    assert len(frame) == 11 and frame["status"].tolist() == ["ok"] * 10 + ["empty"]
    assert set(frame["label"][:10]) <= {"money", "broken app"} and frame["label"][10] == ""
    assert "accuracy vs gold" in result.output

    # the task file's `head` key does the same, and --scorer zero-shot ignores it
    toml = tmp_path / "task.toml"
    toml.write_text('labels = ["billing", "technical"]\nhead = "head.npz"\n')
    out2 = tmp_path / "out2.csv"
    result = runner.invoke(cli, ["classify", str(inp), "-o", str(out2), "--task", str(toml), "--model", str(llama_dir),
                                 "--quiet"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert pd.read_csv(out2, keep_default_na=False)["label"].tolist() == frame["label"].tolist()
    result = runner.invoke(cli, ["classify", str(inp), "-o", str(out2), "--task", str(toml), "--model", str(llama_dir),
                                 "--quiet", "--scorer", "zero-shot"], catch_exceptions=False)
    assert "p_billing" in pd.read_csv(out2).columns

    result = runner.invoke(cli, ["evaluate", str(inp), "--gold-column", "gold", "--head", str(head_path),
                                 "--model", str(llama_dir), "--target-accuracy", "0.8"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"scorer: head (head: 2 labels, layers {head.taps.describe()}, fitted on 20 items)" in result.output
    assert "min_confidence" in result.output or "no threshold reaches accuracy 0.80" in result.output


def test_evaluate_head_with_the_task_labels_prints_zero_shot_and_warns_of_its_own_items(llama_dir, tmp_path):
    """Regression: the lines `evaluate --head` prints next to the head's report (zero-shot on the same
    items, when the head's labels are the task's; the items the head was fitted on) come from the
    figures the job returns; one was left printing in the library and raised NameError."""
    texts, gold = labelled(6)
    data = tmp_path / "gold.csv"
    pd.DataFrame({"text": texts, "label": gold}).to_csv(data, index=False)
    head_path = tmp_path / "head.npz"
    runner = CliRunner()
    fitted = runner.invoke(cli, ["fit", str(data), "-o", str(head_path), "--model", str(llama_dir), "--labels",
                                 "money,broken app", "--folds", "3", "--curve", "2"], catch_exceptions=False)
    assert fitted.exit_code == 0, fitted.output
    result = runner.invoke(cli, ["evaluate", str(data), "--head", str(head_path), "--model", str(llama_dir)],
                           catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert ("warning: 12 of these 12 items were used to fit the head, so its figures on them are optimistic; "
            "`slmclassify fit` prints cross-validated ones") in lines
    assert any(line.startswith("zero-shot on the same items: accuracy ") for line in lines), result.output
    assert any(line.startswith("scorer: head (head: 2 labels, layers ") and line.endswith(", fitted on 12 items)")
               for line in lines), result.output


def test_cli_refuses_mismatched_head(llama_dir, tmp_path, capsys, monkeypatch):
    from slmclassify import load_model

    loaded = load_model(str(llama_dir))
    head_path = fitted_head(loaded, Task(labels=("billing", "technical")), *labelled(6)).save(tmp_path / "h.npz")
    inp = tmp_path / "in.csv"
    pd.DataFrame({"text": ["card charged"]}).to_csv(inp, index=False)
    monkeypatch.setattr("sys.argv", ["slmclassify", "classify", str(inp), "-o", str(tmp_path / "o.csv"), "--head",
                                     str(head_path), "--labels", "billing,account", "--model", str(llama_dir)])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"slmclassify: error: {head_path} was fitted for another task (labels: ['billing', 'technical'] "
                          "in the head, ['billing', 'account'] here)")
    assert not (tmp_path / "o.csv").exists()


@pytest.mark.isa  # the int8 and bf16 kernels' states
@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_states_from_low_precision_backends_are_float32_on_cpu(tiny_model_dir, precision, tmp_path, monkeypatch):
    """The backend engine (LinearOps in int8/bf16) hands out float32 CPU states near float32's; the
    taps change no score. Measured max relative |Δ state| vs fp32 on this model: int8 0.107, bf16 0.035."""
    from slmclassify.backends.device import cpu_native
    from slmclassify.models.prepare import load_model

    if precision == "bf16" and not cpu_native("bf16"):
        pytest.skip("this CPU has no native bf16")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    task = Task(labels=("billing", "technical", "account"))
    encoded = None
    states = {}
    for p in ("fp32", precision):
        clf = Classifier(task, model=load_model(str(tiny_model_dir), device="cpu", precision=p))
        assert clf.engine.backend.precision == p
        encoded = clf.encode(random_texts(12, seed=5))
        scored = clf.score(encoded, taps=Taps(last=(1, 2)))
        states[p] = scored.states
        np.testing.assert_array_equal(scored.scores, clf.score(encoded).scores)
        assert states[p].dtype == np.float32 and np.isfinite(states[p]).all()
    ref, low = states["fp32"], states[precision]
    rel = np.linalg.norm(low - ref, axis=1).max() / np.linalg.norm(ref, axis=1).min()
    assert 1e-4 < rel <= 0.25, rel  # really low precision, and the same layers
    swapped = clf.score(encoded, taps=Taps(last=(2, 1))).states
    hidden = ref.shape[1] // 2
    np.testing.assert_array_equal(swapped, np.concatenate([low[:, hidden:], low[:, :hidden]], axis=1))


def test_head_cost_times_zero_shot_and_head_interleaved(llama_loaded):
    """`bench.head_cost.measure`: both sides score every chunk in every round, the order alternating
    (timing harness), and its figures are the harness's."""
    from slmclassify.bench.head_cost import measure

    clf = Classifier(Task(labels=("money", "broken app")), model=llama_loaded)
    texts, _ = labelled(5)
    out = measure(clf, texts, chunk=4, rounds=2)
    timings = out.pop("timings")
    assert (out["items"], out["rounds"], timings.rounds, timings.units) == (10, 2, 2, 3)
    assert [side for _, _, side in timings.calls] == ["zero-shot", "head", "head", "zero-shot"] * 3
    assert out["features"] == len(out["taps"]) * llama_loaded.model.config.hidden_size + 2
    assert out["ratio"] == pytest.approx(np.median(timings.per_round("head") / timings.per_round("zero-shot")))
    assert out["zero_shot_items_per_s"] == pytest.approx(20 / timings.total("zero-shot"))
    assert "echo_ratio" not in out
    # --echo: a third side, the head reading each text twice, on its own encoding of the same items
    out = measure(clf, texts, chunk=4, rounds=2, echo=True)
    timings = out.pop("timings")
    assert sorted({side for _, _, side in timings.calls}) == ["head", "head (echo)", "zero-shot"]
    assert len(timings.calls) == 3 * 3 * 2
    assert out["echo_ratio"] == pytest.approx(np.median(timings.per_round("head (echo)") / timings.per_round("head")))


def test_folds_keep_each_group_together():
    """`fit --group-column`: a group's items (near copies of one text) never sit on both sides of a fold."""
    from slmclassify.head.fitting import folds_of

    y = np.array(["a", "b"] * 20)
    groups = np.repeat(np.arange(10), 4)  # each group: two a's and two b's
    splits = folds_of(y, 5, seed=0, groups=groups)
    assert len(splits) == 5
    for train, test in splits:
        assert not set(groups[train]) & set(groups[test])
        assert set(y[test]) == {"a", "b"}
    assert len(folds_of(y, 5, seed=0)) == 5 and folds_of(y[:3], 5, seed=0) == []
    # twins of opposite labels: ungrouped folds split them, grouped folds keep each pair out together
    rng = np.random.default_rng(0)
    base = rng.normal(size=(20, 6))
    X, y2, pairs = np.repeat(base, 2, axis=0), np.array(["a", "b"] * 20), np.repeat(np.arange(20), 2)
    probs = cross_validated(X, y2, ("a", "b"), folds=4, groups=pairs)
    assert probs.shape == (40, 2) and np.isfinite(probs).all()


def test_shared_openings_warn_without_groups():
    from slmclassify.jobs.fit import shared_openings

    twins = [f"please help me with my order number {i}" for i in range(6)] + ["a b c d e f", "other text here"]
    (warning,) = shared_openings(twins)
    assert warning.startswith("6 of 8 items share their first 5 words with another item; if they are variants")
    assert "--group-column" in warning
    assert shared_openings(["one two", "three four five six seven eight", "nine"]) == ()


def test_group_column_is_read_and_checked(tmp_path):
    from slmclassify.errors import InputError
    from slmclassify.io.labelled import read_labelled

    path = tmp_path / "g.csv"
    pd.DataFrame({"text": ["x", "y", "z"], "label": ["a", "b", "a"], "pair": ["p1", "", "p1"]}).to_csv(path, index=False)
    data = read_labelled(str(path), "text", "label", group_column="pair")
    assert data.groups[0] == data.groups[2] == "p1" and data.groups[1] not in ("p1", "")
    with pytest.raises(InputError, match=r"no group column 'grp' \(use group_column\); columns are: text, label, pair"):
        read_labelled(str(path), "text", "label", group_column="grp")


def test_head_baselines_score_every_method_on_the_same_unseen_half(llama_loaded):
    """`bench.head_baselines`: ours and TF-IDF + LR learn from the first half (all, 32 and 8 per
    label) and are scored on the second; the table prints what was measured."""
    from slmclassify.bench.head_baselines import halves, run_dataset, sample, table_text

    texts, gold = labelled(12, seed=4)
    gold = np.array(gold)
    train, test = halves(gold)
    assert not set(train) & set(test) and len(test) == 12
    assert sorted(np.unique(gold[sample(train, gold, 2, seed=0)], return_counts=True)[1]) == [2, 2]
    result = run_dataset("toy", texts, gold, Task(labels=("billing", "technical")), llama_loaded, seeds=2, minilm=None,
                         log=lambda *a, **k: None)
    assert result["test"] == 12 and result["majority"] == 0.5 and "minilm" not in result
    assert set(result["ours"]) == set(result["tfidf"]) == {"full", "32", "8"}
    assert len(result["ours"]["8"]["runs"]) == 2 and len(result["ours"]["full"]["runs"]) == 1
    assert result["ours_chose"]["full"][0] in [f"{s}{e}" for s in ("mean", "last", "mean+last") for e in ("", " (echo)")]
    table = table_text({"toy": result}, seeds=2)
    assert f"| toy | 12 | 0.500 | {result['ours']['full']['mean']:.3f} | {result['tfidf']['full']['mean']:.3f} |" in table
    assert result["half_per_label"] == [6, 6]  # 32 and 8 per label cannot be sampled from it: the table says so
    assert "32 per label is the whole first half on: toy (6 per label)" in table
    assert "8 per label is the whole first half on: toy (6 per label)" in table
    uneven = {**result, "half_per_label": [5, 12]}
    table = table_text({"toy": result, "uneven": uneven}, seeds=2)
    assert "32 per label is the whole first half on: toy (6 per label), uneven (5–12 per label)" in table
    assert "8 per label takes every item of the labels with fewer on: uneven (5–12 per label)" in table


def test_taps_out_of_range_are_refused_naming_them(llama_loaded):
    clf = Classifier(Task(labels=("billing", "technical")), model=llama_loaded)
    n = llama_loaded.model.config.num_hidden_layers
    with pytest.raises(TaskError, match=rf"taps {n + 1}, mean{n} out of range: the model has layers 1..{n} "
                                        rf"\(a mean: 1..{n - 1}\)"):
        clf.score(clf.encode(["card charged twice"]), taps=Taps(last=(n + 1,), mean=(n,)))
