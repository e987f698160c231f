"""The engine's two ways of attending to the cached prefix, A/B on the same batches in one process:
`inline` (rows wide enough get the prefix keys copied in, one causal kernel call) against `merged`
(two kernel calls per layer, merged by log-sum-exp; what every row did before). The choice is the
module constant `_INLINE_PREFIX_RATIO` (`core/engine/layout.py`), set per call; the batches are the default plan
over the article's tickets. Each batch is scored both ways in turn (order alternating), best of
ROUNDS per batch (`engine_ab`). With THREADS 1 the clock is the process's CPU time, which other
processes on a shared machine disturb far less than wall time; otherwise wall time.

usage: python benchmarks/prefix_attention_ab.py [N_TICKETS] [ROUNDS] [THREADS]  -> a table, then one JSON line
"""
import engine_ab
from slmclassify.core.engine import layout

n, rounds, threads = engine_ab.arguments((240, 3, 1))
ways = {"merged": float("inf"), "inline": layout._INLINE_PREFIX_RATIO}
clf, batches, timings, max_diff = engine_ab.run(ways, lambda value: setattr(layout, "_INLINE_PREFIX_RATIO", value),
                                                n, rounds, threads)
prefix = clf.prefix.length
inline = ("inline?", lambda sel: "yes" if batches[sel[0]].input_ids.shape[1] >= ways["inline"] * prefix else "no")
engine_ab.report(clf, batches, timings, max_diff, n, rounds, threads, column=inline, prefix=prefix)
