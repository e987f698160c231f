"""Causal row attention in query blocks (`attention.CAUSAL_BLOCK`) against one kernel call per
layer, A/B on the same batches in one process. The choice is the module constant, set per call
(a block larger than any row = one call, what every row did before); the batches are the default
plan over the article's tickets. Each batch is scored both ways in turn (order alternating), best
of ROUNDS per batch. With THREADS 1 the clock is the process's CPU time, which other processes on
a shared machine disturb far less than wall time; otherwise wall time.

usage: python benchmarks/causal_blocks_ab.py [N_TICKETS] [ROUNDS] [THREADS]  -> a table, then one JSON line
"""
import engine_ab
from slmclassify.backends import attention, fp32_kernels

n, rounds, threads = engine_ab.arguments((600, 1, 1))
fp32_kernels.ENABLED = False  # the torch attention path (the C kernel, where it runs, has no query blocks)
ways = {"one call": 10**9, "blocks": attention.CAUSAL_BLOCK}
clf, batches, timings, max_diff = engine_ab.run(ways, lambda value: setattr(attention, "CAUSAL_BLOCK", value),
                                                n, rounds, threads)
engine_ab.report(clf, batches, timings, max_diff, n, rounds, threads, f", blocks of {ways['blocks']}",
                 block=ways["blocks"])
