"""The CLI's option bundles (`cli.options.bundle`): each command gets its flags as a few frozen
options objects, and each object turns them into the job's request or settings in one place.

The bundles are read through throw-away commands (`_read`), so nothing loads a model; the errors
go through the console entry point and must read as they always have (one line, exit code 2)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from slmclassify.core.taps import Taps
from slmclassify.cli.bench import (BenchOptions, LoadtestOptions, SweepOptions, bench_options, loadtest_options,
                                   sweep_options)
from slmclassify.cli.label import LabelOptions, label_options
from slmclassify.cli.classify import RayOptions, VerifyOptions, classify_options, ray_options, verify_options
from slmclassify.cli.evaluate import EvaluateOptions, evaluate_options, fit_options
from slmclassify.cli.options import HeadOptions, ModelOptions, bundle, head_options, task_options
from slmclassify.cli.serve import ServeOptions, serve_options
from slmclassify.errors import TaskError
from slmclassify.jobs.classify import ClassifyRequest
from slmclassify.jobs.evaluate import EvaluateRequest
from slmclassify.jobs.fit import FitRequest
from slmclassify.label.session import LabelRequest

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _read(decorators, args: list[str]) -> dict:
    """{parameter: options object} a command with these bundles gets for `args`."""
    seen = {}

    def command(**bundles):
        seen.update(bundles)

    for decorate in reversed(decorators):
        command = decorate(command)
    result = CliRunner().invoke(click.command()(command), args, catch_exceptions=False,
                                env={"SLMCLASSIFY_API_KEY": None})
    assert result.exit_code == 0, result.output
    return seen


def test_bundle_passes_one_object_and_no_loose_flags():
    seen = _read([head_options, task_options], ["--head", "h.npz", "--labels", "a,b", "--max-rows", "4"])
    assert seen == {"head": HeadOptions(head_path="h.npz"), "opts": ModelOptions(labels="a,b", max_rows=4)}


def test_bundle_builds_its_object_when_invoked():
    made = []
    decorate = bundle("x", lambda flag: made.append(flag) or flag, [click.option("--flag", default="d")])
    assert made == []
    assert _read([decorate], []) == {"x": "d"} and made == ["d"]


def test_classify_flags_make_the_request():
    seen = _read([classify_options, ray_options], [
        "in.csv", "-o", "out.jsonl", "--text-column", "body", "--id-column", "id", "--errors", "replace",
        "--probes", "3", "--gold-column", "g", "--result-prefix", "p_", "--resume", "--window", "64", "--quiet"])
    run, ray = seen["run"], seen["ray"]
    assert run.request == ClassifyRequest("in.csv", "out.jsonl", text_column="body", id_column="id",
                                            errors="replace", probes=3, gold_column="g", result_prefix="p_",
                                            resume=True)
    assert (run.window, run.quiet, ray.on) == (64, True, False)
    assert _read([classify_options], ["in.csv", "-o", "-", "--format", "csv", "--no-verify"])["run"].request == \
        ClassifyRequest("in.csv", "-", fmt="csv", probes=0)


@pytest.mark.parametrize("args, on", [([], False), (["--ray"], True), (["--ray-address", "local"], True),
                                      (["--actors", "3"], True), (["--cpus-per-actor", "2"], False)])
def test_ray_options_say_whether_the_run_goes_to_ray(args, on):
    assert _read([ray_options], args)["ray"].on is on


def test_ray_settings_fill_the_defaults():
    pytest.importorskip("ray")
    from slmclassify.ray import DEFAULT_BLOCK_ROWS, RaySettings

    assert RayOptions(use_ray=True).settings() == RaySettings(actors=2, cpus_per_actor=1, block_rows=DEFAULT_BLOCK_ROWS)
    assert RayOptions(actors=3, cpus_per_actor=2, block_rows=16).settings() == RaySettings(3, 2, block_rows=16)


def test_resume_and_restart_exclude_each_other(run_main, tmp_path):
    (tmp_path / "in.csv").write_text("text\nhello\n")
    code, out, err = run_main("classify", tmp_path / "in.csv", "-o", tmp_path / "out.csv", "--resume", "--restart",
                              "--labels", "a,b")
    assert (code, out, err) == (2, "", "slmclassify: error: --resume and --restart exclude each other\n")
    with pytest.raises(TaskError, match="^resume and restart exclude each other$"):  # the library names fields
        ClassifyRequest("in.csv", "out.csv", resume=True, restart=True)


@pytest.mark.parametrize("flag", [["--resume"], ["--restart"], ["--gold-column", "gold"]])
def test_ray_refuses_what_it_cannot_do(run_main, tmp_path, flag):
    """--ray keeps no partial run and counts no accuracy: the same one line as before the split."""
    pytest.importorskip("ray")
    (tmp_path / "in.csv").write_text("text,gold\nhello,a\n")
    code, out, err = run_main("classify", tmp_path / "in.csv", "-o", tmp_path / "out.csv", "--ray", *flag,
                              "--labels", "a,b")
    assert (code, out, err) == (2, "", "slmclassify: error: --ray does not support --resume, --restart or "
                                       "--gold-column\n")
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize("make, message", [
    (lambda: ClassifyRequest("in.csv", "out.csv", probes=-1), "probes must be 0 (no check) or more, got -1"),
    (lambda: EvaluateRequest("in.csv", target_accuracy=0), "target_accuracy must be in (0, 1], got 0"),
    (lambda: FitRequest("in.csv", "h.npz", folds=1), "folds must be at least 2, got 1"),
    (lambda: LabelRequest("in.csv", "s.sqlite", sample=0), "sample must be a positive number of rows, got 0"),
    (lambda: LabelRequest("in.csv", "s.sqlite", first_slice=0), "first_slice must be positive, got 0"),
    (lambda: LabelRequest("in.csv", "s.sqlite", target_accuracy=1.5), "target_accuracy must be in (0, 1], got 1.5"),
])
def test_a_request_checks_its_fields_when_made(make, message):
    """Each setting is checked once, where the request is made; the library names the field (the
    CLI renames it to the flag: the refusals above)."""
    with pytest.raises(TaskError) as refused:
        make()
    assert str(refused.value) == message


def test_verify_flags_merge_the_old_probes_name():
    assert _read([verify_options], ["in.csv", "--n", "5"])["run"] == VerifyOptions("in.csv", probes=5)
    assert _read([verify_options], ["in.csv"])["run"] == VerifyOptions("in.csv", probes=16)
    with pytest.raises(TaskError, match="^--n is the old name of --probes; give one of them$"):
        VerifyOptions.from_flags(input_path="in.csv", text_column="text", fmt=None, errors="strict", probes=1,
                                 old_probes=2, tolerance=1e-3)


def test_evaluate_flags_merge_the_old_names():
    run = _read([evaluate_options], ["in.csv", "--label-column", "gold", "--limit", "7", "--plots", "p",
                                     "--target-accuracy", "0.9"])["run"]
    assert run == EvaluateOptions(EvaluateRequest("in.csv", label_column="gold", limit=7, plots_dir="p",
                                                  target_accuracy=0.9))
    assert run.plots() == {"--plots confusion.png": "p/confusion.png", "--plots reliability.png": "p/reliability.png",
                           "--plots coverage.png": "p/coverage.png"}
    assert run.single_label_flags() == ["--target-accuracy", "--plots"]
    assert _read([evaluate_options], ["in.csv"])["run"] == EvaluateOptions(EvaluateRequest("in.csv"))


@pytest.mark.parametrize("args, message", [
    (["--target-accuracy", "2"], "--target-accuracy must be in (0, 1], got 2.0"),
    (["--gold-column", "g", "--label-column", "g"], "--label-column is the old name of --gold-column; give one of them"),
    (["--write-task"], "--write-task needs --task FILE"),
])
def test_evaluate_refusals_read_as_before(run_main, tmp_path, args, message):
    (tmp_path / "in.csv").write_text("text,label\nhello,a\n")
    code, out, err = run_main("evaluate", tmp_path / "in.csv", "--labels", "a,b", *args)
    assert (code, out, err) == (2, "", f"slmclassify: error: {message}\n")


def test_fit_flags_make_the_taps_and_curve():
    run = _read([fit_options], ["in.csv", "-o", "h.npz", "--label-column", "gold", "--layers", "2,4", "--curve", "4,8",
                                "--scores"])["run"]
    assert run == FitRequest("in.csv", "h.npz", label_column="gold", taps=Taps(last=(2, 4)), curve_sizes=(4, 8),
                             use_scores=True)
    assert _read([fit_options], ["in.csv", "-o", "h.npz"])["run"] == FitRequest("in.csv", "h.npz")
    mixed = _read([fit_options], ["in.csv", "-o", "h.npz", "--layers", "mean3,5"])["run"]
    assert mixed.taps == Taps(last=(5,), mean=(3,))


@pytest.mark.parametrize("args, message", [
    (["--folds", "1"], "--folds must be at least 2, got 1"),
    (["--gold-column", "g", "--label-column", "g"], "--label-column is the old name of --gold-column; give one of them"),
    (["--layers", "0"], "--layers must list positive layer numbers, got '0'"),
    (["--layers", "3,top"], "--layers: 'top' is not a layer number (15) or a mean-pooled layer (mean15)"),
])
def test_fit_refusals_read_as_before(run_main, monkeypatch, tmp_path, args, message):
    import slmclassify.jobs.fit

    monkeypatch.setattr(slmclassify.jobs.fit, "fit_file", lambda *a, **k: pytest.fail("must refuse before fitting"))
    (tmp_path / "in.csv").write_text("text,label\nhello,a\nbye,b\n")
    code, out, err = run_main("fit", tmp_path / "in.csv", "-o", tmp_path / "h.npz", "--labels", "a,b", *args)
    assert (code, out, err) == (2, "", f"slmclassify: error: {message}\n")


def test_label_flags_make_its_options():
    run = _read([label_options], ["in.csv", "--store", "s.sqlite", "--sample", "50", "--review-first",
                                  "--target-accuracy", "0.8"])["run"]
    assert run == LabelOptions(LabelRequest("in.csv", Path("s.sqlite"), sample=50, review_first=True,
                                            target_accuracy=0.8))
    assert _read([label_options], ["data/in.csv"])["run"].request.store_path == Path("in.labels.sqlite")


def test_bench_flags_hold_the_model_options():
    run = _read([bench_options], ["--n", "5", "--model", "m", "--labels", "a,b", "--no-llama-cpp",
                                  "--precision", "fp32", "--max-rows", "4"])["run"]
    assert run == BenchOptions(5, None, "text", None, False, True,
                               ModelOptions(labels="a,b", model="m", max_rows=4, precision="fp32"))


def test_bench_refuses_no_items(run_main, monkeypatch):
    import slmclassify.models.prepare

    monkeypatch.setattr(slmclassify.models.prepare, "load_model", lambda *a, **k: pytest.fail("must refuse first"))
    assert run_main("bench", "--n", "0") == (2, "", "slmclassify: error: --n must be positive, got 0\n")


def test_sweep_flags_make_its_lists():
    run = _read([sweep_options], ["--budgets", "64,128", "--row-caps", "4", "--windows", ""])["run"]
    assert isinstance(run, SweepOptions)
    assert (run.budget_list(), run.rows_list(), run.window_list()) == ([64, 128], [4], [])
    assert _read([sweep_options], ["data.csv"])["run"].window_list() == [128, 1024]


def test_sweep_refuses_a_bad_list_before_loading(run_main, monkeypatch):
    import slmclassify.models.prepare

    monkeypatch.setattr(slmclassify.models.prepare, "load_model", lambda *a, **k: pytest.fail("must refuse first"))
    assert run_main("sweep", "--budgets", "a") == (2, "", "slmclassify: error: --budgets must be comma-separated "
                                                         "integers, got 'a'\n")


def test_loadtest_flags_make_its_options():
    run = _read([loadtest_options], ["--concurrency", "4", "--requests", "10", "--task", "t"])["run"]
    assert run == LoadtestOptions("http://127.0.0.1:8080", 4, 30.0, 10, None, "text", "t", None, None, None, None)
    assert len(run.texts()) == 600


def test_serve_flags_make_the_settings(tmp_path):
    from slmclassify.serve import ServeSettings

    (tmp_path / "t.toml").write_text('labels = ["a", "b"]\n')
    run = _read([serve_options], ["--task", f"one={tmp_path / 't.toml'}", "--max-queue", "9", "--request-timeout",
                                  "2", "--api-key", "k", "--max-batch-rows", "4", "--max-wait-ms", "0"])["run"]
    assert isinstance(run, ServeOptions) and not run.open_beyond_loopback
    assert run.settings() == ServeSettings(max_wait_ms=0, max_queue_items=9, request_timeout_s=2, api_key="k")
    assert run.engine().max_rows == 4
    assert list(run.tasks()) == ["one"]


@pytest.mark.parametrize("args, message", [
    (["--task", "x"], "--task must be NAME=FILE.toml, got 'x'"),
    (["--task", "a=t.toml", "--max-rows", "4", "--max-batch-rows", "8"],
     "--max-batch-rows is the old name of --max-rows; give one of them"),
])
def test_serve_refusals_read_as_before(run_main, monkeypatch, tmp_path, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.toml").write_text('labels = ["a", "b"]\n')
    monkeypatch.setattr("slmclassify.cli.startup.need_serve_extra", lambda: None)
    assert run_main("serve", *args) == (2, "", f"slmclassify: error: {message}\n")


@pytest.mark.parametrize("host, key, open_", [("127.0.0.1", None, False), ("localhost", None, False),
                                              ("[::1]", None, False), ("0.0.0.0", None, True), ("0.0.0.0", "k", False),
                                              ("example.org", None, True)])
def test_serve_knows_when_it_is_open_beyond_this_machine(host, key, open_):
    args = ["--task", "a=t.toml", "--host", host, *(["--api-key", key] if key else [])]
    assert _read([serve_options], args)["run"].open_beyond_loopback is open_
