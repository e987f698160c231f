"""What a head costs at inference, measured side by side with zero-shot scoring in one process.

The same items are scored in chunks, alternating zero-shot and head (its states read from the same
pass, then its matrix product and softmax), so that the host's speed drift hits both sides alike.
With `--echo`, a third side: the same head reading each text twice (`fit --echo`), its own pass.
`python -m slmclassify.bench.head_cost INPUT [--task task.toml] [--rounds 3] [--echo]` prints the table, then one JSON line.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..classifier import Classifier
from ..head.apply import score_with_head
from ..head.features import default_taps
from ..head.model import Head
from ..timing import Side, interleave, json_line, render_table


def measure(classifier: Classifier, texts: list[str], chunk: int = 64, rounds: int = 3, seed: int = 0,
            echo: bool = False) -> dict:
    """Items/s of zero-shot scoring and of head scoring, chunk by chunk interleaved (`timing.interleave`).

    The head is a random one of the real shape (its numbers do not change the cost). "ratio" is the
    head's time over zero-shot's, the median of the per-round ratios. `echo`: also the head reading
    each text twice ("echo_ratio": its time over the head's).
    """
    taps = default_taps(classifier.loaded.model.config.num_hidden_layers)
    rng = np.random.default_rng(seed)
    L = len(classifier.task.labels)
    F = len(taps) * classifier.loaded.model.config.hidden_size + L
    head = Head(labels=classifier.task.labels, taps=taps, use_scores=True, mean=np.zeros(F), scale=np.ones(F),
                coef=rng.normal(size=(L, F)), intercept=np.zeros(L), model={}, task={}, info={})
    echo_head = dataclasses.replace(head, taps=dataclasses.replace(taps, echo=True))
    encoded, echoed = classifier.encode(texts), classifier.encode(texts, echo_head.taps) if echo else None
    spans = [list(range(i, min(i + chunk, len(texts)))) for i in range(0, len(texts), chunk)]
    chunks = [(encoded.subset(rows), echoed.subset(rows) if echo else None) for rows in spans]

    def zero_shot(part) -> None:
        classifier.score_items(part[0], dedupe=False)  # scores and results, as `score_with_head` makes them

    def with_head(part) -> None:
        score_with_head(classifier, part[0], head, "head")

    def with_echo_head(part) -> None:
        score_with_head(classifier, part[1], echo_head, "head")

    sides = [Side("zero-shot", zero_shot), Side("head", with_head)] + ([Side("head (echo)", with_echo_head)] if echo else [])
    timings = interleave(sides, units=chunks, rounds=rounds, warmup=0)  # the caller warms the model up
    n = rounds * len(texts)
    ratio = timings.speedup("head", "zero-shot")  # head's seconds over zero-shot's (median of the rounds)
    return {"items": len(texts), "rounds": rounds, "taps": taps.as_list(), "features": F,
            "zero_shot_items_per_s": n / timings.total("zero-shot"), "head_items_per_s": n / timings.total("head"),
            "ratio": ratio, "timings": timings,
            **({"echo_items_per_s": n / timings.total("head (echo)"), "echo_ratio": timings.speedup("head (echo)", "head")}
               if echo else {})}


def main() -> None:
    import argparse

    from ..core.task import Task, parse_labels
    from ..io import read_table, texts_of
    from ..jobs.sources import read_task

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input")
    parser.add_argument("--task")
    parser.add_argument("--labels")
    parser.add_argument("--mode", default="first")
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--echo", action="store_true", help="also the head reading each text twice (fit --echo)")
    args = parser.parse_args()
    task = read_task(args.task) if args.task else Task(labels=parse_labels(args.labels or ""))
    task = task.with_overrides(mode=args.mode)
    texts = [t for t in texts_of(read_table(args.input, args.text_column), args.text_column) if t.strip()][: args.n]
    clf = Classifier(task)
    clf.score(clf.encode(texts[:16]))  # warm-up
    out = measure(clf, texts, rounds=args.rounds, echo=args.echo)
    print(f"{out['items']} items x {out['rounds']} rounds, mode {clf.mode}, head on layers {out['taps']} "
          f"({out['features']} features)")
    print(render_table(out["timings"], baseline="zero-shot"))
    print(f"zero-shot {out['zero_shot_items_per_s']:.2f} items/s; with head {out['head_items_per_s']:.2f} items/s; "
          f"time ratio head/zero-shot {out['ratio']:.3f}")
    if args.echo:
        print(f"head reading each text twice {out['echo_items_per_s']:.2f} items/s; time ratio echo/head "
              f"{out['echo_ratio']:.3f}")
    print(json_line({**{k: v for k, v in out.items() if k != "timings"}, "mode": clf.mode,
                     **out["timings"].summary("zero-shot")}))


if __name__ == "__main__":
    main()
