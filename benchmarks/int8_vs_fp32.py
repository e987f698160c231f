"""Ours in int8 against ours in float32 (the exact path), the bench's g row alone and repeated: the
same batches of N article tickets, each scored by both engines in turn (`bench.on_batches.against_base`,
the order rotating), ROUNDS times; then the two engines' predictions on all N compared. What
`slmclassify bench` reports as `int8 × d`, without the other rows, so that a kernel change can be
measured in a minute and on more items than the bench's 100. Prints the engine line, one ratio per
round, their median, and the agreement (items with the same top label, max |Δ log-prob|).

usage: python benchmarks/int8_vs_fp32.py [N_TICKETS] [ROUNDS] [THREADS]
(under an instruction-set cap, e.g. as an AVX2 CPU: `ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2
MKL_ENABLE_INSTRUCTIONS=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 python benchmarks/int8_vs_fp32.py`)
"""
import sys

import numpy as np
import torch

from slmclassify import Classifier, load_model
from slmclassify.bench.on_batches import against_base
from slmclassify.core.article_tickets import ARTICLE_TASK, article_tickets

args = [int(a) for a in sys.argv[1:]]
n, rounds, threads = args + [100, 3, 2][len(args):]
torch.set_num_threads(threads)
fp32 = Classifier(ARTICLE_TASK, model=load_model(None, "cpu", "fp32"))
int8 = Classifier(ARTICLE_TASK, model=load_model(None, "cpu", "int8"))
print(f"engine: {int8.loaded.backend.describe()}")
items = fp32.encode(article_tickets(n))
ratios = []
for r in range(rounds):
    ratio, scores = against_base(fp32, {"int8": lambda batch: int8.score(batch).scores}, items, torch.device("cpu"))
    ratios.append(ratio["int8"])
    print(f"round {r + 1}: int8 {ratio['int8']:.3f}x fp32", flush=True)
exact = fp32.score(items).scores
same = int((exact.argmax(1) == scores["int8"].argmax(1)).sum())
print(f"median {np.median(ratios):.3f}x over {rounds} rounds; agreement {same}/{n}, "
      f"max |d log-prob| {np.abs(exact - scores['int8']).max():.2f}")
