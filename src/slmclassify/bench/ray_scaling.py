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
Each side runs as a child process (`child`) that does what the CLI command does (the same job
function, the same settings) and writes the job's figures as JSON for the bench to read: the single
process's model load and scoring seconds; Ray's `ray.init`, the time from handing Ray the work to the last row written,
each actor's start-up phases, rows and busy seconds. Both sides' "run through the model" count
the distinct items each scored (the single process scores identical texts of a 1024-row window
once; the Ray actors share their scores, so each distinct text is run once in total). The outputs
are compared row by row: labels, order (the id column) and max |Δp|. The rounds are the timing
harness's (`timing.interleave`, no warm-up: round 1 is the first run). Prints a table per round,
the load average before each run, and one JSON line last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import SlmClassifyError
from ..timing import Side, interleave, json_line


def _s(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds:.1f} s"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


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


def _write_inputs(folder: Path, task, texts: list[str]) -> None:
    """tickets.csv, the same rows as two files in in/, and task.toml, under `folder`."""
    frame = pd.DataFrame({"id": [f"{i:05d}" for i in range(len(texts))], "text": texts})
    frame.to_csv(folder / "tickets.csv", index=False)
    (folder / "in").mkdir()  # two files in a folder: Ray's readers and Ray Data (one file is read by the driver)
    half = (len(frame) + 1) // 2
    for k, part in enumerate((frame[:half], frame[half:])):
        part.to_csv(folder / "in" / f"tickets-{k}.csv", index=False)
    with open(folder / "task.toml", "w") as fh:
        fh.write(f"labels = {json.dumps(list(task.labels))}\nsystem = {json.dumps(task.system)}\n"
                 f"user_template = {json.dumps(task.user_template)}\nmode = {json.dumps(task.mode)}\n")


def _specs(folder: Path, actors: int, block_rows: int, model, address: str | None) -> dict[str, dict]:
    """What each side's child runs ({side: spec}, see `child`); "cluster" only with `address`."""

    def spec(side: str, source: str, ray_address: str | None = None) -> dict:
        return {"side": side, "input": str(folder / source), "task": str(folder / "task.toml"), "model": model,
                "actors": actors, "block_rows": block_rows, "address": ray_address}

    specs = {"single": spec("single", "tickets.csv"),
             "ray": spec("ray", "tickets.csv", "local"),  # not the running one
             "raydata": spec("raydata", "in", "local")}
    if address:
        specs["cluster"] = spec("cluster", "tickets.csv", address)
    return specs


def _output(folder: Path, side: str, round_: int, suffix: str = ".csv") -> Path:
    """Where a side's run of a round writes its output (and, with suffix .json, its figures)."""
    return folder / f"{side}-{round_}{suffix}"


def _side(folder: Path, spec: dict, log: Callable[[str], None]) -> Side:
    """A harness side that runs `spec`'s child once per call, each round into its own output."""
    done = 0

    def run(_) -> dict:
        nonlocal done
        spec_now = {**spec, "output": str(_output(folder, spec["side"], done)),
                    "figures": str(_output(folder, spec["side"], done, ".json"))}
        done += 1
        return _run_child(spec_now, log)

    return Side(spec["side"], run)


def _run_child(spec: dict, log: Callable[[str], None]) -> dict:
    """Run one side's child process; its figures (`child`) and the load average before it.
    Raises SlmClassifyError (with the child's stderr) when it fails."""
    load = _load()
    log(f"{spec['side']}: running (load average before: {load})")
    command = [sys.executable, "-c", "from slmclassify.bench.ray_scaling import child; child()", json.dumps(spec)]
    env = LOCAL_ONLY if spec["side"] == "cluster" else None  # the running Ray's drivers: no token file
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SlmClassifyError(f"the {spec['side']} side failed (exit {done.returncode}); fix what its output says "
                               f"and run the bench again:\n{done.stderr[-3000:]}")
    return {"load_avg": load, **json.loads(Path(spec["figures"]).read_text())}


