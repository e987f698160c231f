"""Rows (a) and (d) of `slmclassify bench` alone: the article's per-item loop advanced by the exact
path's progress, as the bench interleaves them, repeated; the other rows are not run.

    .venv/bin/python benchmarks/loop_vs_exact.py MODEL [REPEATS]   # MODEL: folder, GGUF or hub id

Prints each repeat's seconds and d x a on the article's first 100 tickets (docs/models.md,
*Speed at real shapes*).
"""

from __future__ import annotations

import sys

from slmclassify.bench import compare
from slmclassify.bench.article import article_loop
from slmclassify.classifier import Classifier
from slmclassify.core.article_tickets import ARTICLE_TASK, article_tickets
from slmclassify.models.prepare import load_model
from slmclassify.timing import Stopwatch


def main(model: str, repeats: int) -> None:
    loaded = load_model(model, "cpu", "fp32")
    texts = article_tickets(100)
    report = compare.BenchReport(machine=compare.machine_info())
    inputs = compare._prepare(loaded, texts, ARTICLE_TASK, compare.bench_settings(), report, print)
    article_loop(inputs.hf, inputs.prompts[:4], ARTICLE_TASK.labels)  # warm-up of both paths
    inputs.probe.score(inputs.probe.encode(texts[:4]))
    for _ in range(repeats):
        article = compare._ArticleAlongside(inputs)
        with Stopwatch() as whole:
            clf = Classifier(inputs.task, model=inputs.loaded, settings=inputs.settings)
            clf.score(clf.encode(texts), progress=article.advance)
        ours = whole.seconds - article.watch.seconds
        print(f"a {article.watch.seconds:.2f} s  d {ours:.2f} s  d x a = {article.watch.seconds / ours:.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2)
