"""The head on the streaming classify job: windows, duplicates, empty rows and resume."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from slmclassify import Classifier, EngineSettings, Task
from slmclassify.head import Head, score_with_head

from helpers import fitted_head, interrupt_after, labelled

TASK = Task(labels=("billing", "technical"))


@pytest.fixture(scope="module")
def heads(tmp_path_factory, llama_dir):
    from slmclassify import load_model

    folder = tmp_path_factory.mktemp("heads")
    loaded = load_model(str(llama_dir))
    first = fitted_head(loaded, TASK, *labelled(6)).save(folder / "head.npz")
    second = fitted_head(loaded, TASK, *labelled(6, seed=7)).save(folder / "other.npz")
    return loaded, first, second


def _input(path, n=30):
    texts, _ = labelled(n // 2, seed=2)
    texts[2] = texts[1]  # duplicates within a window (rows 0-3, 20-23)
    texts[22] = texts[21]
    texts[17] = texts[3]  # a repeat from an earlier window: scored again
    texts[9] = ""
    pd.DataFrame({"id": range(len(texts)), "text": texts}).to_csv(path, index=False)
    return path, texts


def _args(src, target, llama_dir, head, *extra):
    return ["classify", src, "-o", target, "--labels", "billing,technical", "--model", llama_dir, "--window", "4",
            "--quiet", "--head", head, *extra]


def test_streaming_head_equals_whole_file(run_main, tmp_path, llama_dir, heads):  # noqa: F811
    loaded, head_path, _ = heads
    src, texts = _input(tmp_path / "in.csv")
    out = tmp_path / "out.csv"
    code, _, err = run_main(*_args(src, out, llama_dir, head_path))
    assert code == 0, err
    assert f"scorer: head ({head_path}: 2 labels, layers 1 (mean))" in err
    assert "duplicates: 2 rows took the scores of an identical row of their window" in err
    frame = pd.read_csv(out, keep_default_na=False)
    assert list(frame.columns) == ["id", "text", "label", "confidence", "needs_review", "p_broken app", "p_money",
                                   "status"]
    assert frame["id"].tolist() == list(range(len(texts)))  # every row once, in order

    head = Head.load(head_path)
    clf = Classifier(TASK, model=loaded, settings=EngineSettings())
    _, whole = score_with_head(clf, clf.encode(texts), head, "head")
    assert frame["label"].tolist() == [r.label or "" for r in whole]
    assert frame["status"].tolist() == [r.status for r in whole]
    for label in head.labels:
        expected = np.array([r.probabilities.get(label, np.nan) for r in whole], dtype=float)
        got = pd.to_numeric(frame[f"p_{label}"], errors="coerce").to_numpy()
        np.testing.assert_allclose(got, expected, atol=1e-5, equal_nan=True)


def test_resume_with_head_is_byte_identical_and_refuses_another(run_main, monkeypatch, tmp_path, llama_dir,  # noqa: F811
                                                                   heads):
    _, head_path, other_path = heads
    src, _ = _input(tmp_path / "in.csv")
    whole = tmp_path / "whole.csv"
    code, _, err = run_main(*_args(src, whole, llama_dir, head_path))
    assert code == 0, err

    target = tmp_path / "out.csv"
    with monkeypatch.context() as m:
        interrupt_after(m, 3)
        code, _, err = run_main(*_args(src, target, llama_dir, head_path))
    assert code == 130, err
    for extra, what in (([], other_path), (["--scorer", "zero-shot"], head_path)):
        code, _, err = run_main(*_args(src, target, llama_dir, what, "--resume", *extra))
        assert code == 2, err
        line = err.strip().splitlines()[-1]
        assert line.startswith(f"slmclassify: error: cannot resume {target}: the head or --scorer changed"), line
    code, _, err = run_main(*_args(src, target, llama_dir, head_path, "--resume"))
    assert code == 0, err
    assert "resumed after 12 rows" in err
    assert target.read_bytes() == whole.read_bytes()


def test_streaming_combined_scorer_to_parquet(run_main, tmp_path, llama_dir, heads):  # noqa: F811
    loaded, _, _ = heads
    texts, gold = labelled(6)
    names = {"money": "billing", "broken app": "technical"}
    head_path = fitted_head(loaded, TASK, texts, [names[g] for g in gold]).save(tmp_path / "same.npz")
    src, inputs = _input(tmp_path / "in.csv")
    out = tmp_path / "out.parquet"
    code, _, err = run_main(*_args(src, out, llama_dir, head_path, "--scorer", "combined"))
    assert code == 0, err
    frame = pd.read_parquet(out)
    assert list(frame.columns) == ["id", "text", "label", "confidence", "needs_review", "p_billing", "p_technical",
                                   "status"]
    clf = Classifier(TASK, model=loaded, settings=EngineSettings())
    _, whole = score_with_head(clf, clf.encode(inputs), Head.load(head_path), "combined")
    assert [None if pd.isna(x) else x for x in frame["label"]] == [r.label for r in whole]  # row 9: empty
    expected = np.array([r.probabilities.get("billing", np.nan) for r in whole], dtype=float)
    np.testing.assert_allclose(frame["p_billing"].to_numpy(dtype=float), expected, atol=1e-5, equal_nan=True)


def test_ray_refuses_a_head(run_main, tmp_path, llama_dir, heads):  # noqa: F811
    _, head_path, _ = heads
    src, _ = _input(tmp_path / "in.csv")
    code, _, err = run_main(*_args(src, tmp_path / "out.csv", llama_dir, head_path, "--ray"))
    assert code == 2
    assert err.strip() == ("slmclassify: error: --ray does not apply a head yet; run without --ray, "
                           "or with --scorer zero-shot")
    assert not (tmp_path / "out.csv").exists()


def test_combined_with_other_labels_is_refused_before_any_output(run_main, tmp_path, llama_dir, heads):  # noqa: F811
    _, head_path, _ = heads
    src, _ = _input(tmp_path / "in.csv")
    code, _, err = run_main(*_args(src, tmp_path / "out.csv", llama_dir, head_path, "--scorer", "combined"))
    assert code == 2
    assert err.strip().splitlines()[-1] == (
        "slmclassify: error: --scorer combined needs the head's labels ['broken app', 'money'] to be the task's "
        "labels ['billing', 'technical']; use --scorer head")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv"]
