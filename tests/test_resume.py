"""Resumable classify runs: OUTPUT.partial + OUTPUT.progress.json, `--resume` continuing
byte-identically, refusal when the input, task, model or settings changed, and the kill test
(SIGKILL / SIGINT / SIGTERM at random moments of a subprocess run). Tiny random Llama model."""

from __future__ import annotations

import csv
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from slmclassify.cli.main import main

from helpers import cli_command, cli_env, interrupt_after, make_input

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LABELS = "billing,technical,account"


@pytest.fixture(scope="module")
def data(tmp_path_factory, llama_dir):
    """An input and its uninterrupted output, per format."""
    folder = tmp_path_factory.mktemp("resume")
    src = make_input(folder / "in.csv", 60)
    return folder, src


def _args(src, target, model_dir, *extra):
    return ["classify", src, "-o", target, "--labels", LABELS, "--model", model_dir, "--window", "8", "--quiet",
            *extra]


@pytest.mark.parametrize("ext", ["csv", "jsonl", "parquet"])
def test_interrupted_run_resumes_byte_identical(run_main, monkeypatch, tmp_path, llama_dir, data, ext):
    _, src = data
    whole = tmp_path / f"whole.{ext}"
    code, _, err = run_main(*_args(src, whole, llama_dir))
    assert code == 0, err

    target = tmp_path / f"out.{ext}"
    with monkeypatch.context() as m:
        interrupt_after(m, 3)
        code, out, err = run_main(*_args(src, target, llama_dir))
    assert code == 130
    assert err.splitlines()[-1] == (f"slmclassify: interrupted; 24 rows done are kept in {target}.partial; "
                                    "run the same command with --resume to continue")
    assert not target.exists()
    record = json.loads(Path(f"{target}.progress.json").read_text())
    assert record["rows_done"] == 24

    code, _, err = run_main(*_args(src, target, llama_dir, "--resume"))
    assert code == 0, err
    assert "resumed after 24 rows" in err
    assert "items: 60 (" in err  # the summary covers the whole file, earlier session included
    assert target.read_bytes() == whole.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([whole.name, target.name])


def test_partial_run_is_reported_not_overwritten(run_main, monkeypatch, tmp_path, llama_dir, data):
    _, src = data
    target = tmp_path / "out.csv"
    with monkeypatch.context() as m:
        interrupt_after(m, 2)
        run_main(*_args(src, target, llama_dir))
    before = Path(f"{target}.partial").read_bytes()
    code, _, err = run_main(*_args(src, target, llama_dir))
    assert code == 2
    assert err.strip() == (f"slmclassify: error: {target}.partial holds an unfinished run (16 rows done); "
                           "pass --resume to continue it, or --restart to start over")
    assert Path(f"{target}.partial").read_bytes() == before

    code, _, err = run_main(*_args(src, target, llama_dir, "--restart"))
    assert code == 0, err
    assert "resumed" not in err
    assert not Path(f"{target}.partial").exists() and not Path(f"{target}.progress.json").exists()


