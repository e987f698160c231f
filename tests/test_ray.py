"""Ray Data integration on a local Ray (2 CPUs, one cluster for the module) with the tiny random
Llama: input order, results equal to a single-process run, a killed actor, the CLI path."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pandas as pd
import pytest

ray = pytest.importorskip("ray")

from click.testing import CliRunner  # noqa: E402

from slmclassify import Classifier  # noqa: E402
from slmclassify.cli.main import cli  # noqa: E402
from slmclassify.errors import InputError, TaskError  # noqa: E402
from slmclassify.ray import RaySettings, classify_dataset  # noqa: E402

from helpers import LABELS, RAY_TASK, ray_texts  # noqa: E402

TASK = RAY_TASK


@pytest.fixture(scope="module")
def single_process(llama_loaded):
    """Results of the single-process run on `ray_texts(n)`, cached per n."""
    cache = {}

    def results(n):
        if n not in cache:
            cache[n] = Classifier(TASK, model=llama_loaded).classify(ray_texts(n))
        return cache[n]

    return results


def _assert_same(frame: pd.DataFrame, expected, n: int) -> None:
    """Every row once, in order, with the single-process result (|Δp| ≤ 1e-4, same label/status)."""
    assert frame["row"].tolist() == list(range(n))
    labels = [r.label for r in expected]
    assert [None if pd.isna(v) else v for v in frame["label"]] == labels
    assert frame["status"].tolist() == [r.status for r in expected]
    assert frame["needs_review"].tolist() == [r.needs_review for r in expected]
    for label in LABELS:
        got = frame[f"p_{label}"].to_numpy()
        want = np.array([r.probabilities.get(label, np.nan) for r in expected])
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0, equal_nan=True)


def _dataset(n: int, blocks: int):
    rows = [{"row": i, "text": t} for i, t in enumerate(ray_texts(n))]
    return ray.data.from_items(rows, override_num_blocks=blocks)


def test_order_and_results_match_single_process(local_ray, llama_dir, single_process):
    n = 700
    run = classify_dataset(_dataset(n, blocks=9), TASK, model=str(llama_dir),
                           ray_settings=RaySettings(actors=2, block_rows=37))
    frame = run.dataset.to_pandas()
    _assert_same(frame, single_process(n), n)
    assert list(frame.columns) == ["row", "text", "label", "confidence", "needs_review",
                                   *(f"p_{lab}" for lab in LABELS), "status"]
    figures = run.figures()
    assert 1 <= len(figures["actors"]) <= 2  # each actor process loaded the model once (one may not start in time)
    assert sum(a["stats"]["items"] for a in figures["actors"].values() if a["stats"]) == n
    assert figures["info"]["threads"] == 1  # from its CPU share, not the host's 2 cores


def test_killed_actor_is_restarted_and_no_row_is_lost_or_doubled(local_ray, llama_dir, single_process):
    n = 4000
    run = classify_dataset(_dataset(n, blocks=20), TASK, model=str(llama_dir),
                           ray_settings=RaySettings(actors=2, block_rows=40))
    killer = _kill_first_busy_actor(run.figures)
    frame = run.dataset.to_pandas()
    _assert_killed_and_replaced(killer, run.figures)
    _assert_same(frame, single_process(n), n)


def _kill_first_busy_actor(figures) -> threading.Thread:
    """A started thread that SIGKILLs the first actor process that has reported a block; its key
    goes in the thread's `killed` list."""

    def kill():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for key, entry in figures()["actors"].items():
                if entry["calls"] >= 1:
                    os.kill(int(key.rsplit(":", 1)[1]), signal.SIGKILL)
                    killer.killed.append(key)
                    return
            time.sleep(0.01)

    killer = threading.Thread(target=kill, daemon=True)
    killer.killed = []
    killer.start()
    return killer


def _assert_killed_and_replaced(killer: threading.Thread, figures) -> None:
    """An actor was killed, and another process (its restart, or the other actor) did work after it."""
    killer.join()
    killed = killer.killed
    assert killed, "no actor reported work in time"
    processes = figures()["actors"]
    assert killed[0] in processes and any(k != killed[0] and e["calls"] >= 1 for k, e in processes.items())


