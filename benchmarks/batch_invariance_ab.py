"""The cost of batch invariance: the engine with its small GEMM calls padded to the rows from which
the kernel is batch-invariant (`gemm.PaddedRows`, the output layer alike) against the same kernel
unpadded, on the batches `Classifier.score` runs for N article tickets, each batch scored both ways
in turn (`engine_ab.py`); and whether each way gives every ticket the bits it gets scored alone.

usage: python benchmarks/batch_invariance_ab.py [N_TICKETS] [ROUNDS] [THREADS] [KERNEL]   (KERNEL: mm, the
       float32 kernel that needs padding on the machines measured; default 100 5 2 mm)
"""
import dataclasses
import sys
import time

import numpy as np
import torch

from engine_ab import report
from slmclassify import Classifier, EngineSettings, load_model
from slmclassify.core.article_tickets import ARTICLE_TASK, article_tickets
from slmclassify.models.engines import with_backend
from slmclassify.timing import Side, interleave


def main() -> None:
    n, rounds, threads = (int(a) for a in (sys.argv[1:4] + ["100", "5", "2"][len(sys.argv[1:4]):]))
    kernel = sys.argv[4] if len(sys.argv) > 4 else "mm"
    torch.set_num_threads(threads)
    loaded = load_model(None, "cpu", "fp32")
    padded_backend = dataclasses.replace(loaded.backend, gemm=kernel)
    ways = {"unpadded": with_backend(loaded, dataclasses.replace(padded_backend, invariant=())),
            "padded": with_backend(loaded, padded_backend)}
    texts = article_tickets(600)[:n]
    clfs = {way: Classifier(ARTICLE_TASK, model=model) for way, model in ways.items()}
    batches = list(clfs["padded"].batches(clfs["padded"].encode(texts)))
    timings = interleave([Side(way, lambda batch, c=clf: c.engine.score(batch, c.prefix, c.trie))
                          for way, clf in clfs.items()], units=batches, rounds=rounds,
                         clock=time.process_time if threads == 1 else time.perf_counter)
    alone = {}
    for way, clf in clfs.items():  # each ticket alone (a batch of one) against its score in the run's batches
        one = clf.with_settings(EngineSettings(max_rows=1, token_budget=clf.settings.token_budget))
        encoded = clf.encode(texts)
        alone[way] = int((one.score(encoded).scores == clf.score(encoded).scores).all(axis=1).sum())
    max_diff = max(float((a - b).abs().max()) for got_a, got_b in zip(timings.values["unpadded"], timings.values["padded"])
                   for a, b in zip(got_a, got_b))
    report(clfs["padded"], batches, timings, max_diff, n, rounds, threads,
           note=f"; kernel {kernel}, padded to {padded_backend.invariant_rows(kernel)} rows, output layer to "
                f"{padded_backend.invariant_rows('lm_head')}; tickets with the same bits alone as in the run's batches: "
                + ", ".join(f"{way} {k}/{n}" for way, k in alone.items()),
           **{f"same_bits_alone_{way}": k for way, k in alone.items()})


if __name__ == "__main__":
    main()
