"""Ray's overhead, measured side by side in one run: `python -m slmclassify.ray.bench`.

The article's 600 tickets, the embedded model: the single-process run (one Classifier, 2 torch
threads) and a local Ray (`ray.init(num_cpus=2)`, 2 actors × 1 CPU), alternated round by round so
that drift of a shared host hits both. Prints a table and one JSON line last. Ray's time is the
wall time from submitting the Dataset to holding every row, actor start and model load included;
`ray - load` takes the actors' model load out (the single-process side loads once, before timing).
"""

from __future__ import annotations

import json
import time

import click
import numpy as np


def _compare(frame, results, labels) -> tuple[bool, float]:
    """(same labels in the same order, max |Δp|) of a Ray frame against single-process results."""
    same = [None if v is None or v != v else v for v in frame["label"]] == [r.label for r in results]
    delta = max(float(np.nanmax(np.abs(frame[f"p_{lab}"].to_numpy()
                                       - np.array([r.probabilities.get(lab, np.nan) for r in results]))))
                for lab in labels)
    return same, delta


@click.command()
@click.option("--n", "n_items", type=int, default=600, show_default=True)
@click.option("--rounds", type=int, default=2, show_default=True)
@click.option("--block-rows", type=int, default=150, show_default=True)
@click.option("--model", help="Default: the embedded SmolLM2-135M.")
def main(n_items, rounds, block_rows, model):
    import platform

    import ray
    import torch

    from ..classifier import Classifier
    from ..loading import load_model
    from ..workload import ARTICLE_TASK, article_tickets
    from . import RaySettings, classify_dataset

    texts = article_tickets(n_items)
    task = ARTICLE_TASK
    loaded = load_model(model)
    torch.set_num_threads(2)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    rows = []
    for r in range(rounds):
        clf = Classifier(task, model=loaded)
        began = time.perf_counter()
        results = clf.classify(texts)
        single = time.perf_counter() - began
        ds = ray.data.from_items([{"row": i, "text": t} for i, t in enumerate(texts)])
        run = classify_dataset(ds, task, model=model, ray_settings=RaySettings(actors=2, cpus_per_actor=1,
                                                                            block_rows=block_rows))
        began = time.perf_counter()
        frame = run.dataset.to_pandas()
        wall = time.perf_counter() - began
        figures = run.figures()
        load = float(figures["info"]["load_seconds"])
        busy = [a["stats"]["seconds"] for a in figures["actors"].values() if a["stats"]]  # an actor may start late
        same, delta = _compare(frame, results, task.labels)
        in_order = frame["row"].tolist() == list(range(n_items))
        rows.append(dict(round=r + 1, single_s=single, ray_s=wall, ray_minus_load_s=wall - load, load_s=load,
                         busy_s=busy, overhead=wall / single - 1, overhead_minus_load=(wall - load) / single - 1,
                         identical_labels=same, in_order=in_order, max_dp=delta,
                         single_padding=clf.stats.padding_share))
        click.echo(f"round {r + 1}: single {single:.1f} s, ray {wall:.1f} s (actor load {load:.1f} s, busy "
                   f"{', '.join(f'{b:.1f}' for b in busy)} s); labels identical {same}, in order {in_order}, "
                   f"max |Δp| {delta:.1e}", err=True)
    ray.shutdown()
    click.echo(f"{n_items} article tickets, embedded model, {platform.processor() or platform.machine()}, "
               f"blocks of {block_rows} rows")
    click.echo(f"{'round':>5} {'single s':>9} {'ray s':>7} {'ray-load s':>10} {'overhead':>9} {'-load':>7} "
               f"{'same':>5} {'order':>5} {'max|Δp|':>8}")
    for row in rows:
        click.echo(f"{row['round']:>5} {row['single_s']:>9.1f} {row['ray_s']:>7.1f} {row['ray_minus_load_s']:>10.1f} "
                   f"{100 * row['overhead']:>8.1f}% {100 * row['overhead_minus_load']:>6.1f}% "
                   f"{str(row['identical_labels']):>5} {str(row['in_order']):>5} {row['max_dp']:>8.1e}")
    click.echo(json.dumps({"n": n_items, "block_rows": block_rows, "rounds": rows}))


if __name__ == "__main__":
    main()
