"""Ray's overhead, measured side by side in one run: `python -m slmclassify.bench.ray_scaling`.

The same command a user runs, end to end, four ways, alternated round by round (the side that
goes first rotates too) so that drift of a shared host hits all of them:

    slmclassify classify tickets.csv -o one.csv --no-verify --quiet          # one process, 2 threads
    slmclassify classify tickets.csv -o ray.csv --ray --actors 2 --quiet     # starts a local Ray, 2 actors × 1 CPU
                          # fed by the driver, which reads the file (given --ray-address local here,
                          # so that it does not join the running one)
    slmclassify classify in/ -o ray.csv --ray --actors 2 --quiet             # the same rows as two files in a
                          # folder: Ray's readers and Ray Data (`dataset.py`), as a big input runs
    slmclassify classify tickets.csv -o ray.csv --ray --ray-address HOST:PORT --actors 2 --quiet
                          # the file on a local Ray that is running already

on the article's 600 tickets with the embedded model. The running Ray is started by the bench
before the first round (`ray start --head --block`, on a free port, stopped after the last one)
like a user's cluster: its first run creates Ray Data's detached helper actors, which later runs
find there (round 1 is that first run). Each side's wall time covers everything: Python start,
imports, `ray.init` (starting or joining Ray), model loads, calibration, scoring and the written
file. Neither side checks probes against the per-item path (`--no-verify`; `--ray` never does).
The in-process figures come from each run's own summary: the single process's model load and
scoring seconds; Ray's `ray.init`, the time from handing Ray the work to the last row written,
each actor's start-up phases, rows and busy seconds. Both sides' "run through the model" count
the distinct items each scored (the single process scores identical texts of a 1024-row window
once; the Ray actors share their scores, so each distinct text is run once in total). The outputs
are compared row by row: labels, order (the id column) and max |Δp|. Prints a table per round, the
load average before each run, and one JSON line last.
"""

from __future__ import annotations

import contextlib
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
    "driver_to_submit_s": r"handed Ray the work ([\d.]+) s after it started",
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


def _run(command: list[str], env: dict | None = None) -> tuple[float, str, str]:
    """(wall seconds, stderr, load average before) of one CLI run; stops the bench if it fails."""
    load = _load()
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
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


RAY_SIDES = {"ray": "Ray started by the command, the file (actors fed by the driver)",
             "raydata": "Ray started by the command, the file as a folder of two halves (Ray Data)",
             "cluster": "a running local Ray, the file"}


