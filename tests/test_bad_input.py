"""Issue #25, bad input ends in one line and exit 2, never a traceback or an abort; and messages
that say what is wrong. Each test's docstring tells what happened before. Tiny random Llama."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pandas as pd
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


# --------------------------------------------------------------------------- aborts and tracebacks


@pytest.mark.parametrize("bad_row", [100, 1])
def test_ragged_csv_exits_2_every_time(tmp_path, llama_dir, bad_row):
    """Before: the right error line, then `terminate called without an active exception` and exit
    134 (SIGABRT), every time on a 20 MB file: pyarrow's read-ahead thread was still inside Python
    when the interpreter exited. Now exit 2 and one line, every time."""
    src = tmp_path / "in.csv"
    with open(src, "w", encoding="utf-8") as fh:
        fh.write("id,text\n")
        for i in range(1, 400_000):
            if i == bad_row:
                fh.write(f"{i}\n" if bad_row == 100 else f"{i},a,b\n")
            else:
                fh.write(f"{i},hello there this is a somewhat longer text {i}\n")
    fields = "1 fields" if bad_row == 100 else "3 fields"
    for _ in range(3):
        proc = subprocess.run([*_command(), *_args(src, tmp_path / "out.csv", llama_dir)], capture_output=True,
                              env=_env(tmp_path), timeout=120)
        line = _one_error(proc.returncode, proc.stderr.decode())
        assert f"row {bad_row} has {fields}, the header has 2" in line


def test_csv_rows_over_the_block_size_are_read(run_main, tmp_path, llama_dir):
    """Before: a valid CSV with a cell of ~500 KB or more (one the tool itself wrote from a JSONL)
    was refused with pyarrow's `straddling object straddles two block boundaries`. Now the first
    pass reads it again in bigger blocks, and the output keeps the cell whole."""
    big = "line of text\n" * 160_000  # 2 MB with newlines inside the quoted cell
    src = tmp_path / "in.jsonl"
    pd.DataFrame({"id": ["1", "2", "3"], "text": ["short", big, "y"]}).to_json(src, orient="records", lines=True)
    first = tmp_path / "first.csv"
    assert run_main(*_args(src, first, llama_dir, "--max-tokens", "16"))[0] == 0
    second = tmp_path / "second.csv"
    code, _, err = run_main(*_args(first, second, llama_dir, "--max-tokens", "16", "--result-prefix", "again_"))
    assert code == 0, err
    out = pd.read_csv(second, dtype=str, keep_default_na=False)
    assert out["text"].tolist() == ["short", big, "y"]
    assert out["again_status"].tolist() == ["ok", "truncated", "ok"]


def test_csv_row_over_the_limit_is_one_line(run_main, tmp_path, llama_dir, monkeypatch):
    from slmclassify.io import readers

    monkeypatch.setattr(readers, "MAX_CSV_ROW", 1 << 20)
    src = tmp_path / "in.csv"
    pd.DataFrame({"id": ["1", "2"], "text": ["short", "x" * (3 << 20)]}).to_csv(src, index=False)
    code, _, err = run_main(*_args(src, tmp_path / "out.csv", llama_dir))
    assert _one_error(code, err) == (f"slmclassify: error: {src}: a row is larger than 1 MiB, the largest CSV row "
                                     "read; give such texts as JSONL or Parquet (or pass the file itself)")