def _pool_run(model_dir, n: int, block_rows: int, on_start=None, actors: int = 2):
    """`ray_texts(n)` through a `BlockPool` as the CLI runs one small file: longest first in blocks of
    equal work (`blocks.spread`), fed to the actors, put back in input order; (frame, pool)."""
    import pyarrow as pa

    from slmclassify.ray.blocks import restore, spread
    from slmclassify.ray.pool import start_pool

    pool = start_pool(TASK, model=str(model_dir), ray_settings=RaySettings(actors=actors, block_rows=block_rows))
    blocks, order = spread(pa.table({"row": list(range(n)), "text": ray_texts(n)}), "text", block_rows, actors)
    if on_start is not None:
        on_start(pool)
    rows = []
    table = restore(pa.concat_tables(pool.classify(blocks, done=rows.append)), order)
    assert sum(rows) == n and len(rows) == len(blocks)
    return table.to_pandas(), pool


def test_pool_order_and_results_match_single_process(local_ray, llama_dir, single_process):
    """`--ray` on one small file: actors fed by the driver (`pool.py`), not Ray Data."""
    n = 700
    frame, pool = _pool_run(llama_dir, n, block_rows=37)
    _assert_same(frame, single_process(n), n)
    assert list(frame.columns) == ["row", "text", "label", "confidence", "needs_review",
                                   *(f"p_{lab}" for lab in LABELS), "status"]
    figures = pool.figures()
    working = [e for e in figures["actors"].values() if e["calls"]]
    assert len(working) == 2  # both actors took blocks
    assert sum(e["stats"]["items"] for e in working) == n
    assert sum(e["stats"]["scored"] - e["stats"]["reused"] for e in working) == figures["shared"]["kept"]
    assert figures["info"]["threads"] == 1


def test_pool_killed_actor_is_restarted_and_no_row_is_lost_or_doubled(local_ray, llama_dir, single_process):
    n = 4000
    killers = []
    frame, pool = _pool_run(llama_dir, n, block_rows=40,
                            on_start=lambda pool: killers.append(_kill_first_busy_actor(pool.figures)))
    _assert_killed_and_replaced(killers[0], pool.figures)
    _assert_same(frame, single_process(n), n)


def test_pool_refuses_an_input_without_the_text_column_or_with_a_result_column(local_ray, llama_dir):
    import pyarrow as pa

    from slmclassify.ray.pool import start_pool

    pool = start_pool(TASK, model=str(llama_dir), ray_settings=RaySettings(actors=1))
    with pytest.raises(InputError, match="no text column 'text'; columns are: body"):
        pool.classify([pa.table({"body": ["x"]})])
    with pytest.raises(InputError, match="already has column 'label'"):
        pool.classify([pa.table({"text": ["x"], "label": ["billing"]})])
    with pytest.raises(TaskError, match="model must be a path or hub id"):
        start_pool(TASK, model=object())


def test_duplicates_in_blocks_of_different_actors_are_run_once_in_total(local_ray, llama_dir, llama_loaded):
    """Regression: a text in blocks of two actors was run through the model by both (the article's 600
    tickets: 335 distinct texts, 427 runs); the actors now share their scores through the board."""
    distinct = [t for t in dict.fromkeys(ray_texts(40, seed=11)) if t][:30]
    rng = np.random.default_rng(2)
    texts = [distinct[i] for _ in range(12) for i in rng.permutation(len(distinct))]  # 12 blocks of the same 30
    n = len(texts)
    ds = ray.data.from_items([{"row": i, "text": t} for i, t in enumerate(texts)], override_num_blocks=4)
    run = classify_dataset(ds, TASK, model=str(llama_dir), ray_settings=RaySettings(actors=2, block_rows=30))
    run.dataset.context.wait_for_min_actors_s = 300  # both actors up before the first block: both get blocks
    frame = run.dataset.to_pandas()
    figures = run.figures()
    working = [e["stats"] for e in figures["actors"].values() if e["calls"]]
    assert len(working) == 2, figures["actors"]
    assert sum(s["scored"] - s["reused"] for s in working) == len(distinct)  # without sharing: 2 × 30
    assert sum(s["items"] for s in working) == n
    assert figures["shared"]["kept"] == len(distinct)
    _assert_same(frame, Classifier(TASK, model=llama_loaded).classify(texts), n)


