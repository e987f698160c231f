"""Anchors: each label's description read as an item is a row every fit learns from (`ANCHOR_WEIGHT`
copies) and no fold tests; `fit`, the labelling loop and the benchmarks read them in the pass that
reads the items."""

from __future__ import annotations

import numpy as np
import pytest

from slmclassify import Classifier, EngineSettings, Task
from slmclassify.head.features import anchor_texts, collect, loop_taps
from slmclassify.head.fitting import ANCHOR_WEIGHT, Anchors, cross_validated, fit

from helpers import labelled, wait_for


def blobs(per_label: int, seed: int, dims: int = 40, noise: float = 3.0):
    """Three labels around centres far apart in 40 dimensions, items buried in noise: few items
    give a poor estimate of where a label lies; its anchor sits at its centre."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(99).normal(0, 1, (3, dims))
    y = np.repeat(np.array(["a", "b", "c"]), per_label)
    X = centres[np.repeat(np.arange(3), per_label)] + rng.normal(0, noise, (3 * per_label, dims))
    return X, y, Anchors(centres, np.array(["a", "b", "c"]))


def test_an_anchor_counts_as_weight_copies_of_its_row():
    X, y, anchors = blobs(4, seed=0)
    with_anchors = fit(X, y, Cs=(0.1,), anchors=anchors)
    copies = fit(np.concatenate([X] + [anchors.X] * ANCHOR_WEIGHT), np.concatenate([y] + [anchors.y] * ANCHOR_WEIGHT),
                 Cs=(0.1,))
    np.testing.assert_array_equal(with_anchors.coef, copies.coef)
    np.testing.assert_array_equal(with_anchors.mean, copies.mean)


def test_anchors_of_labels_the_gold_lacks_are_left_out():
    X, y, anchors = blobs(6, seed=1)
    keep = y != "c"
    head = fit(X[keep], y[keep], Cs=(0.1,), anchors=anchors)
    assert head.labels == ("a", "b")  # no class learnt from an anchor alone
    assert fit(X[keep], y[keep], anchors=Anchors(anchors.X[2:], anchors.y[2:])).labels == ("a", "b")


def test_anchors_train_every_fold_and_are_never_tested(monkeypatch):
    """The folds choosing C test items only; every training part holds every anchor copy."""
    import sklearn.linear_model as lm

    seen = []
    real = lm.LogisticRegressionCV

    class Spy(real):
        def fit(self, X, y, **kw):
            seen.append((len(X), list(self.cv)))
            return super().fit(X, y, **kw)

    monkeypatch.setattr(lm, "LogisticRegressionCV", Spy)
    X, y, anchors = blobs(10, seed=2)
    fit(X, y, folds=5, anchors=anchors)
    (rows, splits), = seen
    n, extra = len(y), set(range(len(y), len(y) + ANCHOR_WEIGHT * 3))
    assert rows == n + len(extra) and len(splits) == 5
    for train, test in splits:
        assert extra <= set(train.tolist()) and max(test) < n
    assert sorted(np.concatenate([test for _, test in splits]).tolist()) == list(range(n))


def test_anchors_lift_a_head_learnt_from_few_items():
    """Seeded: on every one of five draws of 3 items per label, the head with the labels' anchors is
    more accurate on 600 new items than the head without."""
    test_X, test_y, _ = blobs(200, seed=100)
    for seed in range(5):
        X, y, anchors = blobs(3, seed=seed)
        without = fit(X, y)
        with_anchors = fit(X, y, anchors=anchors)
        acc = lambda h: (np.array(h.labels)[h.log_probabilities(test_X).argmax(1)] == test_y).mean()  # noqa: E731
        assert acc(with_anchors) > acc(without) + 0.05, seed
    # cross-validated figures stay out of fold with anchors (their rows are never a tested item)
    X, y, anchors = blobs(10, seed=7)
    probs = cross_validated(X, y, ("a", "b", "c"), folds=5, anchors=anchors)
    assert probs.shape == (30, 3) and np.allclose(probs.sum(1), 1)


def test_only_labels_with_a_description_have_an_anchor():
    task = Task(labels=("card_lost", "fees", "wire-transfer"), descriptions=("a lost or stolen card", " ", ""))
    assert anchor_texts(task) == {"card_lost": "a lost or stolen card"}
    assert anchor_texts(Task(labels=("Yes", "No"))) == {}  # a name alone is no anchor
    fields = Task(labels=("a", "b"), descriptions=("first", "second"), user_template="Subject: {subject}\n{body}")
    assert anchor_texts(fields) == {}  # a description is not a record of several fields


def test_fit_reads_the_anchors_in_its_pass_and_records_them(llama_loaded, tmp_path):
    from slmclassify.jobs.fit import FitRequest, fit_file

    texts, gold = labelled(10)
    gold = ["billing" if g == "money" else "technical" for g in gold]
    path = tmp_path / "train.csv"
    import pandas as pd

    pd.DataFrame({"text": texts, "gold": gold}).to_csv(path, index=False)
    task = Task(labels=("billing", "technical", "shipping"),
                descriptions=("charges, invoices and refunds", "", "parcels and delivery"))
    summary = fit_file(FitRequest(str(path), str(tmp_path / "head.npz"), label_column="gold", curve_sizes=()),
                       task, EngineSettings(), model=llama_loaded)
    # the labels the gold holds have anchors; the one it lacks is no class of the head
    assert summary.head.info["anchors"] == {"billing": "charges, invoices and refunds"}
    assert summary.head.labels == ("billing", "technical")
    # the head is the fit of the items' features with those anchors' rows, read by the same classifier
    clf = Classifier(task, model=llama_loaded)
    taps = summary.head.taps  # read as the head reads them (once or twice: cross-validation chose)
    _, calibrated, states = collect(clf, clf.encode([*texts, "charges, invoices and refunds"], taps), taps)
    anchors = Anchors(states[len(texts):].astype(np.float64), np.array(["billing"]))
    again = fit(states[:len(texts)].astype(np.float64), np.array(gold), anchors=anchors)
    np.testing.assert_allclose(summary.head.coef, again.coef, atol=1e-6)


def test_the_loop_reads_the_anchors_with_its_first_slice(tmp_path, llama_dir, one_torch_thread):
    """The labelling session's pool holds the described labels' anchor states, read in the first
    slice's pass, and its head is the loop's learner on the answers with those anchors."""
    import pandas as pd

    from slmclassify.label import refit
    from slmclassify.label.session import LabelRequest, LabelSession

    texts, gold = labelled(6)
    answer = dict(zip(texts, gold))
    path = tmp_path / "items.csv"
    pd.DataFrame({"text": texts}).to_csv(path, index=False)
    task = Task(labels=("money", "broken app"), descriptions=("a charge, an invoice or a refund", ""))
    session = LabelSession.start(LabelRequest(str(path), tmp_path / "s.sqlite", first_slice=4, seed=0), task,
                                 model=str(llama_dir))
    try:
        assert session.wait_ready(120)
        pool, loaded = session.pool, session.clf.loaded
        taps = loop_taps(loaded.model.config.num_hidden_layers)
        assert pool.anchors.shape == (1, len(taps) * loaded.model.config.hidden_size)
        _, _, want = collect(session.clf, session.clf.encode(["a charge, an invoice or a refund"]), taps)
        np.testing.assert_allclose(pool.anchors, want, atol=1e-5)
        assert pool.anchor_rows().y.tolist() == [0]  # the label 'money', column 0
        while min(session.state()["counts"].values(), default=0) < 2 or len(session.state()["counts"]) < 2:
            item = session.state()["item"]
            session.answer(item["row"], answer[item["text"]])

        def learnt_with_anchors() -> bool:  # the head of the latest answers (the refit runs on its own thread)
            with session._sync.lock:
                pos = pool.scored_among(session.answers.given)
                y = np.array([session.answers.given[p] for p in pos])
                X, head = pool.features[pos].copy(), session.head
            return head is not None and np.array_equal(head.fitted.coef, refit.fit_head(X, y, 2, 0, pool.anchor_rows()).fitted.coef)

        wait_for(learnt_with_anchors)
        with session._sync.lock:
            pos = pool.scored_among(session.answers.given)
            y, X = np.array([session.answers.given[p] for p in pos]), pool.features[pos].copy()
        assert not np.allclose(refit.fit_head(X, y, 2, 0).fitted.coef, session.head.fitted.coef)  # the anchors count
    finally:
        session.close()


# --------------------------------------------------------------------------- a head from the descriptions alone


def test_a_description_head_is_the_cosine_of_centred_states_over_the_temperature(tmp_path):
    from slmclassify.head.describe import TEMPERATURE, description_head
    from slmclassify.head.model import Head
    from slmclassify.core.taps import Taps

    rng = np.random.default_rng(0)
    states = rng.normal(size=(20, 6))
    states[3] = np.nan  # an empty item: not in the centre
    described = rng.normal(size=(3, 6))
    head = description_head(states, described, ("a", "b", "c"), Taps(mean=(1,)), model={}, task={}, info={})
    centre = np.nanmean(states, axis=0)
    x, d = states[[0, 1, 2]] - centre, described - centre
    cos = (x / np.linalg.norm(x, axis=1, keepdims=True)) @ (d / np.linalg.norm(d, axis=1, keepdims=True)).T
    want = cos / TEMPERATURE - np.log(np.exp(cos / TEMPERATURE).sum(1, keepdims=True))
    np.testing.assert_allclose(head.log_probabilities(states[[0, 1, 2]]), want, atol=1e-12)
    again = Head.load(head.save(tmp_path / "h.npz"))
    assert again.cosine and again.labels == ("a", "b", "c")
    np.testing.assert_array_equal(again.log_probabilities(states[:3]), head.log_probabilities(states[:3]))


def test_fit_from_descriptions_needs_no_gold_and_classify_reads_the_head(tmp_path, llama_dir, run_main):
    import pandas as pd

    from slmclassify.head.model import Head

    texts, gold = labelled(8)
    items = tmp_path / "items.csv"
    pd.DataFrame({"text": texts}).to_csv(items, index=False)  # no gold column
    task = tmp_path / "task.toml"
    task.write_text('[[labels]]\nname = "money"\ndescription = "a charge, an invoice or a refund"\n'
                    '[[labels]]\nname = "broken_app"\n')
    code, out, err = run_main("fit", str(items), "--task", str(task), "--from-descriptions", "-o",
                              str(tmp_path / "h.npz"), "--model", str(llama_dir))
    assert code == 0, err
    assert "centred on 16 items" in out and "broken_app: 'broken app'" in out and "no gold was read" in out
    head = Head.load(tmp_path / "h.npz")
    assert head.cosine and head.labels == ("money", "broken_app") and head.info["items"] == 16
    code, _, err = run_main("classify", str(items), "-o", str(tmp_path / "out.csv"), "--head", str(tmp_path / "h.npz"),
                            "--model", str(llama_dir), "--quiet")
    assert code == 0, err
    out = pd.read_csv(tmp_path / "out.csv")
    assert len(out) == 16 and set(out["label"]) <= {"money", "broken_app"}
    assert np.allclose(out[["p_money", "p_broken_app"]].sum(1), 1, atol=1e-6)
    # the items only centred it (no gold read): measured on them, no warning that they were fitted on
    pd.DataFrame({"text": texts, "gold": [g.replace(" ", "_") for g in gold]}).to_csv(tmp_path / "gold.csv", index=False)
    code, out, err = run_main("evaluate", str(tmp_path / "gold.csv"), "--gold-column", "gold", "--head",
                              str(tmp_path / "h.npz"), "--task", str(task), "--model", str(llama_dir))
    assert code == 0, err
    assert "accuracy" in out and "used to fit the head" not in out
    code, _, err = run_main("fit", str(items), "--from-descriptions", "-o", str(tmp_path / "x.npz"),
                            "--model", str(llama_dir))
    assert code == 2 and "--from-descriptions reads the labels' descriptions: give them with --task" in err
    code, _, err = run_main("fit", str(items), "--task", str(task), "--from-descriptions", "--plot", str(tmp_path / "p.png"),
                            "-o", str(tmp_path / "x.npz"), "--model", str(llama_dir))
    assert code == 2 and "--plot does not apply to a head from the descriptions" in err


def test_fit_from_descriptions_refuses_a_task_it_cannot_make_a_head_for_before_reading_a_model(tmp_path):
    from slmclassify.errors import FieldError
    from slmclassify.jobs.fit import FitRequest, fit_file

    request = FitRequest(input_path=str(tmp_path / "absent.csv"), output_path=str(tmp_path / "h.npz"),
                         from_descriptions=True)
    task = Task(labels=("a", "b"), multi_label=True)
    with pytest.raises(FieldError, match="from_descriptions.*several labels per item"):
        fit_file(request, task, EngineSettings(), model="never-read")


def test_the_views_of_a_task_of_questions_see_the_anchors_the_scorer_writes(tmp_path):
    """Each question's view of the labelling pool reads its own labels' anchors (question label
    indices) from the one array the scorer writes in place after the first slice."""
    from slmclassify.core.taps import Taps
    from slmclassify.jobs.sources import read_task
    from slmclassify.label.pool import Pool

    from test_questions import TRIAGE

    (tmp_path / "triage.toml").write_text(TRIAGE)
    task = read_task(tmp_path / "triage.toml")
    pool = Pool(["a", "b", "c"], task, sample=10, seed=0, taps=Taps(mean=(1,)), width=4)
    described = [(q.name, lab) for q in task.questions for lab, d in zip(q.labels, q.task.descriptions) if d.strip()]
    assert len(pool.anchor_texts) == len(described) > 0
    assert all(part.anchor_rows() is None for part in pool.parts)  # not read yet
    pool.anchors[:] = np.arange(len(described) * 4, dtype=np.float32).reshape(-1, 4)  # as the scorer does
    for part in pool.parts:
        mine = [i for i, (name, _) in enumerate(described) if name == part.name]
        rows = part.anchor_rows()
        if not mine:
            assert rows is None
            continue
        assert rows.y.tolist() == [part.labels.index(described[i][1]) for i in mine]
        np.testing.assert_array_equal(rows.X, pool.anchors[mine])


def test_a_session_of_questions_reads_each_described_questions_anchors(tmp_path, llama_dir, one_torch_thread):
    """The scorer's first slice fills the anchors that each question's view (what its refits read) sees."""
    from slmclassify.jobs.sources import read_task
    from slmclassify.label.session import LabelRequest, LabelSession

    from helpers import tickets

    data = tmp_path / "tickets.csv"
    tickets(data, 8)
    (tmp_path / "triage.toml").write_text(
        'instruction = "Triage."\n[[questions]]\nname = "team"\nlabels = [{name = "billing", description = "money"}, '
        '"technical", {name = "account", description = "login"}]\n[[questions]]\nname = "priority"\n'
        'labels = ["low", "high"]\n')
    session = LabelSession.start(LabelRequest(str(data), tmp_path / "s.sqlite", first_slice=4, seed=0),
                                 read_task(tmp_path / "triage.toml"), model=str(llama_dir))
    try:
        assert session.wait_ready(120)
        with session._sync.lock:
            views = {part.name: part.anchor_rows() for part in session.pool.parts}
        assert views["team"].y.tolist() == [0, 2] and not np.isnan(views["team"].X).any()
        assert views["priority"] is None
    finally:
        session.close()
