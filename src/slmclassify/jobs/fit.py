"""The `fit` job: labelled file → features on the fast path → head, with cross-validated figures
next to zero-shot scoring on the same items, and the learning curve (table and PNG)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
import numpy as np

from ..classifier import Classifier, EngineSettings
from ..core.metrics import Evaluation, read_labelled
from ..errors import InputError
from ..models.loading import load_model
from ..models.precision import auto_line
from ..core.results import softmax
from ..core.task import Task
from ..head.apply import text_hashes
from ..head.features import collect, default_taps
from ..head.fitting import CURVE_SIZES, cross_validated, fit, learning_curve
from ..head.model import Head, model_fingerprint, task_record


def _echo(message: str = "") -> None:
    click.echo(message)


def fit_file(path: str, output: str, task: Task, settings: EngineSettings, *, model=None, text_column="text",
             label_column="label", folds=5, taps: tuple[int, ...] | None = None, use_scores=False,
             curve_sizes=CURVE_SIZES, plot_path: str | None = None, json_path: str | None = None,
             seed: int = 0) -> Head:
    """Fit a head on a labelled file and save it; print CV metrics, zero-shot and the learning curve."""
    data = read_labelled(path, text_column, label_column)
    texts, gold = data.texts, [names[0] for names in data.gold]  # a head learns one label per item
    keep = [i for i, t in enumerate(texts) if t.strip()]
    if len(keep) < len(texts):
        _echo(f"skipping {len(texts) - len(keep)} empty texts")
    texts, gold = [texts[i] for i in keep], np.array([gold[i] for i in keep])
    labels = tuple(sorted(set(gold.tolist())))
    counts = {lab: int((gold == lab).sum()) for lab in labels}
    if len(labels) < 2:
        raise InputError(f"{path}: the gold column {label_column!r} has fewer than two labels: {list(labels)}")
    if min(counts.values()) < folds:
        raise InputError(f"{path}: label {min(counts, key=counts.get)!r} has {min(counts.values())} items; "
                         f"{folds}-fold cross-validation needs at least {folds} per label (or pass --folds)")

    loaded = load_model(model, settings.device, settings.precision, task=task, sample=texts, settings=settings)
    clf = Classifier(task, model=loaded, settings=settings)
    if line := auto_line(loaded):
        _echo(line)
    taps = taps or default_taps(loaded.model.config.num_hidden_layers)
    bad = [t for t in taps if not 1 <= t <= loaded.model.config.num_hidden_layers]
    if bad:
        raise InputError(f"--layers {bad} out of range: the model has layers 1..{loaded.model.config.num_hidden_layers}")
    start = time.perf_counter()
    scores, calibrated, states = collect(clf, clf.encode(texts), taps)
    seconds = time.perf_counter() - start
    _echo(f"model: {loaded.name}; {len(texts)} items, {len(labels)} labels {counts}")
    _echo(f"features: layers {list(taps)} at the last token ({states.shape[1]} values)"
          f"{' + calibrated label scores' if use_scores else ''}; one fast-path pass in {seconds:.1f} s")

    parts = [states.astype(np.float64)] + ([calibrated] if use_scores else [])
    X = np.concatenate(parts, axis=1)
    gold_idx = np.array([labels.index(g) for g in gold])
    probs = cross_validated(X, gold, labels, folds=folds, seed=seed)
    head_ev = Evaluation(labels, gold_idx, probs.argmax(1), probs.max(1), name="head")
    rows = [(f"head ({folds}-fold CV)", head_ev)]
    if set(labels) <= set(task.labels):
        zero = softmax(calibrated)
        task_idx = np.array([task.labels.index(g) for g in gold])
        rows.insert(0, ("zero-shot", Evaluation(task.labels, task_idx, zero.argmax(1), zero.max(1), name="zero-shot")))
    else:
        _echo("zero-shot: not comparable (the gold labels are not all in the task's label set)")
    _echo(f"\n{'scorer':<18} {'accuracy':>9} {'macro-F1':>9} {'ECE':>7}")
    for name, ev in rows:
        _echo(f"{name:<18} {ev.accuracy:>9.3f} {ev.macro_f1:>9.3f} {ev.ece:>7.3f}")

    curve = learning_curve(X, gold, labels, sizes=curve_sizes, folds=folds, seed=seed)
    zero_acc = rows[0][1].accuracy if rows[0][0] == "zero-shot" else None
    if curve:
        _echo(f"\nlearning curve ({folds}-fold CV, tested on every held-out item):")
        _echo(f"{'per label':>9} {'items':>6} {'accuracy':>9}")
        for n, acc in curve:
            _echo(f"{n:>9} {n * len(labels):>6} {acc:>9.3f}")
        plot_path = plot_path or str(Path(output).with_suffix("")) + "-curve.png"
        plot_curve(curve, head_ev.accuracy, zero_acc, len(gold) * (folds - 1) // folds // len(labels), plot_path)
        _echo(f"wrote {plot_path}")
    else:  # regression: an empty curve crashed matplotlib's log scale after the CV table, and no head was written
        smallest = min(counts.values()) * (folds - 1) // folds
        _echo(f"\nlearning curve: none (its smallest size, {min(curve_sizes)} per label, needs more than the "
              f"{smallest} per label a training fold holds here)")

    final = fit(X, gold, seed=seed, folds=folds)
    info = {"C": final.C, "items": int(len(gold)), "per_label": counts, "folds": folds, "source": str(path),
            "cv": {"accuracy": head_ev.accuracy, "macro_f1": head_ev.macro_f1, "ece": head_ev.ece},
            "zero_shot": ({"accuracy": rows[0][1].accuracy, "macro_f1": rows[0][1].macro_f1, "ece": rows[0][1].ece}
                          if zero_acc is not None else None),
            "curve": [[n, acc] for n, acc in curve], "item_hashes": text_hashes(texts)}
    head = Head(labels=final.labels, taps=tuple(taps), use_scores=use_scores, mean=final.mean, scale=final.scale,
                coef=final.coef, intercept=final.intercept, model=model_fingerprint(loaded), task=task_record(task),
                info=info)
    head.save(output)
    _echo(f"C = {final.C:g} (chosen by {folds}-fold CV on all items); wrote {output}")
    if json_path:
        Path(json_path).write_text(json.dumps({k: v for k, v in info.items() if k != "item_hashes"}, indent=2))
        _echo(f"wrote {json_path}")
    return head


def plot_curve(curve, full_accuracy: float, zero_shot: float | None, full_per_label: int, path: str) -> None:
    """Accuracy vs labelled items per label, with the full-data head and zero-shot as references."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([n for n, _ in curve], [a for _, a in curve], marker="o", label="head")
    ax.axhline(full_accuracy, color="green", linestyle=":", label=f"head, all items (~{full_per_label}/label)")
    if zero_shot is not None:
        ax.axhline(zero_shot, color="gray", linestyle="--", label="zero-shot")
    ax.set_xscale("log", base=2)
    ax.set_xticks([n for n, _ in curve], [str(n) for n, _ in curve])
    ax.set_xlabel("labelled items per label")
    ax.set_ylabel("accuracy (cross-validated)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("learning curve")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
