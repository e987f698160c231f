"""Causal row attention in query blocks (`attention.CAUSAL_BLOCK`) against one kernel call per
layer, A/B on the same batches in one process. The choice is the module constant, set per call
(a block larger than any row = one call, what every row did before); the batches are the default
plan over the article's tickets. Each batch is scored both ways in turn (order alternating), best
of ROUNDS per batch. With THREADS 1 the clock is the process's CPU time, which other processes on
a shared machine disturb far less than wall time; otherwise wall time.

usage: python benchmarks/causal_blocks_ab.py [N_TICKETS] [ROUNDS] [THREADS]  -> a table, then one JSON line
"""
import json, sys, time

import numpy as np
import torch

from slmclassify import Classifier, load_model
from slmclassify.backends import attention
from slmclassify.backends.choice import cpu_name
from slmclassify.workload import ARTICLE_TASK, article_tickets

n, rounds, threads = (int(a) for a in (sys.argv[1:] + ["600", "1", "1"][len(sys.argv) - 1 :])[:3])
torch.set_num_threads(threads)
clock = time.process_time if threads == 1 else time.perf_counter
loaded = load_model(None, "cpu", "fp32")
clf = Classifier(ARTICLE_TASK, model=loaded)
encoded = clf.encode(article_tickets(600)[:n])
batches = list(clf.batches(encoded))  # the batches `Classifier.score` runs
ways = {"one call": 10**9, "blocks": attention.CAUSAL_BLOCK}
best = {w: np.full(len(batches), np.inf) for w in ways}
max_diff = 0.0
for r in range(rounds):
    for i, batch in enumerate(batches):
        scores = {}
        for way in (list(ways) if (i + r) % 2 == 0 else list(ways)[::-1]):
            attention.CAUSAL_BLOCK = ways[way]
            start = clock()
            scores[way] = clf.engine.score(batch, clf.prefix, clf.trie)
            best[way][i] = min(best[way][i], clock() - start)
        max_diff = max(max_diff, float((scores["blocks"] - scores["one call"]).abs().max()))
attention.CAUSAL_BLOCK = ways["blocks"]
print(f"{cpu_name()}, {threads} thread(s), {'process CPU' if threads == 1 else 'wall'} time, best of {rounds}; "
      f"{n} article tickets, {len(batches)} batches, prefix {clf.prefix.length} tokens, blocks of {ways['blocks']}")
print(f"{'rows wide (S)':>14} {'batches':>8} {'one call s':>11} {'blocks s':>9} {'speed-up':>9}")
for lo, hi in ((0, 48), (48, 96), (96, 192), (192, 10**6)):
    sel = [i for i, b in enumerate(batches) if lo <= b.input_ids.shape[1] < hi]
    if sel:
        one, blk = best["one call"][sel].sum(), best["blocks"][sel].sum()
        print(f"{f'{lo}-{hi - 1}' if hi < 10**6 else f'{lo}+':>14} {len(sel):>8} {one:>11.2f} {blk:>9.2f} {one / blk:>8.3f}x")
total = {w: float(best[w].sum()) for w in ways}
print(f"{'all':>14} {len(batches):>8} {total['one call']:>11.2f} {total['blocks']:>9.2f} "
      f"{total['one call'] / total['blocks']:>8.3f}x   max |Δ score| {max_diff:.1e}")
print(json.dumps({"cpu": cpu_name(), "threads": threads, "tickets": n, "rounds": rounds, "block": ways["blocks"],
                  "one_call_s": round(total["one call"], 3), "blocks_s": round(total["blocks"], 3),
                  "speedup": round(total["one call"] / total["blocks"], 4), "max_abs_diff": max_diff}))
