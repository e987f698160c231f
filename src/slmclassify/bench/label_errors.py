"""Can the head find label errors? `FLIP_SHARE` of the gold labels are moved at random to another
label (a seeded numpy Generator, seed printed); `label/suspects.py` ranks every item by the
out-of-fold probability of its (now noisy) label; of the top `FLIP_SHARE` of the items, the share
that are flipped (precision) and the share of the flips found (recall). A list drawn at random has
precision `FLIP_SHARE` (chance); with as many places as flips, recall equals precision.

    python -m slmclassify.bench.label_errors [--data intent_recognition.json] [--seeds 3]

The features are the labelling loop's (`head.features.loop_taps`: the mean-pooled states of the
layer at ⅘ of the depth) from one fast-path pass of the embedded model, as `label_sim` computes and
caches them. Nothing is tuned here: 5 folds, and the head's own C chosen by cross-validation inside
each training part. The original gold labels are taken as true, so a suspect that was not flipped
counts as a miss even where the gold label is itself wrong. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

import numpy as np

from ..label.suspects import suspects
from ..timing import json_line

DEFAULT_DATA = "/work/shared/data/intent_recognition.json"
"""BIG-bench's intent_recognition task (693 utterances, 7 labels) where the project's machines keep
it; pass `--data` elsewhere."""
FLIP_SHARE = 0.1
"""The share of items whose label is flipped, and the share of items listed as suspects."""
FOLDS = 5


def flip(gold: np.ndarray, n_labels: int, share: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(gold with round(share · m) items, drawn without replacement, moved to another label drawn
    uniformly; those items)."""
    items = rng.choice(len(gold), int(round(share * len(gold))), replace=False)
    noisy = gold.copy()
    noisy[items] = (gold[items] + rng.integers(1, n_labels, len(items))) % n_labels
    return noisy, items


def run_seed(X: np.ndarray, gold: np.ndarray, n_labels: int, seed: int) -> dict:
    """One seed: flip, rank, and score the top `FLIP_SHARE` of the items against the flips."""
    noisy, items = flip(gold, n_labels, FLIP_SHARE, np.random.default_rng(seed))
    top = int(round(FLIP_SHARE * len(gold)))
    began = time.perf_counter()
    found = suspects(X, noisy, n_labels, n=top, folds=FOLDS, seed=seed)
    seconds = time.perf_counter() - began
    hits = len({s.index for s in found} & set(items.tolist()))
    return {"seed": seed, "flipped": len(items), "listed": len(found), "hits": hits,
            "precision": hits / len(found), "recall": hits / len(items), "seconds": seconds}


def cpu_model() -> str:
    """lscpu's 'Model name' line ('' where lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:
        return ""
    return next((line.strip() for line in out.splitlines() if line.startswith("Model name")), "")


def main() -> None:
    from ..io.labelled import read_labelled
    from ..head.model import model_fingerprint
    from ..jobs.evaluate import task_for_file
    from ..models.loading import set_threads
    from ..models.prepare import load_model
    from .label_sim import features

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--data", default=DEFAULT_DATA, help="a BIG-bench-style task JSON (default: %(default)s)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0 .. seeds-1 (default: %(default)s)")
    args = parser.parse_args()

    began = time.perf_counter()
    print(cpu_model())
    threads = set_threads()
    loaded = load_model(None)
    data = read_labelled(args.data, "text", "label")
    task = task_for_file(args.data, "text", "label")
    gold = np.array([task.labels.index(g[0]) for g in data.gold])
    name = Path(args.data).stem
    _, X, _ = features(name, data.texts, task, loaded, model_fingerprint(loaded))
    ok = ~np.isnan(X).any(axis=1)  # empty items have no states
    X, gold = X[ok].astype(np.float64), gold[ok]
    L = len(task.labels)
    features_s = time.perf_counter() - began
    print(f"{name}: {len(gold)} items, {L} labels, features [{X.shape[0]}, {X.shape[1]}] ready in {features_s:.0f} s "
          f"({threads} threads)")

    runs = []
    for seed in range(args.seeds):
        print(f"seed {seed}: flipping {FLIP_SHARE:.0%} of the labels (numpy default_rng({seed}))")
        runs.append(run_seed(X, gold, L, seed))
    top = runs[0]["listed"]
    print(f"\nflipped labels among the top {FLIP_SHARE:.0%} suspects ({top} of {len(gold)} items; "
          f"chance {FLIP_SHARE:.0%}), {FOLDS} folds")
    print(f"{'seed':>4} {'flipped':>7} {'found':>5} {'precision':>9} {'recall':>6} {'seconds':>7}")
    for r in runs:
        print(f"{r['seed']:>4} {r['flipped']:>7} {r['hits']:>5} {r['precision']:>9.3f} {r['recall']:>6.3f} "
              f"{r['seconds']:>7.1f}")
    precision = [r["precision"] for r in runs]
    recall = [r["recall"] for r in runs]
    print(f"{'mean':>4} {'':>7} {'':>5} {np.mean(precision):>9.3f} {np.mean(recall):>6.3f}")
    print(json_line({"bench": "label_errors", "data": name, "items": len(gold), "labels": L, "width": X.shape[1],
                     "flip_share": FLIP_SHARE, "folds": FOLDS, "chance": FLIP_SHARE, "cpu": cpu_model().partition(":")[2].strip(),
                     "threads": threads, "features_s": features_s, "runs": runs,
                     "precision_mean": float(np.mean(precision)), "recall_mean": float(np.mean(recall)),
                     "total_s": time.perf_counter() - began}))


if __name__ == "__main__":
    main()
