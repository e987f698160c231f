"""Whole-file scoring vs `classify_iter` windows, interleaved in one process, on two workloads:
the article's 600 tickets (335 distinct texts: windows score each distinct prompt once) and 600
distinct article tickets (no duplicates: what the window itself costs). Embedded model.

usage: python benchmarks/window_throughput.py [ROUNDS]   -> a table, then one JSON line
"""
import json, sys, time

import numpy as np
import torch

from slmclassify import Classifier, EngineSettings, load_model
from slmclassify.backends.choice import cpu_name
from slmclassify.core.article_tickets import ARTICLE_TASK, article_tickets
from slmclassify.core.results import RunStats

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
task = ARTICLE_TASK.with_overrides(mode="first")
distinct = list(dict.fromkeys(article_tickets(2400)))[:600]
workloads = {"article 600": article_tickets(600), "600 distinct": distinct}
ways = {"whole file": None, "window 1024 (default)": 1024, "window 128": 128}
loaded = load_model(None)
clf = Classifier(task, model=loaded)
clf.score(clf.encode(distinct[:8]))  # warm-up
totals = {(w, way): 0.0 for w in workloads for way in ways}
facts, reference = {}, {}
for r in range(rounds):
    for wname, texts in workloads.items():
        for way, window in ways.items():
            start = time.perf_counter()
            if window is None:  # every row scored, no windows, no duplicate reuse
                scored = clf.score(clf.encode(texts))
                scores, stats = scored.scores, scored.stats
            else:
                windows = list(clf.with_settings(EngineSettings(window=window)).classify_windows(texts))
                scores = np.concatenate([w.scores for w in windows])  # the raw scores, as the results hold them
                stats = RunStats()
                for w in windows:
                    stats.add(w.stats)
            totals[wname, way] += time.perf_counter() - start
            reference.setdefault(wname, scores)
            facts[wname, way] = dict(padding=stats.padding_share, reused=stats.reused,
                                     max_dscore=float(np.abs(scores - reference[wname]).max()),
                                     same_labels=int((scores.argmax(1) == reference[wname].argmax(1)).sum()))
            print(f"round {r + 1} {wname:<13} {way:<22} {time.perf_counter() - start:7.1f} s", file=sys.stderr, flush=True)
cpu = cpu_name()
print(f"{cpu}, {torch.get_num_threads()} threads; {rounds} rounds interleaved; embedded SmolLM2-135M, first-token scoring")
print(f"{'workload':<13} {'way':<22} {'items/s':>8} {'vs whole':>9} {'pad%':>6} {'reused':>7} {'same':>8} {'max|Δ|':>8}")
rows = []
for wname, texts in workloads.items():
    for way in ways:
        rate = rounds * len(texts) / totals[wname, way]
        ratio = totals[wname, "whole file"] / totals[wname, way]
        f = facts[wname, way]
        rows.append(dict(workload=wname, way=way, items_per_s=round(rate, 2), vs_whole=round(ratio, 3), **f))
        print(f"{wname:<13} {way:<22} {rate:>8.2f} {ratio:>8.2f}x {100 * f['padding']:>5.1f} {f['reused']:>7} "
              f"{f['same_labels']:>4}/{len(texts)} {f['max_dscore']:>8.1e}")
print(json.dumps({"cpu": cpu, "threads": torch.get_num_threads(), "rounds": rounds, "rows": rows}))