def _classify_here_and_on_ray(runner: CliRunner, tmp_path, common: list[str], block_rows: int):
    """`classify` of tmp_path/in.csv with the options `common`: in this process to one.csv, then on Ray
    (2 actors, blocks of `block_rows`) to ray.csv; both must succeed. Returns the Ray run's result."""
    single = runner.invoke(cli, ["classify", str(tmp_path / "in.csv"), "-o", str(tmp_path / "one.csv"),
                                 "--no-verify", *common], catch_exceptions=False)
    assert single.exit_code == 0, single.output
    on_ray = runner.invoke(cli, ["classify", str(tmp_path / "in.csv"), "-o", str(tmp_path / "ray.csv"), "--ray",
                                 "--actors", "2", "--block-rows", str(block_rows), *common], catch_exceptions=False)
    assert on_ray.exit_code == 0, on_ray.output
    return on_ray


def test_cli_ray_matches_single_process_run(local_ray, llama_dir, tmp_path, monkeypatch):
    from slmclassify.bench.ray_scaling import ray_figures
    from slmclassify.jobs import ray_classify

    texts = ray_texts(300, seed=3)
    pd.DataFrame({"id": [f"{i:05d}" for i in range(300)], "text": texts}).to_csv(tmp_path / "in.csv", index=False)
    common = ["--model", str(llama_dir), "--labels", ",".join(LABELS), "--quiet"]
    runner = CliRunner()
    # The Ray bench's child runs the CLI's job and reads every figure it prints from its return value.
    summaries, job = [], ray_classify.run_ray_classify
    monkeypatch.setattr(ray_classify, "run_ray_classify", lambda *a, **k: summaries.append(job(*a, **k)) or summaries[-1])
    on_ray = _classify_here_and_on_ray(runner, tmp_path, common, block_rows=64)
    assert "items: 300 (" in on_ray.output and "padding:" in on_ray.output
    assert on_ray.output.count("  actor ") >= 1 and "wrote " in on_ray.output
    found = ray_figures(summaries[0])
    assert None not in found.values(), found
    assert 0 <= found["ray_init_s"] < found["driver_to_submit_s"], found  # Ray is up already here: 0 s
    assert sum(actor["rows"] for actor in found["actors"]) == 300 and 0 < found["scored_by_model"] <= 300
    assert all(actor["phases"].startswith("process started") or "__init__ began" in actor["phases"]
               for actor in found["actors"]), found["actors"]
    assert "__init__ began" in on_ray.output and "imports done" in on_ray.output
    one = pd.read_csv(tmp_path / "one.csv", dtype={"id": str})
    got = pd.read_csv(tmp_path / "ray.csv", dtype={"id": str})
    assert list(got.columns) == list(one.columns)
    assert got["id"].tolist() == [f"{i:05d}" for i in range(300)]  # CSV cells stay strings, rows in order
    for column in ("id", "text", "label", "needs_review", "status"):
        assert got[column].fillna("").tolist() == one[column].fillna("").tolist(), column
    for label in LABELS:
        np.testing.assert_allclose(got[f"p_{label}"], one[f"p_{label}"], atol=1e-4, rtol=0)

    # a folder of JSONL parts in, a folder of Parquet parts out: the same rows in the same order
    (tmp_path / "parts").mkdir()
    for k in range(3):
        pd.DataFrame({"id": range(100 * k, 100 * k + 100), "text": texts[100 * k:100 * k + 100]}).to_json(
            tmp_path / "parts" / f"part-{k}.jsonl", orient="records", lines=True)
    folder = runner.invoke(cli, ["classify", str(tmp_path / "parts"), "-o", str(tmp_path / "out"), "--ray",
                                 "--block-rows", "50", *common], catch_exceptions=False)
    assert folder.exit_code == 0, folder.output
    back = pd.read_parquet(tmp_path / "out")
    assert back["id"].tolist() == list(range(300))
    assert back["label"].fillna("").tolist() == one["label"].fillna("").tolist()

    # one small file in (read by the driver, sent longest first: `ordering.py`), a folder out: input order
    part = runner.invoke(cli, ["classify", str(tmp_path / "in.csv"), "-o", str(tmp_path / "out1"), "--ray",
                               "--block-rows", "64", *common], catch_exceptions=False)
    assert part.exit_code == 0, part.output
    back = pd.read_parquet(tmp_path / "out1")
    assert back["id"].tolist() == [f"{i:05d}" for i in range(300)]
    assert back["label"].fillna("").tolist() == one["label"].fillna("").tolist()


