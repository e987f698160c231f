"""Ray's overhead, measured side by side in one run: `python -m slmclassify.ray.bench`.

The same command a user runs, end to end, both ways, alternated round by round (the side that
goes first alternates too) so that drift of a shared host hits both:

    slmclassify classify tickets.csv -o one.csv --no-verify --quiet          # one process, 2 threads
    slmclassify classify tickets.csv -o ray.csv --ray --actors 2 --quiet     # a local Ray, 2 actors × 1 CPU

on the article's 600 tickets with the embedded model. Each side's wall time covers everything:
Python start, imports, `ray.init` (Ray side), model loads, calibration, scoring and the written
file. Neither side checks probes against the per-item path (`--no-verify`; `--ray` never does).
The in-process figures come from each run's own summary: the single process's model load and
scoring seconds; Ray's `ray.init`, the time from submitting the Dataset to the last row written,
each actor's start-up phases, rows and busy seconds. Both sides' "run through the model" count
the distinct items each scored (the single process scores identical texts of a 1024-row window
once; the Ray actors share their scores, so each distinct text is run once in total). The outputs
are compared row by row: labels, order (the id column) and max |Δp|. Prints a table per round, the load average before each run, and one
JSON line last.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import numpy as np
import pandas as pd

_SINGLE = {
    "load_s": r"\(loaded in ([\d.]+) s\)",
    "scoring_s": r"^items: \d+ \(\d+ scored, \d+ empty\) in ([\d.]+) s",
    "scored": r"^items: \d+ \((\d+) scored",
    "duplicates": r"^duplicates: (\d+) rows",
}
_RAY = {
    "ray_init_s": r"^phases: ray\.init ([\d.]+) s",
    "driver_to_submit_s": r"submitted the Dataset ([\d.]+) s after it started",
    "submit_to_written_s": r"to the last row written ([\d.]+) s",
    "scored_by_model": r"run through the model: (\d+)$",
    "load_s": r"\(loaded in ([\d.]+) s per actor\)",
}
_ACTOR = re.compile(r"^  actor (\S+): (\d+) rows in (\d+) blocks, busy ([\d.]+) s.*run through the model (\d+), "
                    r"waited ([\d.]+) s .*; at (.*) s$", re.MULTILINE)


def _grab(patterns: dict, text: str) -> dict:
    found = {}
    for name, pattern in patterns.items():
        match = re.search(pattern, text, re.MULTILINE)
        found[name] = float(match.group(1)) if match else None
    return found


def _s(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds:.1f} s"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _run(command: list[str]) -> tuple[float, str, str]:
    """(wall seconds, stderr, load average before) of one CLI run; stops the bench if it fails."""
    load = _load()
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise click.ClickException(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall, done.stderr, load


def _compare(one: Path, other: Path, labels) -> dict:
    a = pd.read_csv(one, dtype={"id": str}, keep_default_na=False)
    b = pd.read_csv(other, dtype={"id": str}, keep_default_na=False)
    delta = max(float(np.nanmax(np.abs(a[f"p_{lab}"].to_numpy(float) - b[f"p_{lab}"].to_numpy(float))))
                for lab in labels)
    return {"identical_labels": a["label"].tolist() == b["label"].tolist(),
            "in_order": b["id"].tolist() == a["id"].tolist() == [f"{i:05d}" for i in range(len(a))],
            "max_dp": delta}


@click.command()
@click.option("--n", "n_items", type=int, default=600, show_default=True)
@click.option("--rounds", type=int, default=2, show_default=True)
@click.option("--actors", type=int, default=2, show_default=True)
@click.option("--block-rows", type=int, default=150, show_default=True,
              help="Rows per Ray block (600 rows / 150 = 2 blocks per actor).")
@click.option("--model", help="Default: the embedded SmolLM2-135M.")
def main(n_items, rounds, actors, block_rows, model):
    from ..workload import ARTICLE_TASK, article_tickets

    task = ARTICLE_TASK
    folder = Path(tempfile.mkdtemp(prefix="slmclassify-ray-bench-"))
    source = folder / "tickets.csv"
    pd.DataFrame({"id": [f"{i:05d}" for i in range(n_items)], "text": article_tickets(n_items)}).to_csv(
        source, index=False)
    with open(folder / "task.toml", "w") as fh:
        fh.write(f"labels = {json.dumps(list(task.labels))}\nsystem = {json.dumps(task.system)}\n"
                 f"user_template = {json.dumps(task.user_template)}\nmode = {json.dumps(task.mode)}\n")
    base = [sys.executable, "-c", "from slmclassify.cli import main; main()", "classify", str(source), "--task", str(folder / "task.toml"),
            "--quiet", *(["--model", model] if model else [])]
    sides = {
        "single": base + ["-o", str(folder / "one.csv"), "--no-verify"],
        "ray": base + ["-o", str(folder / "ray.csv"), "--ray", "--actors", str(actors),
                       "--cpus-per-actor", "1", "--block-rows", str(block_rows)],
    }
    rows = []
    for r in range(rounds):
        order = ("single", "ray") if r % 2 == 0 else ("ray", "single")
        row = {"round": r + 1, "first": order[0]}
        for side in order:
            wall, err, load = _run(sides[side])
            row[f"{side}_wall_s"], row[f"{side}_load_avg"] = wall, load
            if side == "single":
                found = _grab(_SINGLE, err)
                row["single_load_s"], row["single_scoring_s"] = found["load_s"], found["scoring_s"]
                row["single_scored_by_model"] = int(found["scored"] - found["duplicates"])
            else:
                found = _grab(_RAY, err)
                row.update({f"ray_{k}" if not k.startswith("ray_") else k: v for k, v in found.items()})
                row["ray_actors"] = [dict(zip(("key", "rows", "blocks", "busy_s", "scored_by_model", "waited_s",
                                               "phases"),
                                              (m[0], int(m[1]), int(m[2]), float(m[3]), int(m[4]), float(m[5]),
                                               m[6])))
                                     for m in _ACTOR.findall(err)]
                row["ray_scored_by_model"] = int(row.pop("ray_scored_by_model"))
            click.echo(f"round {r + 1} {side}: {wall:.1f} s end to end (load average before: {load})", err=True)
        row["overhead"] = row["ray_wall_s"] / row["single_wall_s"] - 1
        if row["ray_driver_to_submit_s"] is not None:  # the summary, ray.shutdown and the exit
            row["ray_after_written_s"] = (row["ray_wall_s"] - row["ray_driver_to_submit_s"]
                                          - row["ray_submit_to_written_s"])
        row["single_in_process_s"] = row["single_load_s"] + row["single_scoring_s"]
        row["overhead_in_process"] = row["ray_submit_to_written_s"] / row["single_in_process_s"] - 1
        row.update(_compare(folder / "one.csv", folder / "ray.csv", task.labels))
        rows.append(row)

    from ..backends.choice import cpu_name

    cpu = cpu_name()
    click.echo(f"{n_items} article tickets, {model or 'embedded SmolLM2-135M'}, {cpu}, {os.cpu_count()} cores; "
               f"one process (2 torch threads) vs a local Ray ({actors} actors × 1 CPU, blocks of {block_rows} rows)")
    click.echo("end to end = the whole CLI command; in process: single = model load + scoring, "
               "ray = Dataset submitted → last row written (actor start and load included)")
    click.echo(f"{'round':>5} {'single s':>9} {'ray s':>7} {'overhead':>9} {'1 in-proc':>9} {'ray in-proc':>11} "
               f"{'overhead':>9} {'scored 1/ray':>12} {'same':>5} {'order':>5} {'max|Δp|':>8}  load avg 1 | ray")
    for row in rows:
        click.echo(f"{row['round']:>5} {row['single_wall_s']:>9.1f} {row['ray_wall_s']:>7.1f} "
                   f"{100 * row['overhead']:>8.1f}% {row['single_in_process_s']:>9.1f} "
                   f"{row['ray_submit_to_written_s']:>11.1f} {100 * row['overhead_in_process']:>8.1f}% "
                   f"{row['single_scored_by_model']:>5}/{row['ray_scored_by_model']:<6} "
                   f"{str(row['identical_labels']):>5} {str(row['in_order']):>5} {row['max_dp']:>8.1e}  "
                   f"{row['single_load_avg']} | {row['ray_load_avg']}")
        click.echo(f"      single: model load {row['single_load_s']:.1f} s, scoring {row['single_scoring_s']:.1f} s; "
                   f"ray: driver start to Dataset submitted {_s(row['ray_driver_to_submit_s'])}, "
                   f"ray.init {row['ray_init_s']:.1f} s of it, actor load {row['ray_load_s']:.1f} s, "
                   f"last row written to exit {_s(row.get('ray_after_written_s'))}")
        for actor in row["ray_actors"]:
            click.echo(f"      actor {actor['key']}: {actor['rows']} rows in {actor['blocks']} blocks, busy "
                       f"{actor['busy_s']:.1f} s, {actor['scored_by_model']} run through the model, waited "
                       f"{actor['waited_s']:.1f} s for others; "
                       f"at {actor['phases']} s")
    click.echo(json.dumps({"n": n_items, "actors": actors, "block_rows": block_rows, "cpu": cpu,
                           "cores": os.cpu_count(), "rounds": rows}))


if __name__ == "__main__":
    main()
