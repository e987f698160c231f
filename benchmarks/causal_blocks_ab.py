"""Causal row attention in query blocks (`attention.CAUSAL_BLOCK`) against one kernel call per
layer, A/B on the same batches in one process. The choice is the module constant, set per call
(a block larger than any row = one call, what every row did before); the batches are the default
plan over the article's tickets. Each batch is scored both ways in turn (order alternating), best
of ROUNDS per batch. With THREADS 1 the clock is the process's CPU time, which other processes on
a shared machine disturb far less than wall time; otherwise wall time.

usage: python benchmarks/causal_blocks_ab.py [N_TICKETS] [ROUNDS] [THREADS]  -> a table, then one JSON line
"""
import json

import engine_ab
from slmclassify.backends import attention
from slmclassify.backends.choice import cpu_name

n, rounds, threads = engine_ab.arguments((600, 1, 1))
ways = {"one call": 10**9, "blocks": attention.CAUSAL_BLOCK}
clf, batches, best, max_diff = engine_ab.run(ways, lambda value: setattr(attention, "CAUSAL_BLOCK", value),
                                             n, rounds, threads)
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