def _rounds(folder: Path, task, texts: list[str], rounds: int, actors: int, block_rows: int, model,
            address: str | None) -> list[dict]:
    """Every side, `rounds` times, rotating which goes first; one dict of figures per round. The
    "cluster" side runs only with `address` (a running Ray)."""
    frame = pd.DataFrame({"id": [f"{i:05d}" for i in range(len(texts))], "text": texts})
    frame.to_csv(folder / "tickets.csv", index=False)
    (folder / "in").mkdir()  # two files in a folder: Ray's readers and Ray Data (one file is read by the driver)
    half = (len(frame) + 1) // 2
    for k, part in enumerate((frame[:half], frame[half:])):
        part.to_csv(folder / "in" / f"tickets-{k}.csv", index=False)
    with open(folder / "task.toml", "w") as fh:
        fh.write(f"labels = {json.dumps(list(task.labels))}\nsystem = {json.dumps(task.system)}\n"
                 f"user_template = {json.dumps(task.user_template)}\nmode = {json.dumps(task.mode)}\n")

    def classify(source: str, output: str, *flags: str) -> list[str]:
        return [sys.executable, "-c", "from slmclassify.cli.main import main; main()", "classify", str(folder / source),
                "-o", str(folder / output), "--task", str(folder / "task.toml"), "--quiet",
                *(["--model", model] if model else []), *flags]

    on_ray = ["--ray", "--actors", str(actors), "--cpus-per-actor", "1", "--block-rows", str(block_rows)]
    sides = {"single": classify("tickets.csv", "single.csv", "--no-verify"),
             "ray": classify("tickets.csv", "ray.csv", *on_ray, "--ray-address", "local"),  # not the running one
             "raydata": classify("in", "raydata.csv", *on_ray, "--ray-address", "local")}
    if address:
        sides["cluster"] = classify("tickets.csv", "cluster.csv", *on_ray, "--ray-address", address)
    names = list(sides)
    rows = []
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        row = {"round": r + 1, "first": order[0]}
        for side in order:
            wall, err, load = _run(sides[side], LOCAL_ONLY if side == "cluster" else None)
            row[f"{side}_wall_s"], row[f"{side}_load_avg"] = wall, load
            if side == "single":
                found = _grab(_SINGLE, err)
                row["single_load_s"], row["single_scoring_s"] = found["load_s"], found["scoring_s"]
                row["single_scored_by_model"] = int(found["scored"] - found["duplicates"])
                row["single_in_process_s"] = row["single_load_s"] + row["single_scoring_s"]
            else:
                row.update({f"{side}_{k}": v for k, v in _ray_figures(err).items()})
            click.echo(f"round {r + 1} {side}: {wall:.1f} s end to end (load average before: {load})", err=True)
        for side in names[1:]:
            row[f"{side}_overhead"] = row[f"{side}_wall_s"] / row["single_wall_s"] - 1
            row[f"{side}_overhead_in_process"] = row[f"{side}_submit_to_written_s"] / row["single_in_process_s"] - 1
            if row[f"{side}_driver_to_submit_s"] is not None:  # the summary, the shutdown and the exit
                row[f"{side}_after_written_s"] = (row[f"{side}_wall_s"] - row[f"{side}_driver_to_submit_s"]
                                                  - row[f"{side}_submit_to_written_s"])
            row.update({f"{side}_{k}": v for k, v in _compare(folder / "single.csv", folder / f"{side}.csv",
                                                              task.labels).items()})
        rows.append(row)
    return rows


def _ray_figures(err: str) -> dict:
    """What a `--ray` run's summary says: `_RAY`'s figures and each actor's line."""
    found = _grab(_RAY, err)
    found["scored_by_model"] = int(found["scored_by_model"])
    found["actors"] = [dict(zip(("key", "rows", "blocks", "busy_s", "scored_by_model", "waited_s", "phases"),
                                (m[0], int(m[1]), int(m[2]), float(m[3]), int(m[4]), float(m[5]), m[6])))
                       for m in _ACTOR.findall(err)]
    return found


@contextlib.contextmanager
def running_ray(cpus: int):
    """A local Ray running beside the bench, as a user's cluster would (`ray start --head --block`
    on a free port: stopping it stops only the processes it started); yields its address. Its files
    go to a folder of its own, so that `ray.init()` elsewhere does not find it (Ray's bootstrap file
    `ray_current_cluster`, which outlives a stopped `--block`) and it is removed afterwards."""
    import shutil

    port = _free_port()
    files = tempfile.mkdtemp(prefix="rb", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={port}",
               f"--temp-dir={files}",
               f"--node-ip-address=127.0.0.1", f"--num-cpus={cpus}", "--include-dashboard=false",
               "--disable-usage-stats"]
    head = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=LOCAL_ONLY)
    try:
        seen = []
        for line in head.stdout:  # `--block` prints this once the node is up, then waits
            seen.append(line)
            if "Ray runtime started" in line:
                break
        else:
            raise click.ClickException("`ray start --head` did not start:\n" + "".join(seen[-20:]))
        yield f"127.0.0.1:{port}"
    finally:
        head.terminate()  # `--block` stops the node's processes when it is terminated
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        shutil.rmtree(files, ignore_errors=True)


