"""Issue #25, nothing lost: one writer per output, the input never overwritten, `--resume` that
checks the partial and the input it already consumed, cells written as the model saw them.
Each test's docstring tells the bug it pins (what happened before the fix). Tiny random Llama."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from test_resume import _command, _env, interrupt_after, make_input

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LABELS = "billing,technical,account"


def _args(src, target, model_dir, *extra):
    return ["classify", str(src), "-o", str(target), "--labels", LABELS, "--model", str(model_dir), "--window", "8",
            "--quiet", "--no-verify", *extra]


def _one_error(code, err) -> str:
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slmclassify: error: "), err
    return lines[0]


# --------------------------------------------------------------------------- 1. one writer per output


def test_second_writer_of_an_output_is_refused_at_once(tmp_path, llama_dir):
    """Before: a second run on the same output wrote the same OUTPUT.partial and progress record;
    the run that finished exited 0 over a file with NUL holes (65 of 2,000 rows gone), the other
    died with a FileNotFoundError traceback. Now the second run refuses at once, naming the first's
    pid, without loading the model, and the first run's output is whole."""
    src = make_input(tmp_path / "in.csv", 4000, seed=3)
    env = _env(tmp_path)
    target = tmp_path / "out.csv"
    base = [*_command(), "classify", str(src), "-o", str(target), "--labels", LABELS, "--model", str(llama_dir),
            "--window", "16", "--quiet", "--no-verify", "--no-calibrate"]
    first = subprocess.Popen(base, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 120
        while not Path(f"{target}.progress.json").exists():  # the first run is writing chunks
            assert first.poll() is None, first.stderr.read().decode()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        second = subprocess.run(base, capture_output=True, env=env, timeout=120)
        running = first.poll() is None
    finally:
        _, first_err = first.communicate(timeout=300)
    err = second.stderr.decode()
    line = _one_error(second.returncode, err)
    assert running, "the first run ended before the second started; make the input longer"
    assert line == (f"slmclassify: error: {target} is being written by another slmclassify run (pid {first.pid}, "
                     f"lock {target}.lock); wait for it to finish or write to another file")
    assert first.returncode == 0, first_err.decode()
    data = target.read_bytes()
    assert b"\0" not in data
    assert data.decode().count("\n") == 4001
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["in.csv", "out.csv"]


def test_lock_is_released_and_removed(run_main, tmp_path, llama_dir):
    """A finished, a failed and a refused run leave no lock file behind, and the next run goes on."""
    from slmclassify.io.lock import OutputLock

    src = make_input(tmp_path / "in.csv", 20)
    target = tmp_path / "out.csv"
    with OutputLock(str(target)):
        code, _, err = run_main(*_args(src, target, llama_dir))
        assert f"is being written by another slmclassify run (pid {os.getpid()}" in _one_error(code, err)
    assert not Path(f"{target}.lock").exists()
    code, _, err = run_main(*_args(src, target, llama_dir))
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["in.csv", "out.csv"]


# --------------------------------------------------------------------------- 2. the input is never the output


@pytest.mark.parametrize("spelling", ["same", "dotdot", "symlink", "hardlink"])
def test_output_equal_to_input_is_refused(run_main, tmp_path, llama_dir, spelling, monkeypatch):
    """Before: `-o` naming the input (also as ./data/../data/same.csv) replaced the input with the
    output, exit 0. Now it is refused before any work, however the path is spelled."""
    data = tmp_path / "data"
    data.mkdir()
    src = make_input(data / "same.csv", 12)
    before = src.read_bytes()
    monkeypatch.chdir(tmp_path)
    if spelling == "same":
        output = "data/same.csv"
    elif spelling == "dotdot":
        output = "./data/../data/same.csv"
    elif spelling == "symlink":
        os.symlink(src, data / "link.csv")
        output = "data/link.csv"
    else:
        os.link(src, data / "hard.csv")
        output = "data/hard.csv"
    code, _, err = run_main(*_args("data/same.csv", output, llama_dir))
    assert _one_error(code, err) == (f"slmclassify: error: the output {output} is the input file data/same.csv; "
                                     "write to another file (the input is never overwritten)")
    assert src.read_bytes() == before
    assert not any(p.name.endswith((".partial", ".lock", ".progress.json")) for p in data.iterdir())


def test_input_named_like_the_outputs_partial_is_refused(run_main, tmp_path, llama_dir):
    src = make_input(tmp_path / "out.csv.partial", 12)
    code, _, err = run_main(*_args(src, tmp_path / "out.csv", llama_dir, "--format", "csv"))
    assert "is the input file" in _one_error(code, err)
