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
import engine_ab
from slmclassify.backends import fp32_kernels

n, rounds, threads = engine_ab.arguments((600, 1, 2))
ways = {"torch": False, "C kernel": True}
clf, batches, timings, max_diff = engine_ab.run(ways, lambda value: setattr(fp32_kernels, "ENABLED", value),
                                                n, rounds, threads)
engine_ab.report(clf, batches, timings, max_diff, n, rounds, threads)