def test_cli_ray_names_the_bad_line_of_a_small_file_and_writes_nothing(local_ray, llama_dir, tmp_path):
    """One small file is read while the actors load (`pool.py`): a bad row still fails the run with
    the line named, and no output (nor a .partial file) is left."""
    (tmp_path / "bad.csv").write_text("id,text\n1,fine\n2,one, too many\n3,fine\n")
    done = CliRunner().invoke(cli, ["classify", str(tmp_path / "bad.csv"), "-o", str(tmp_path / "out.csv"), "--ray",
                                    "--model", str(llama_dir), "--labels", ",".join(LABELS), "--quiet"])
    assert isinstance(done.exception, InputError)  # `main()` prints it as one line
    assert "not readable as CSV (line 3: Expected 2 columns, got 3" in str(done.exception)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv"]


def test_cli_ray_keeps_one_writer_and_never_overwrites_the_input(llama_dir, tmp_path, monkeypatch):
    """Issue 25 for --ray too: the input as the output, or an output another run is writing, is
    refused before Ray starts."""
    from slmclassify.io.lock import OutputLock
    from slmclassify.jobs import ray_classify as job

    monkeypatch.setattr(job, "start_ray", lambda address: pytest.fail("Ray started"))
    (tmp_path / "in.csv").write_text("id,text\n1,fine\n")
    args = ["--ray", "--model", str(llama_dir), "--labels", ",".join(LABELS), "--quiet"]
    same = CliRunner().invoke(cli, ["classify", str(tmp_path / "in.csv"), "-o", str(tmp_path / "." / "in.csv"), *args])
    assert "is the input file" in str(same.exception)
    with OutputLock(str(tmp_path / "out.csv")):
        busy = CliRunner().invoke(cli, ["classify", str(tmp_path / "in.csv"), "-o", str(tmp_path / "out.csv"), *args])
    assert "is being written by another slmclassify run" in str(busy.exception)
    assert (tmp_path / "in.csv").read_text() == "id,text\n1,fine\n"


def test_bad_input_is_refused_before_any_actor_starts(local_ray):
    no_text = ray.data.from_items([{"body": "x"}])
    with pytest.raises(InputError, match="no text column 'text'; columns are: body"):
        classify_dataset(no_text, TASK)
    clash = ray.data.from_items([{"text": "x", "label": "billing"}])
    with pytest.raises(InputError, match="already has column 'label'"):
        classify_dataset(clash, TASK)
    with pytest.raises(TaskError, match="^actors must be positive"):
        RaySettings(actors=0)


def test_a_single_block_is_cut_into_blocks_of_block_rows_in_order(local_ray):
    """Regression: a single input block (one CSV file, `from_items` in one block) went whole to ONE
    actor; it is now cut into blocks of `block_rows` rows, in order, before the actors."""
    from slmclassify.ray.dataset import _cut

    one_block = ray.data.from_items([{"row": i} for i in range(700)], override_num_blocks=1)
    assert one_block.materialize().num_blocks() == 1
    cut = _cut(one_block, 37, 2)
    cut.context.execution_options.preserve_order = True  # as classify_dataset runs it
    cut = cut.materialize()
    assert cut.num_blocks() == 19  # ceil(700 / 37)
    assert cut.to_pandas()["row"].tolist() == list(range(700))
    # the demo's case: 300 rows, blocks of 256 (Ray's non-strict cut left a block of 1.5 × rows whole)
    assert _cut(ray.data.from_items([{"row": i} for i in range(300)], override_num_blocks=1), 256, 2
                ).materialize().num_blocks() == 2