LOCAL_ONLY = {**os.environ, "RAY_AUTH_MODE": "disabled"}
"""The running Ray's environment and its drivers': without Ray's token authentication, which a
driver given an address expects a token file for (the bench's Ray listens on 127.0.0.1 only)."""


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@click.command()
@click.option("--n", "n_items", type=int, default=600, show_default=True)
@click.option("--rounds", type=int, default=2, show_default=True)
@click.option("--actors", type=int, default=2, show_default=True)
@click.option("--block-rows", type=int, default=150, show_default=True,
              help="Most rows per Ray block (the driver cuts a small file into blocks of equal work, "
                   "at least 4 per actor).")
@click.option("--running/--no-running", default=True, show_default=True,
              help="Also run against a local Ray that is running already (started by the bench).")
@click.option("--model", help="Default: the embedded SmolLM2-135M.")
def main(n_items, rounds, actors, block_rows, running, model):
    from ..core.article_tickets import ARTICLE_TASK, article_tickets

    task = ARTICLE_TASK
    with tempfile.TemporaryDirectory(prefix="slmclassify-ray-bench-") as tmp, contextlib.ExitStack() as stack:
        address = stack.enter_context(running_ray(os.cpu_count())) if running else None
        rows = _rounds(Path(tmp), task, article_tickets(n_items), rounds, actors, block_rows, model, address)

    from ..backends.choice import cpu_name

    cpu = cpu_name()
    sides = [side for side in RAY_SIDES if f"{side}_wall_s" in rows[0]]
    click.echo(f"{n_items} article tickets, {model or 'embedded SmolLM2-135M'}, {cpu}, {os.cpu_count()} cores; "
               f"one process (2 torch threads) vs Ray ({actors} actors × 1 CPU, blocks of at most {block_rows} rows) "
               f"on: {'; '.join(f'{side} = {RAY_SIDES[side]}' for side in sides)}")
    click.echo("end to end = the whole CLI command; in process: single = model load + scoring, "
               "ray = work handed to Ray → last row written (actor start and load included)")
    click.echo(f"{'round':>5} {'side':>8} {'single s':>9} {'ray s':>7} {'overhead':>9} {'1 in-proc':>9} "
               f"{'ray in-proc':>11} {'overhead':>9} {'scored 1/ray':>12} {'same':>5} {'order':>5} {'max|Δp|':>8}"
               f"  load avg 1 | ray")
    for row in rows:
        click.echo(f"      single: model load {row['single_load_s']:.1f} s, scoring {row['single_scoring_s']:.1f} s")
        for side in sides:
            click.echo(f"{row['round']:>5} {side:>8} {row['single_wall_s']:>9.1f} {row[f'{side}_wall_s']:>7.1f} "
                       f"{100 * row[f'{side}_overhead']:>8.1f}% {row['single_in_process_s']:>9.1f} "
                       f"{row[f'{side}_submit_to_written_s']:>11.1f} {100 * row[f'{side}_overhead_in_process']:>8.1f}% "
                       f"{row['single_scored_by_model']:>5}/{row[f'{side}_scored_by_model']:<6} "
                       f"{str(row[f'{side}_identical_labels']):>5} {str(row[f'{side}_in_order']):>5} "
                       f"{row[f'{side}_max_dp']:>8.1e}  {row['single_load_avg']} | {row[f'{side}_load_avg']}")
            click.echo(f"      {side}: driver start to work handed to Ray {_s(row[f'{side}_driver_to_submit_s'])}, "
                       f"ray.init {row[f'{side}_ray_init_s']:.1f} s of it, actor load {row[f'{side}_load_s']:.1f} s, "
                       f"last row written to exit {_s(row.get(f'{side}_after_written_s'))}")
            for actor in row[f"{side}_actors"]:
                click.echo(f"        actor {actor['key']}: {actor['rows']} rows in {actor['blocks']} blocks, busy "
                           f"{actor['busy_s']:.1f} s, {actor['scored_by_model']} run through the model, waited "
                           f"{actor['waited_s']:.1f} s for others; at {actor['phases']} s")
    click.echo(json.dumps({"n": n_items, "actors": actors, "block_rows": block_rows, "cpu": cpu,
                           "cores": os.cpu_count(), "rounds": rows}))


if __name__ == "__main__":
    main()