def _rounds(folder: Path, task, texts: list[str], rounds: int, actors: int, block_rows: int, model,
            address: str | None, log: Callable[[str], None]) -> list[dict]:
    """Every side, `rounds` times, interleaved by the timing harness; one dict of figures per round.
    The "cluster" side runs only with `address` (a running Ray)."""
    _write_inputs(folder, task, texts)
    specs = _specs(folder, actors, block_rows, model, address)
    names = list(specs)
    timings = interleave([_side(folder, spec, log) for spec in specs.values()], rounds=rounds, warmup=0)
    rows = []
    for r in range(rounds):
        row = {"round": r + 1, "first": next(side for k, _, side in timings.calls if k == r)}
        for side in names:
            figures = timings.values[side][r][0]
            row[f"{side}_wall_s"], row[f"{side}_load_avg"] = float(timings.seconds[side][r, 0]), figures.pop("load_avg")
            row.update({f"{side}_{k}": v for k, v in figures.items()})
        row["single_in_process_s"] = row["single_load_s"] + row["single_scoring_s"]
        for side in names[1:]:
            row[f"{side}_overhead"] = row[f"{side}_wall_s"] / row["single_wall_s"] - 1
            row[f"{side}_overhead_in_process"] = row[f"{side}_submit_to_written_s"] / row["single_in_process_s"] - 1
            if row[f"{side}_driver_to_submit_s"] is not None:  # the summary, the shutdown and the exit
                row[f"{side}_after_written_s"] = (row[f"{side}_wall_s"] - row[f"{side}_driver_to_submit_s"]
                                                  - row[f"{side}_submit_to_written_s"])
            row.update({f"{side}_{k}": v for k, v in _compare(_output(folder, "single", r), _output(folder, side, r),
                                                              task.labels).items()})
        rows.append(row)
    return rows


def single_figures(summary) -> dict:
    """What the bench reads of a single-process run (`jobs.classify.ClassifySummary`)."""
    return {"load_s": summary.load_seconds, "scoring_s": summary.stats.seconds,
            "scored_by_model": summary.stats.scored - summary.stats.reused}


def ray_figures(summary) -> dict:
    """What the bench reads of a `--ray` run (`jobs.ray_classify.RaySummary`): Ray's start, the
    driver's phases, the actors' load, rows, busy and waiting seconds."""
    from ..jobs.ray_classify import phase_words

    actors = [{"key": a.key, "rows": a.rows, "blocks": a.blocks, "busy_s": a.busy_s,
               "scored_by_model": a.scored_by_model, "waited_s": a.waited_s,
               "phases": phase_words(a.phases)}
              for a in summary.actor_figures]
    return {"ray_init_s": summary.ray_init_s, "driver_to_submit_s": summary.submitted_after_driver_s,
            "submit_to_written_s": summary.seconds, "scored_by_model": summary.scored_by_model,
            "load_s": (summary.model or {}).get("load_seconds"), "actors": actors}


def child() -> None:
    """One side's run, in its own process: what `slmclassify classify` runs for it (`--no-verify --quiet`,
    or `--ray` with the spec's actors, 1 CPU each, block rows and address), its figures written as
    JSON to the spec's "figures" file. The spec is the process's one argument (JSON, `_specs`)."""
    spec = json.loads(sys.argv[1])
    from ..jobs.sources import build_task, engine_settings

    task, settings = build_task(spec["task"]), engine_settings(spec["task"])
    if spec["side"] == "single":
        from ..jobs.classify import ClassifyRequest, run_classify
        from ..models import loading

        loading.set_threads()  # as the CLI does, once per process
        summary = run_classify(ClassifyRequest(spec["input"], spec["output"], probes=0), task, settings,
                               model=spec["model"])
        figures = single_figures(summary)
    else:
        from ..jobs.ray_classify import RayClassifyRequest, run_ray_classify
        from ..ray import RaySettings

        ray_settings = RaySettings(actors=spec["actors"], cpus_per_actor=1, block_rows=spec["block_rows"])
        request = RayClassifyRequest(spec["input"], spec["output"], address=spec["address"], progress=False)
        figures = ray_figures(run_ray_classify(request, task, settings, ray_settings, model=spec["model"]))
    Path(spec["figures"]).write_text(json_line(figures))

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
            raise SlmClassifyError("`ray start --head` did not start; its last lines:\n" + "".join(seen[-20:]))
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