def _other_model(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    import conftest

    folder = tmp_path / "other-model"
    tok = conftest._tokenizer()
    torch.manual_seed(5)
    conftest._model("llama", len(tok)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("change", ["input", "task", "settings", "model"])
def test_resume_refuses_what_changed(run_main, monkeypatch, tmp_path, llama_dir, data, change):
    _, original = data
    src = tmp_path / "in.csv"
    src.write_bytes(original.read_bytes())
    target = tmp_path / "out.csv"
    with monkeypatch.context() as m:
        interrupt_after(m, 2)
        run_main(*_args(src, target, llama_dir))
    args = _args(src, target, llama_dir, "--resume")
    expected = {"input": "the input file changed (size ", "task": "the task changed",
                "settings": "the settings changed (window 8 → 4)", "model": "the model changed"}[change]
    if change == "input":
        with open(src, "a", encoding="utf-8") as fh:
            fh.write("99999,one more row\n")
    elif change == "task":
        args += ["--instruction", "Something else."]
    elif change == "settings":
        args += ["--window", "4"]
    else:
        args[args.index("--model") + 1] = _other_model(tmp_path)
    code, _, err = run_main(*args)
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"slmclassify: error: cannot resume {target}: {expected}")
    assert line.endswith("run with the same input and options, or pass --restart to start over")
    assert Path(f"{target}.partial").exists()  # kept: the user may put things back and resume


def test_resume_refuses_stdin(run_main, tmp_path, llama_dir):
    code, _, err = run_main("classify", "-", "-o", tmp_path / "out.csv", "--labels", LABELS, "--resume",
                            "--model", llama_dir)
    assert code == 2
    assert "--resume needs an input file" in err


# --------------------------------------------------------------------------- the kill test


def _rows_done(target: Path) -> int:
    try:
        return json.loads(Path(f"{target}.progress.json").read_text())["rows_done"]
    except (OSError, ValueError, KeyError):
        return 0


def _default_signals():
    """In the child before exec: SIGINT and SIGTERM unblocked and at their default action, as from a
    shell. A child inherits ignored and blocked signals, and earlier tests in this pytest process
    (Ray's in-process parts) can leave them so: the resumed run then ignored its SIGINT and finished."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _interrupt_until_done(args, target, signals, rng, env, deadline=900):
    """Start the run; each time it has finished a new chunk, send the next signal after a random
    pause and resume. Returns the last run's stderr (the one that finished)."""
    started = time.monotonic()
    pending = list(signals)
    while True:
        done_before = _rows_done(target)
        proc = subprocess.Popen([*args, "--resume"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                                preexec_fn=_default_signals)
        sig = None
        if pending:
            while proc.poll() is None and _rows_done(target) <= done_before:
                time.sleep(0.02)
            if proc.poll() is None:
                sig = pending.pop(0)
                time.sleep(rng.uniform(0, 0.08))  # somewhere in the next chunk or two: mid-score, mid-write or between
                proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=300)
        stderr = stderr.decode()
        # A signal that lands while the finished run's interpreter exits (after the output was
        # renamed into place) kills it by the default action: the run is done all the same.
        finished = proc.returncode == 0 or (sig is not None and proc.returncode == -sig and target.exists())
        if finished:
            assert not pending, f"the run finished with {len(pending)} signals unsent; make the input longer"
            return stderr
        expected = {signal.SIGKILL: -9, signal.SIGINT: 130, signal.SIGTERM: 143}[sig]
        assert proc.returncode == expected, stderr
        if sig != signal.SIGKILL:
            last = stderr.strip().splitlines()[-1]
            assert last.endswith("run the same command with --resume to continue"), stderr
            assert "Traceback" not in stderr, stderr
        assert time.monotonic() - started < deadline


KILL_ROWS = 1_200


def test_kill_and_resume_is_byte_identical(tmp_path, llama_dir):
    """Kill a run at 2 random moments with SIGKILL, and once each with SIGINT and SIGTERM, resuming
    each time: the output equals an uninterrupted run's byte for byte; every row once, in order.
    (One run of 6 processes: most of the time is process start-up, so the signals share it.)"""
    src = make_input(tmp_path / "in.csv", KILL_ROWS, seed=1)
    env = cli_env(tmp_path)
    # a given schedule: a measured one may be measured again between the separate runs compared here
    # (a provisional one, on the busy machine), and float32 sums over other batches differ in the last digit
    base = [*cli_command(), "classify", str(src), "--labels", LABELS, "--model", str(llama_dir),
            "--window", "32", "--quiet", "--no-verify", "--no-calibrate", "--token-budget", "2048", "--max-rows", "128"]
    whole = tmp_path / "whole.csv"
    subprocess.run([*base, "-o", str(whole)], check=True, env=env, capture_output=True, timeout=300)

    target = tmp_path / "out.csv"
    signals = [signal.SIGKILL] * 2 + [signal.SIGINT, signal.SIGTERM]
    random.Random(7).shuffle(signals)
    stderr = _interrupt_until_done([*base, "-o", str(target)], target, signals, random.Random(8), env)
    assert "resumed after" in stderr
    assert target.read_bytes() == whole.read_bytes()
    with open(target, newline="", encoding="utf-8") as fh:
        ids = [row["id"] for row in csv.DictReader(fh)]
    assert ids == [f"{i:05d}" for i in range(KILL_ROWS)]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["in.csv", "out.csv", "whole.csv"]


def test_a_resumed_run_computes_with_the_kernel_the_run_started_with(run_main, monkeypatch, tmp_path, llama_dir,
                                                                    data):
    """Before: a GEMM choice timed on a busy machine is provisional and measured again by a later start;
    a resumed run could then compute with another kernel, whose float32 rounding differs in the last
    digits, and the output was not byte-identical (seen once in `test_kill_and_resume_is_byte_identical`
    under load). The record keeps the kernel and the resumed run uses it."""
    from slmclassify.backends import choice, gemm

    _, src = data
    whole = tmp_path / "whole.csv"
    assert run_main(*_args(src, whole, llama_dir))[0] == 0
    target = tmp_path / "out.csv"
    with monkeypatch.context() as m:
        interrupt_after(m, 3)
        assert run_main(*_args(src, target, llama_dir))[0] == 130
    first = json.loads(Path(f"{target}.progress.json").read_text())["gemm"]["kernel"]
    other = next(k for k in gemm.fp32_kernels(torch.device("cpu")) if k != first)
    used = []
    original = choice.kernel_for
    monkeypatch.setattr(choice, "kernel_for", lambda *a, **k: other)  # the choice measured again: another kernel
    from slmclassify.jobs import classify as job

    same = job._as_recorded
    monkeypatch.setattr(job, "_as_recorded", lambda saved, clf, *a: used.append(same(saved, clf, *a)) or used[-1])
    code, _, err = run_main(*_args(src, target, llama_dir, "--resume"))
    assert code == 0, err
    assert used[-1].loaded.backend.gemm == first != other
    assert target.read_bytes() == whole.read_bytes()
    monkeypatch.setattr(choice, "kernel_for", original)


@pytest.mark.parametrize("ext", ["csv", "jsonl", "parquet"])
@pytest.mark.parametrize("shift", [-8, 8])
def test_a_row_count_edited_in_the_record_is_refused(run_main, monkeypatch, tmp_path, llama_dir, data, ext, shift):
    """Before: `rows_done` moved back by a window wrote that window's rows twice, moved on skipped them,
    exit 0 both times. The record's fields are sealed by a hash (an edit is refused naming the record),
    and the row count is checked against the rows the partial holds (refused even where the hash was
    written again to match); the partial stays for --restart."""
    from slmclassify.io.checkpoint import sealed

    _, src = data
    target = tmp_path / f"out.{ext}"
    with monkeypatch.context() as m:
        interrupt_after(m, 3)
        assert run_main(*_args(src, target, llama_dir))[0] == 130
    record_path = Path(f"{target}.progress.json")
    record = json.loads(record_path.read_text())
    assert record["rows_done"] == 24
    record["rows_done"] += shift
    record_path.write_text(json.dumps(record))
    code, _, err = run_main(*_args(src, target, llama_dir, "--resume"))
    assert code == 2 and "was edited" in err and "--restart" in err, err
    record_path.write_text(json.dumps({"version": record.pop("version"), **sealed(record)}))
    code, _, err = run_main(*_args(src, target, llama_dir, "--resume"))
    assert code == 2 and f"says {24 + shift} rows are done, but {target}.partial holds 24" in err, err
    assert not target.exists() and Path(f"{target}.partial").exists()
    code, _, err = run_main(*_args(src, target, llama_dir, "--restart"))
    assert code == 0, err


def test_an_edited_counter_in_the_record_is_refused(run_main, monkeypatch, tmp_path, llama_dir, data):
    """Any field of the record, not only the row count: the summary's counters, the probe pool."""
    _, src = data
    target = tmp_path / "out.csv"
    with monkeypatch.context() as m:
        interrupt_after(m, 2)
        assert run_main(*_args(src, target, llama_dir))[0] == 130
    record_path = Path(f"{target}.progress.json")
    record = json.loads(record_path.read_text())
    record["state"]["stats"]["items"] += 1
    record_path.write_text(json.dumps(record))
    code, _, err = run_main(*_args(src, target, llama_dir, "--resume"))
    assert code == 2 and "progress record" in err and "was edited" in err, err


def test_a_deleted_record_is_named_by_a_plain_run_too(run_main, monkeypatch, tmp_path, llama_dir, data):
    """Before: with the progress record deleted, a plain run said to pass --resume, which then refused.
    Both now say the run cannot be resumed and that --restart starts over; nothing is overwritten."""
    _, src = data
    target = tmp_path / "out.csv"
    with monkeypatch.context() as m:
        interrupt_after(m, 2)
        assert run_main(*_args(src, target, llama_dir))[0] == 130
    Path(f"{target}.progress.json").unlink()
    partial = Path(f"{target}.partial").read_bytes()
    for extra in ((), ("--resume",)):
        code, _, err = run_main(*_args(src, target, llama_dir, *extra))
        assert code == 2 and "--restart" in err and "pass --resume" not in err, err
        assert "progress record" in err and "is missing" in err, err
    assert Path(f"{target}.partial").read_bytes() == partial
