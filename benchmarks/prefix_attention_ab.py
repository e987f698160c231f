"""The engine's two ways of attending to the cached prefix, A/B on the same batches in one process:
`inline` (rows wide enough get the prefix keys copied in, one causal kernel call) against `merged`
(two kernel calls per layer, merged by log-sum-exp; what every row did before). The choice is the
module constant `engine._INLINE_PREFIX_RATIO`, set per call; the batches are the default plan
over the article's tickets. Each batch is scored both ways in turn (order alternating), best of
ROUNDS per batch. With THREADS 1 the clock is the process's CPU time, which other processes on a
shared machine disturb far less than wall time; otherwise wall time.

usage: python benchmarks/prefix_attention_ab.py [N_TICKETS] [ROUNDS] [THREADS]  -> a table, then one JSON line
"""
import json

import engine_ab
from slmclassify.core import engine
from slmclassify.backends.choice import cpu_name

n, rounds, threads = engine_ab.arguments((240, 3, 1))
ways = {"merged": float("inf"), "inline": engine._INLINE_PREFIX_RATIO}
clf, batches, best, max_diff = engine_ab.run(ways, lambda value: setattr(engine, "_INLINE_PREFIX_RATIO", value),
                                             n, rounds, threads)
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
