"""The engine's two ways of attending to the cached prefix, A/B on the same batches in one process:
`inline` (rows wide enough get the prefix keys copied in, one causal kernel call) against `merged`
(two kernel calls per layer, merged by log-sum-exp; what every row did before). The choice is the
module constant `engine._INLINE_PREFIX_RATIO`, set per call; the batches are the default plan
over the article's tickets. Each batch is scored both ways in turn (order alternating), best of
ROUNDS per batch. With THREADS 1 the clock is the process's CPU time, which other processes on a
shared machine disturb far less than wall time; otherwise wall time.

usage: python benchmarks/prefix_attention_ab.py [N_TICKETS] [ROUNDS] [THREADS]  -> a table, then one JSON line
"""
import json, sys, time

import numpy as np
import torch

from slmclassify import Classifier, engine, load_model
from slmclassify.backends.choice import cpu_name
from slmclassify.workload import ARTICLE_TASK, article_tickets

n, rounds, threads = (int(a) for a in (sys.argv[1:] + ["240", "3", "1"][len(sys.argv) - 1 :])[:3])
torch.set_num_threads(threads)
clock = time.process_time if threads == 1 else time.perf_counter
loaded = load_model(None, "cpu", "fp32")
clf = Classifier(ARTICLE_TASK, model=loaded)
encoded = clf.encode(article_tickets(600)[:n])
batches = list(clf.batches(encoded))  # the batches `Classifier.score` runs
ways = {"merged": float("inf"), "inline": engine._INLINE_PREFIX_RATIO}
best = {w: np.full(len(batches), np.inf) for w in ways}
max_diff = 0.0
for r in range(rounds):
    for i, batch in enumerate(batches):
        scores = {}
        for way in (list(ways) if (i + r) % 2 == 0 else list(ways)[::-1]):
            engine._INLINE_PREFIX_RATIO = ways[way]
            start = clock()
            scores[way] = clf.engine.score(batch, clf.prefix, clf.trie)
            best[way][i] = min(best[way][i], clock() - start)
        max_diff = max(max_diff, float((scores["inline"] - scores["merged"]).abs().max()))
engine._INLINE_PREFIX_RATIO = ways["inline"]
prefix = clf.prefix.length
print(f"{cpu_name()}, {threads} thread(s), {'process CPU' if threads == 1 else 'wall'} time, best of {rounds}; "
      f"{n} article tickets, {len(batches)} batches, prefix {prefix} tokens")
print(f"{'rows wide (S)':>14} {'batches':>8} {'inline?':>8} {'merged s':>9} {'inline s':>9} {'speed-up':>9}")
groups = [(lo, hi) for lo, hi in ((0, 48), (48, 96), (96, 192), (192, 10**6))]
for lo, hi in groups:
    sel = [i for i, b in enumerate(batches) if lo <= b.input_ids.shape[1] < hi]
    if sel:
        m, s = best["merged"][sel].sum(), best["inline"][sel].sum()
        on = batches[sel[0]].input_ids.shape[1] >= ways["inline"] * prefix
        print(f"{f'{lo}-{hi - 1}' if hi < 10**6 else f'{lo}+':>14} {len(sel):>8} {'yes' if on else 'no':>8} "
              f"{m:>9.2f} {s:>9.2f} {m / s:>8.3f}x")
total = {w: float(best[w].sum()) for w in ways}
print(f"{'all':>14} {len(batches):>8} {'':>8} {total['merged']:>9.2f} {total['inline']:>9.2f} "
      f"{total['merged'] / total['inline']:>8.3f}x   max |Δ score| {max_diff:.1e}")
print(json.dumps({"cpu": cpu_name(), "threads": threads, "tickets": n, "rounds": rounds, "prefix": prefix,
                  "merged_s": round(total["merged"], 3), "inline_s": round(total["inline"], 3),
                  "speedup": round(total["merged"] / total["inline"], 4), "max_abs_diff": max_diff}))
