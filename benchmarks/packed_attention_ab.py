"""The float32 C kernels (`backends/fp32_kernels.py`: attention on the packed rows, prefix, causal row
and trie mask in one pass; RMSNorm and SwiGLU in one pass each) against the torch path (padded layout,
PyTorch's flash kernel in causal blocks, the prefix apart and merged by log-sum-exp; eager norms and
SiLU), A/B on the same batches in one process, float32. The choice
is `fp32_kernels.ENABLED`, set per call; the batches are the default plan over the article's tickets.
Each batch is scored both ways in turn (order alternating), best of ROUNDS per batch. With THREADS 1
the clock is the process's CPU time, which other processes on a shared machine disturb far less than
wall time; otherwise wall time.

usage: python benchmarks/packed_attention_ab.py [N_TICKETS] [ROUNDS] [THREADS]  -> a table, then one JSON line
"""
import json

import engine_ab
from slmclassify.backends import fp32_kernels
from slmclassify.backends.choice import cpu_name

n, rounds, threads = engine_ab.arguments((600, 1, 2))
ways = {"torch": False, "C kernel": True}
clf, batches, best, max_diff = engine_ab.run(ways, lambda value: setattr(fp32_kernels, "ENABLED", value),
                                             n, rounds, threads)
print(f"{cpu_name()}, {threads} thread(s), {'process CPU' if threads == 1 else 'wall'} time, best of {rounds}; "
      f"{n} article tickets, {len(batches)} batches, prefix {clf.prefix.length} tokens")
print(f"{'rows wide (S)':>14} {'batches':>8} {'torch s':>9} {'C s':>9} {'speed-up':>9}")
for lo, hi in ((0, 48), (48, 96), (96, 192), (192, 10**6)):
    sel = [i for i, b in enumerate(batches) if lo <= b.input_ids.shape[1] < hi]
    if sel:
        old, new = best["torch"][sel].sum(), best["C kernel"][sel].sum()
        print(f"{f'{lo}-{hi - 1}' if hi < 10**6 else f'{lo}+':>14} {len(sel):>8} {old:>9.2f} {new:>9.2f} {old / new:>8.3f}x")
total = {w: float(best[w].sum()) for w in ways}
print(f"{'all':>14} {len(batches):>8} {total['torch']:>9.2f} {total['C kernel']:>9.2f} "
      f"{total['torch'] / total['C kernel']:>8.3f}x   max |Δ score| {max_diff:.1e}")
print(json.dumps({"cpu": cpu_name(), "threads": threads, "tickets": n, "rounds": rounds,
                  "torch_s": round(total["torch"], 3), "c_kernel_s": round(total["C kernel"], 3),
                  "speedup": round(total["torch"] / total["C kernel"], 4), "max_abs_diff": max_diff}))