DRIVER_IMPORTS = """
import sys
import slmclassify.jobs.ray_classify as job

def seen(*args, **kwargs):
    print("torch" in sys.modules, "transformers" in sys.modules)
    raise SystemExit(0)  # no summary to print: the job did not run

job.run_ray_classify = seen
from slmclassify.cli.main import main
main()
"""


def test_the_ray_summary_is_data_and_prints_the_lines_of_before(capsys):
    """`run_ray_classify` returns its figures as data (`RaySummary`, JSON-able: what
    bench/ray_scaling reads); `cli.summaries.print_ray` prints the summary lines from it."""
    import json

    from slmclassify.cli.summaries import print_ray
    from slmclassify.core.results import RunStats
    from slmclassify.jobs.ray_classify import _summary
    from slmclassify.ray.sharing import SHARED_ITEMS

    stats = RunStats(items=60, scored=58, seconds=2.0, batches=3, real_tokens=900, processed_tokens=1000,
                     prefix_tokens=20, prefix_reused=1160, reused=5)
    figures = {"info": {"model": "m", "load_seconds": 1.25, "mode": "first", "mode_reason": "r", "calibrated": True,
                        "labels": ["a: 'a'", "b: 'b'"]},
               "actors": {"h:2": {"calls": 2, "stats": vars(stats),
                                  "phases": {"process": 100.5, "imports": 101.0, "load": 102.0},
                                  "blocks": [[103.0, 104.0, 30, 0.5], [104.0, 105.5, 30, 0.25]]},
                          "h:1": {"calls": 0, "stats": None, "phases": {}, "blocks": []}},
               "shared": {"kept": 50, "forgotten": 0}}
    phases = {"ray_init": 0.5, "began": 99.0, "submitted": 100.0, "finished": 106.0, "driver": 98.0,
              "feed": "actors fed by this process, which read the file"}
    summary = _summary(figures, 60, RaySettings(actors=2, block_rows=64), None, "out.csv", phases)
    data = json.loads(json.dumps(summary.to_json()))
    assert data["ray_init_s"] == 0.5 and data["submitted_after_driver_s"] == 2.0 and data["seconds"] == 6.0
    assert [a["key"] for a in data["actor_figures"]] == ["h:1", "h:2"]
    busy = data["actor_figures"][1]
    assert (busy["rows"], busy["blocks"], busy["busy_s"], busy["scored_by_model"], busy["waited_s"]) == (60, 2, 2.0,
                                                                                                          53, 0.75)
    assert busy["phases"] == {"process": 0.5, "imports": 1.0, "load": 2.0, "first_block_began": 3.0,
                              "last_block_ended": 5.5}
    assert summary.scored_by_model == 53
    print_ray(summary)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "model: m (loaded in 1.2 s per actor); mode: first (r); calibrated: True"
    assert err[5] == f"shared scores: 50 distinct items kept on the board, 0 forgotten (at most {SHARED_ITEMS:,})"
    assert err[6] == ("phases: ray.init 0.50 s (began 1.00 s after the driver process started, which handed Ray the "
                      "work 2.00 s after it started); from handing Ray the work (0 s) to the last row written 6.00 s")
    assert err[8] == ("  actor h:2: 60 rows in 2 blocks, busy 2.00 s, 30.0 items/s, padding 10.0%, run through the "
                      "model 53, waited 0.75 s for items other actors were running; at process started 0.50, imports "
                      "done 1.00, model loaded 2.00, first block began 3.00, last block ended 5.50 s")
    assert err[-1] == "wrote out.csv"


