"""Accuracy of each precision against float32 on labelled data, in one process: the demo tickets
(`examples/tickets.csv`, gold column `gold`, task `examples/support.toml`) and the BIG-bench intent
data set (BIG-bench's `intent_recognition.json`, not part of this repository: pass its path with
`--intent`), scored in fp32 and in each precision asked for, with the library's own calibration.

Per data set it prints each precision's accuracy (as `slmclassify evaluate` counts it: tied BIG-bench
gold labels all count), its agreement with fp32 (items whose calibrated prediction is fp32's) and
the largest |Δ probability| of any label, then one JSON line last. Each precision is a model of its
own, `load_model(precision=...)`, loaded after the previous one is dropped.

usage: python benchmarks/precision_accuracy.py [--precisions int8,bf16] [--n N] [--sets demo,intent]
                                              [--intent PATH/intent_recognition.json]
"""
from __future__ import annotations

import argparse
import platform

import numpy as np
import torch

from slmclassify import Classifier, load_model
from slmclassify.backends.choice import cpu_name
from slmclassify.backends.device import matmul_flags
from slmclassify.backends import smoothing
from slmclassify.core.metrics import Evaluation, gold_indices
from slmclassify.io.labelled import read_labelled
from slmclassify.jobs.evaluate import task_for_file
from slmclassify.models.loading import set_threads
from slmclassify.models.precision import agreement
from slmclassify.core.results import softmax
from slmclassify.timing import Stopwatch, json_line

SETS = {  # name: (path, text column, label column, task file)
    "demo": ("examples/tickets.csv", "text", "gold", "examples/support.toml"),
    "intent": (None, "text", "label", None),  # the path comes from --intent
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precisions", default="int8,bf16", help="comma-separated, compared with fp32")
    parser.add_argument("--n", "--limit", dest="limit", type=int, default=None, help="the first N items of each data set")
    parser.add_argument("--sets", default=None,
                        help=f"comma-separated of {', '.join(SETS)} (default: demo, and intent when --intent is given)")
    parser.add_argument("--intent", default=None, help="path of the intent data set (BIG-bench JSON); needed for intent")
    parser.add_argument("--model", default=None, help="model source (default: the embedded model)")
    args = parser.parse_args()
    precisions = ["fp32"] + [p for p in args.precisions.split(",") if p and p != "fp32"]
    names = args.sets.split(",") if args.sets else ["demo"] + (["intent"] if args.intent else [])
    if "intent" in names and not args.intent:
        parser.error("the intent set needs --intent PATH (BIG-bench intent_recognition.json)")
    sets = {name: SETS[name] for name in names}
    if "intent" in sets:
        sets["intent"] = (args.intent, *sets["intent"][1:])
    threads = set_threads()
    print(f"machine: {cpu_name()}, {threads} threads, flags {' '.join(matmul_flags()) or '-'}; "
          f"torch {torch.__version__}, Python {platform.python_version()}")

    data, tasks, gold = {}, {}, {}
    for name, (path, text, label, task_file) in sets.items():
        data[name] = read_labelled(path, text, label).head(args.limit)
        tasks[name] = task_for_file(path, text, label, task_file=task_file, limit=args.limit)
        gold[name] = gold_indices(data[name], tasks[name].labels)

    scores: dict[tuple[str, str], np.ndarray] = {}  # (set, precision) → [n, L] calibrated scores
    seconds: dict[tuple[str, str], float] = {}
    engines = {}
    for precision in precisions:
        loaded = load_model(args.model, device="cpu", precision=precision)
        for name in sets:
            clf = Classifier(tasks[name], model=loaded)
            engines[precision] = clf.engine.backend.describe()
            with Stopwatch() as watch:  # one pass each: the precisions are loaded one at a time
                raw = clf.score(clf.encode(data[name].texts)).scores
            seconds[name, precision] = watch.seconds
            scores[name, precision] = clf.calibrated(raw)
        del loaded, clf
    print(f"engines: {'; '.join(f'{p}: {e}' for p, e in engines.items())}; int8 smoothing alpha "
          f"{smoothing.ALPHA}, outlier ratio {smoothing.OUTLIER_RATIO}")

    rows = []
    print(f"{'data set':<10} {'items':>5} {'precision':<9} {'accuracy':>8} {'agree':>11} {'max|Δp|':>8} {'items/s':>8}")
    for name in sets:
        gold_index, accepted = gold[name]
        fp32 = scores[name, "fp32"]
        for precision in precisions:
            calibrated = scores[name, precision]
            probs = softmax(calibrated)
            ev = Evaluation(tasks[name].labels, gold_index, probs.argmax(1), probs.max(1), accepted=accepted)
            agree = agreement(calibrated, fp32)
            rate = len(calibrated) / seconds[name, precision]
            rows.append({"set": name, "items": len(calibrated), "precision": precision, "accuracy": ev.accuracy,
                         "agree": agree.agree, "n": agree.n, "max_prob_diff": agree.max_prob_diff,
                         "items_per_s": rate})
            print(f"{name:<10} {len(calibrated):>5} {precision:<9} {ev.accuracy:>8.3f} "
                  f"{f'{agree.agree}/{agree.n}':>11} {agree.max_prob_diff:>8.3f} {rate:>8.1f}")
    print("(items/s: one pass each, not interleaved; on a shared machine only the accuracy columns are firm)")
    print(json_line({"machine": cpu_name(), "flags": matmul_flags(), "threads": threads, "torch": torch.__version__,
                      "engines": engines, "alpha": smoothing.ALPHA, "outlier_ratio": smoothing.OUTLIER_RATIO,
                      "rows": rows}))


if __name__ == "__main__":
    main()