def main(argv: list[str] | None = None) -> None:
    from ..core.article_tickets import ARTICLE_TASK, article_tickets

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", dest="n_items", type=int, default=600, help="Article tickets (default 600).")
    parser.add_argument("--rounds", type=int, default=2, help="Runs of every side (default 2).")
    parser.add_argument("--actors", type=int, default=2, help="Ray actors (default 2).")
    parser.add_argument("--block-rows", type=int, default=150,
                        help="Most rows per Ray block (the driver cuts a small file into blocks of equal work, "
                             "at least 4 per actor; default 150).")
    parser.add_argument("--running", action=argparse.BooleanOptionalAction, default=True,
                        help="Also run against a local Ray that is running already (started by the bench; "
                             "default on).")
    parser.add_argument("--model", help="Default: the embedded SmolLM2-135M.")
    args = parser.parse_args(argv)
    task = ARTICLE_TASK
    try:
        with tempfile.TemporaryDirectory(prefix="slmclassify-ray-bench-") as tmp, contextlib.ExitStack() as stack:
            address = stack.enter_context(running_ray(os.cpu_count())) if args.running else None
            rows = _rounds(Path(tmp), task, article_tickets(args.n_items), args.rounds, args.actors, args.block_rows,
                           args.model, address, log=lambda m: print(m, file=sys.stderr, flush=True))
    except SlmClassifyError as exc:
        sys.exit(f"error: {exc}")
    print_report(rows, args.n_items, args.actors, args.block_rows, args.model)


def print_report(rows: list[dict], n_items: int, actors: int, block_rows: int, model) -> None:
    """The table per round, then one JSON line."""
    from ..backends.choice import cpu_name

    cpu = cpu_name()
    sides = [side for side in RAY_SIDES if f"{side}_wall_s" in rows[0]]
    print(f"{n_items} article tickets, {model or 'embedded SmolLM2-135M'}, {cpu}, {os.cpu_count()} cores; "
          f"one process (2 torch threads) vs Ray ({actors} actors × 1 CPU, blocks of at most {block_rows} rows) "
          f"on: {'; '.join(f'{side} = {RAY_SIDES[side]}' for side in sides)}")
    print("end to end = the whole command; in process: single = model load + scoring, "
          "ray = work handed to Ray → last row written (actor start and load included)")
    print(f"{'round':>5} {'side':>8} {'single s':>9} {'ray s':>7} {'overhead':>9} {'1 in-proc':>9} "
          f"{'ray in-proc':>11} {'overhead':>9} {'scored 1/ray':>12} {'same':>5} {'order':>5} {'max|Δp|':>8}"
          f"  load avg 1 | ray")
    for row in rows:
        print(f"      single: model load {row['single_load_s']:.1f} s, scoring {row['single_scoring_s']:.1f} s")
        for side in sides:
            print(f"{row['round']:>5} {side:>8} {row['single_wall_s']:>9.1f} {row[f'{side}_wall_s']:>7.1f} "
                  f"{100 * row[f'{side}_overhead']:>8.1f}% {row['single_in_process_s']:>9.1f} "
                  f"{row[f'{side}_submit_to_written_s']:>11.1f} {100 * row[f'{side}_overhead_in_process']:>8.1f}% "
                  f"{row['single_scored_by_model']:>5}/{row[f'{side}_scored_by_model']:<6} "
                  f"{str(row[f'{side}_identical_labels']):>5} {str(row[f'{side}_in_order']):>5} "
                  f"{row[f'{side}_max_dp']:>8.1e}  "
                  f"{row['single_load_avg']} | {row[f'{side}_load_avg']}")
            load = row[f"{side}_load_s"]
            print(f"      {side}: driver start to work handed to Ray {_s(row[f'{side}_driver_to_submit_s'])}, "
                  f"ray.init {row[f'{side}_ray_init_s']:.1f} s of it, actor load {_s(load)}, "
                  f"last row written to exit {_s(row.get(f'{side}_after_written_s'))}")
            for actor in row[f"{side}_actors"]:
                print(f"        actor {actor['key']}: {actor['rows']} rows in {actor['blocks']} blocks, busy "
                      f"{actor['busy_s']:.1f} s, {actor['scored_by_model']} run through the model, waited "
                      f"{actor['waited_s']:.1f} s for others; at {actor['phases']} s")
    print(json_line({"n": n_items, "actors": actors, "block_rows": block_rows, "cpu": cpu, "cores": os.cpu_count(),
                     "rounds": rows}))


if __name__ == "__main__":
    main()
