"""What the engine A/B benchmarks share (`prefix_attention_ab.py`, `causal_blocks_ab.py`,
`packed_attention_ab.py`): the article's tickets in the batches `Classifier.score` runs, each batch
scored both ways in turn by the timing harness (`slmclassify.timing`: order alternating per batch
and round, after one untimed call each), best of ROUNDS per batch. With THREADS 1 the clock is the
process's CPU time, which other processes on a shared machine disturb far less than wall time;
otherwise wall time."""
import sys
import time

import numpy as np
import torch

from slmclassify import Classifier, load_model
from slmclassify.core.article_tickets import ARTICLE_TASK, article_tickets
from slmclassify.timing import Side, Timings, interleave, json_line, render_table

WIDTHS = ((0, 48), (48, 96), (96, 192), (192, 10**6))
"""The table's groups of batches by row width S (tokens per row)."""


def arguments(defaults: tuple[int, int, int]) -> tuple[int, int, int]:
    """(N_TICKETS, ROUNDS, THREADS) from the command line, each defaulting to `defaults`."""
    given = [int(a) for a in sys.argv[1:4]]
    return tuple(given + list(defaults[len(given):]))


def run(ways: dict, choose, n: int, rounds: int, threads: int):
    """Score every batch both ways; `choose(value)` switches to a way's value of `ways` ({name: value},
    the new way last, left on at the end). Returns (classifier, batches, the harness's timings,
    max |Δ score| between the two ways)."""
    torch.set_num_threads(threads)
    clf = Classifier(ARTICLE_TASK, model=load_model(None, "cpu", "fp32"))
    batches = list(clf.batches(clf.encode(article_tickets(600)[:n])))
    old, new = ways
    timings = interleave([Side(way, lambda batch: clf.engine.score(batch, clf.prefix, clf.trie),
                               lambda value=value: choose(value)) for way, value in ways.items()],
                         units=batches, rounds=rounds, clock=time.process_time if threads == 1 else time.perf_counter)
    max_diff = max(float((a - b).abs().max()) for got_old, got_new in zip(timings.values[old], timings.values[new])
                   for a, b in zip(got_old, got_new))
    choose(ways[new])
    return clf, batches, timings, max_diff


def report(clf, batches, timings: Timings, max_diff: float, n: int, rounds: int, threads: int, note: str = "",
           column: tuple[str, object] | None = None, **figures) -> None:
    """Print the A/B by row width (the old way first in `timings`, the new one second; each batch's
    best round), the harness's table of whole rounds, then one JSON line with the totals, the
    speed-up of the new way and `figures`. `column`: (title, f(batch indices) -> str), an extra
    column per group of widths."""
    from slmclassify.backends.choice import cpu_name

    old, new = timings.names
    best = {way: timings.best_per_unit(way) for way in timings.names}
    print(f"{cpu_name()}, {threads} thread(s), {'process CPU' if threads == 1 else 'wall'} time, best of {rounds}; "
          f"{n} article tickets, {len(batches)} batches, prefix {clf.prefix.length} tokens{note}")
    extra = f" {column[0]:>8}" if column else ""
    print(f"{'rows wide (S)':>14} {'batches':>8}{extra} {old + ' s':>12} {new + ' s':>12} {'speed-up':>9}")
    for lo, hi in WIDTHS:
        sel = [i for i, b in enumerate(batches) if lo <= b.input_ids.shape[1] < hi]
        if sel:
            a, b = best[old][sel].sum(), best[new][sel].sum()
            cell = f" {column[1](sel):>8}" if column else ""
            print(f"{f'{lo}-{hi - 1}' if hi < 10**6 else f'{lo}+':>14} {len(sel):>8}{cell} {a:>12.2f} {b:>12.2f} "
                  f"{a / b:>8.3f}x")
    total = {way: float(best[way].sum()) for way in best}
    print(f"{'all':>14} {len(batches):>8}{' ' * len(extra)} {total[old]:>12.2f} {total[new]:>12.2f} "
          f"{total[old] / total[new]:>8.3f}x   max |Δ score| {max_diff:.1e}")
    print(render_table(timings, baseline=old))
    print(json_line({"cpu": cpu_name(), "threads": threads, "tickets": n, "rounds": rounds, **figures,
                     "seconds": {w: round(t, 3) for w, t in total.items()},
                     "speedup": round(total[old] / total[new], 4), "max_abs_diff": max_diff,
                     "per_round": timings.summary(old)}))