def test_the_ray_driver_does_not_import_torch(tmp_path):
    """Regression: the `--ray` driver imported torch (the CLI's start-up, `EngineSettings` in
    classifier.py, the head's features) before `ray.init`: 2.5 s on a 2-core machine that every
    actor waited for. The driver only starts Ray and streams rows; the actors import torch."""
    import subprocess
    import sys

    (tmp_path / "in.csv").write_text("text\nhello\n")
    (tmp_path / "task.toml").write_text('labels = ["a", "b"]\nmax_rows = 4\n')
    common = [str(tmp_path / "in.csv"), "-o", str(tmp_path / "out.csv"), "--task", str(tmp_path / "task.toml")]
    for flags in (["--ray"], ["--actors", "2"]):
        done = subprocess.run([sys.executable, "-c", DRIVER_IMPORTS, "classify", *common, *flags],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["False False"], (flags, done.stdout, done.stderr)  # torch, transformers


LEAN_LOCAL_RAY = """
import os
import ray
from ray._private import parameter
from slmclassify.ray.local import start_ray

original = parameter.RayParams.__init__
original_api = ray._private.node.Node.start_api_server
assert start_ray(num_cpus=1)
assert not start_ray(), "up already: not started again"
assert parameter.RayParams.__init__ is original
assert ray._private.node.Node.start_api_server is original_api
node = ray._private.worker._global_node
print(sorted(node.all_processes))

@ray.remote(num_cpus=0)
def pid():
    return os.getpid()

assert ray.get(pid.remote()) != os.getpid()
ray.shutdown()
assert not ray.is_initialized()
"""


def test_the_local_ray_has_no_autoscaler_monitor_nor_log_monitor_nor_api_server():
    """`classify --ray` without --ray-address starts Ray here without the three processes a run on
    one machine does not use (`ray/local.py`); the monitor also held up `ray.shutdown()` by 1 s.
    Tasks still run, Ray's parameters are restored, and it shuts down."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", LEAN_LOCAL_RAY], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAY_ADDRESS": ""})
    assert done.returncode == 0, done.stderr
    processes = done.stdout.strip()
    assert "'gcs_server'" in processes and "'raylet'" in processes, processes
    assert "'monitor'" not in processes and "'log_monitor'" not in processes, processes
    assert "'dashboard'" not in processes, processes  # the API server


def test_cli_ray_reads_items_of_several_fields_and_multi_label_like_one_process(local_ray, llama_dir, tmp_path):
    """A template naming columns composes each row from them on the actors too, and a multi-label task's
    labels column is the joined string in CSV and a list in Parquet; all as a single-process run writes them."""
    texts = ray_texts(40, seed=5)
    pd.DataFrame({"id": range(40), "subject": [t[:12] for t in texts], "body": texts}).to_csv(tmp_path / "in.csv",
                                                                                             index=False)
    common = ["--model", str(llama_dir), "--labels", ",".join(LABELS), "--multi-label", "--quiet",
              "--user-template", "Subject: {subject}\\n\\n{body}"]
    runner = CliRunner()
    _classify_here_and_on_ray(runner, tmp_path, common, block_rows=16)
    one, ray = (pd.read_csv(tmp_path / f, keep_default_na=False) for f in ("one.csv", "ray.csv"))
    assert ray["id"].tolist() == list(range(40)) and ray["labels"].tolist() == one["labels"].tolist()
    assert np.allclose(ray[[f"p_{n}" for n in LABELS]].to_numpy(float), one[[f"p_{n}" for n in LABELS]].to_numpy(float),
                       atol=1e-4)
    joined = one["labels"].tolist()
    # JSONL keeps the lists as Parquet does (`_write_file` joins them for CSV only): one run of the two
    out = tmp_path / "ray.parquet"
    on_ray = runner.invoke(cli, ["classify", str(tmp_path / "in.csv"), "-o", str(out), "--ray", "--actors", "2",
                                 "--block-rows", "16", *common], catch_exceptions=False)
    assert on_ray.exit_code == 0, on_ray.output
    assert [";".join(v) for v in pd.read_parquet(out)["labels"]] == joined  # lists of the labels, in task order
