"""What the engine A/B benchmarks share (`prefix_attention_ab.py`, `causal_blocks_ab.py`): the
article's tickets in the batches `Classifier.score` runs, each batch scored both ways in turn
(order alternating), best of ROUNDS per batch. With THREADS 1 the clock is the process's CPU time,
which other processes on a shared machine disturb far less than wall time; otherwise wall time."""
import json
import sys
import time

import numpy as np
import torch

from slmclassify import Classifier, load_model
from slmclassify.core.article_tickets import ARTICLE_TASK, article_tickets


def arguments(defaults: tuple[int, int, int]) -> tuple[int, int, int]:
    """(N_TICKETS, ROUNDS, THREADS) from the command line, each defaulting to `defaults`."""
    given = [int(a) for a in sys.argv[1:4]]
    return tuple(given + list(defaults[len(given):]))


def run(ways: dict, choose, n: int, rounds: int, threads: int):
    """Score every batch both ways; `choose(value)` switches to a way's value of `ways` ({name: value},
    the new way last, left on at the end). Returns (classifier, batches, {name: [best s per batch]},
    max |Δ score| between the two ways)."""
    torch.set_num_threads(threads)
    clock = time.process_time if threads == 1 else time.perf_counter
    clf = Classifier(ARTICLE_TASK, model=load_model(None, "cpu", "fp32"))
    batches = list(clf.batches(clf.encode(article_tickets(600)[:n])))
    names = list(ways)
    best = {w: np.full(len(batches), np.inf) for w in names}
    max_diff = 0.0
    for r in range(rounds):
        for i, batch in enumerate(batches):
            scores = {}
            for way in (names if (i + r) % 2 == 0 else names[::-1]):
                choose(ways[way])
                start = clock()
                scores[way] = clf.engine.score(batch, clf.prefix, clf.trie)
                best[way][i] = min(best[way][i], clock() - start)
            max_diff = max(max_diff, float((scores[names[1]] - scores[names[0]]).abs().max()))
    choose(ways[names[1]])
    return clf, batches, best, max_diff


def report(clf, batches, best: dict, max_diff: float, n: int, rounds: int, threads: int, note: str = "",
           **figures) -> None:
    """Print the A/B by row width (the old way first in `best`, the new one second), then one JSON
    line with the totals, the speed-up of the new way and `figures`."""
    from slmclassify.backends.choice import cpu_name

    old, new = list(best)
    print(f"{cpu_name()}, {threads} thread(s), {'process CPU' if threads == 1 else 'wall'} time, best of {rounds}; "
          f"{n} article tickets, {len(batches)} batches, prefix {clf.prefix.length} tokens{note}")
    print(f"{'rows wide (S)':>14} {'batches':>8} {old + ' s':>12} {new + ' s':>12} {'speed-up':>9}")
    for lo, hi in ((0, 48), (48, 96), (96, 192), (192, 10**6)):
        sel = [i for i, b in enumerate(batches) if lo <= b.input_ids.shape[1] < hi]
        if sel:
            a, b = best[old][sel].sum(), best[new][sel].sum()
            print(f"{f'{lo}-{hi - 1}' if hi < 10**6 else f'{lo}+':>14} {len(sel):>8} {a:>12.2f} {b:>12.2f} {a / b:>8.3f}x")
    total = {w: float(best[w].sum()) for w in best}
    print(f"{'all':>14} {len(batches):>8} {total[old]:>12.2f} {total[new]:>12.2f} "
          f"{total[old] / total[new]:>8.3f}x   max |Δ score| {max_diff:.1e}")
    print(json.dumps({"cpu": cpu_name(), "threads": threads, "tickets": n, "rounds": rounds, **figures,
                      "seconds": {w: round(t, 3) for w, t in total.items()},
                      "speedup": round(total[old] / total[new], 4), "max_abs_diff": max_diff}))
