"""Whole-file scoring vs `classify_iter` windows, interleaved in one process by the timing harness
(`slmclassify.timing`: each round every way runs each workload, the order rotating), on two
workloads: the article's 600 tickets (335 distinct texts: windows score each distinct prompt once)
and 600 distinct article tickets (no duplicates: what the window itself costs). Embedded model.

usage: python benchmarks/window_throughput.py [ROUNDS]   -> a table, then one JSON line
"""
import sys

import numpy as np
import torch

from slmclassify import Classifier, EngineSettings, load_model
from slmclassify.backends.choice import cpu_name
from slmclassify.core.article_tickets import ARTICLE_TASK, article_tickets
from slmclassify.timing import Side, interleave, json_line

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
task = ARTICLE_TASK.with_overrides(mode="first")
distinct = list(dict.fromkeys(article_tickets(2400)))[:600]
workloads = {"article 600": article_tickets(600), "600 distinct": distinct}
ways = {"whole file": None, "window 1024 (default)": 1024, "window 128": 128}
loaded = load_model(None)
clf = Classifier(task, model=loaded)
clf.score(clf.encode(distinct[:8]))  # warm-up


def way(window):
    """One way on one workload: (scores [n, L], padding share, rows that reused an identical row's scores)."""

    def run(workload: str):
        texts = workloads[workload]
        if window is None:  # every row scored, no windows, no duplicate reuse
            clf.settings = EngineSettings()
            return clf.score(clf.encode(texts)), clf.stats.padding_share, 0
        clf.settings = EngineSettings(window=window)
        results = clf.classify(texts)
        scores = np.array([[x.scores[lab] for lab in task.labels] for x in results])
        return scores, clf.stats.padding_share, clf.stats.reused

    return run


timings = interleave([Side(name, way(window)) for name, window in ways.items()], units=list(workloads),
                     rounds=rounds, warmup=0)
cpu = cpu_name()
print(f"{cpu}, {torch.get_num_threads()} threads; {rounds} rounds interleaved; embedded SmolLM2-135M, first-token scoring")
print(f"{'workload':<13} {'way':<22} {'items/s':>8} {'vs whole':>9} {'pad%':>6} {'reused':>7} {'same':>8} {'max|Δ|':>8}")
rows = []
for j, (wname, texts) in enumerate(workloads.items()):
    reference = timings.last("whole file")[j][0]
    whole = timings.seconds["whole file"][:, j]
    for name in ways:
        scores, padding, reused = timings.last(name)[j]
        seconds = timings.seconds[name][:, j]  # [rounds] this workload's
        rate = len(texts) / float(np.median(seconds))
        ratio = float(np.median(whole / seconds))  # per round, side by side
        f = dict(padding=padding, reused=reused, max_dscore=float(np.abs(scores - reference).max()),
                 same_labels=int((scores.argmax(1) == reference.argmax(1)).sum()))
        rows.append(dict(workload=wname, way=name, items_per_s=round(rate, 2), vs_whole=round(ratio, 3), **f))
        print(f"{wname:<13} {name:<22} {rate:>8.2f} {ratio:>8.2f}x {100 * f['padding']:>5.1f} {f['reused']:>7} "
              f"{f['same_labels']:>4}/{len(texts)} {f['max_dscore']:>8.1e}")
print(json_line({"cpu": cpu, "threads": torch.get_num_threads(), "rounds": rounds, "rows": rows}))
