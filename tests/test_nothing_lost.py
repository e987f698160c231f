"""Issue #25, nothing lost: one writer per output, the input never overwritten, `--resume` that
checks the partial and the input it already consumed, cells written as the model saw them.
Each test's docstring tells the bug it pins (what happened before the fix). Tiny random Llama."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import LABEL_ARG, classify_args, cli_command, cli_env, interrupt_after, make_input, one_error

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# --------------------------------------------------------------------------- 1. one writer per output


def test_second_writer_of_an_output_is_refused_at_once(tmp_path, llama_dir):
    """Before: a second run on the same output wrote the same OUTPUT.partial and progress record;
    the run that finished exited 0 over a file with NUL holes (65 of 2,000 rows gone), the other
    died with a FileNotFoundError traceback. Now the second run refuses at once, naming the first's
    pid, without loading the model, and the first run's output is whole."""
    rows = 1000
    src = make_input(tmp_path / "in.csv", rows, seed=3)
    env = cli_env(tmp_path)
    target = tmp_path / "out.csv"
    base = [*cli_command(), "classify", str(src), "-o", str(target), "--labels", LABEL_ARG, "--model", str(llama_dir),
            "--window", "16", "--quiet", "--no-verify", "--no-calibrate"]
    first = subprocess.Popen(base, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 120
        while not Path(f"{target}.progress.json").exists():  # the first run is writing chunks
            assert first.poll() is None, first.stderr.read().decode()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        # Held mid-run (lock taken, partial open) while the second run starts, however fast either one is:
        # the input need not outlast the second run's start-up (it was 4,000 rows for that).
        first.send_signal(signal.SIGSTOP)
        try:
            running = first.poll() is None
            second = subprocess.run(base, capture_output=True, env=env, timeout=120)
        finally:
            first.send_signal(signal.SIGCONT)
    finally:
        _, first_err = first.communicate(timeout=300)
    err = second.stderr.decode()
    line = one_error(second.returncode, err)
    assert running, "the first run ended before it was held; make the input longer"
    assert line == (f"slmclassify: error: {target} is being written by another slmclassify run (pid {first.pid}, "
                     f"lock {target}.lock); wait for it to finish or write to another file")
    assert first.returncode == 0, first_err.decode()
    data = target.read_bytes()
    assert b"\0" not in data
    assert data.decode().count("\n") == rows + 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["in.csv", "out.csv"]


def test_lock_is_released_and_removed(run_main, tmp_path, llama_dir):
    """A finished, a failed and a refused run leave no lock file behind, and the next run goes on."""
    from slmclassify.io.lock import OutputLock

    src = make_input(tmp_path / "in.csv", 20)
    target = tmp_path / "out.csv"
    with OutputLock(str(target)):
        code, _, err = run_main(*classify_args(src, target, llama_dir))
        assert f"is being written by another slmclassify run (pid {os.getpid()}" in one_error(code, err)
    assert not Path(f"{target}.lock").exists()
    code, _, err = run_main(*classify_args(src, target, llama_dir))
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
    code, _, err = run_main(*classify_args("data/same.csv", output, llama_dir))
    assert one_error(code, err) == (f"slmclassify: error: the output {output} is the input file data/same.csv; "
                                    "write to another file (the input is never overwritten)")
    assert src.read_bytes() == before
    assert not any(p.name.endswith((".partial", ".lock", ".progress.json")) for p in data.iterdir())


def test_input_named_like_the_outputs_partial_is_refused(run_main, tmp_path, llama_dir):
    src = make_input(tmp_path / "out.csv.partial", 12)
    code, _, err = run_main(*classify_args(src, tmp_path / "out.csv", llama_dir, "--format", "csv"))
    assert "is the input file" in one_error(code, err)


# --------------------------------------------------------------------------- 3, 4. what --resume trusts


def _interrupted_run(run_main, monkeypatch, src, target, model_dir, windows=2):
    with monkeypatch.context() as patch:
        interrupt_after(patch, windows)
        code, _, err = run_main(*classify_args(src, target, model_dir))
    assert code == 130, err
    assert json.loads(Path(f"{target}.progress.json").read_text())["rows_done"] == 8 * windows


@pytest.mark.parametrize("ext,damage", [("csv", "cut"), ("csv", "changed-end"), ("csv", "flipped-middle"),
                                        ("csv", "flipped-first-kib"), ("jsonl", "flipped-middle"),
                                        ("parquet", "flipped-middle")])
def test_resume_refuses_a_partial_cut_short_or_changed(run_main, monkeypatch, tmp_path, llama_dir, ext, damage):
    """Before: `--resume` over a partial 1,000 bytes shorter than its record wrote past its end (a NUL
    hole); one byte flipped in the middle or the first KiB of a partial of the right length was kept
    in the output (only the last 64 KiB were hashed), CSV and Parquet alike. Now the record holds the
    SHA-256 of everything the partial holds: any change is refused; --restart recovers."""
    src = make_input(tmp_path / "in.csv", 40)
    target = tmp_path / f"out.{ext}"
    _interrupted_run(run_main, monkeypatch, src, target, llama_dir)
    partial = Path(f"{target}.partial")
    data = bytearray(partial.read_bytes())
    length = json.loads(Path(f"{target}.progress.json").read_text())["partial_bytes"]
    changed = (f"{partial} does not hold the bytes its progress record saw (its SHA-256 differs): it was changed "
               "or replaced")
    if damage == "cut":
        os.truncate(partial, length - 100)
        reason = f"{partial} is shorter than its progress record says ({length - 100} bytes, the record says {length}): it was cut or replaced"
    else:
        at = {"changed-end": length - 5, "flipped-middle": length // 2, "flipped-first-kib": min(700, length // 3)}[damage]
        data[at] ^= 0x01
        partial.write_bytes(bytes(data))
        reason = changed
    code, _, err = run_main(*classify_args(src, target, llama_dir, "--resume"))
    assert one_error(code, err) == (f"slmclassify: error: cannot resume {target}: {reason}; its rows cannot be "
                                    "trusted, pass --restart to start over")
    assert not target.exists()
    code, _, err = run_main(*classify_args(src, target, llama_dir, "--restart"))
    assert code == 0, err
    whole = tmp_path / f"whole.{ext}"
    assert run_main(*classify_args(src, whole, llama_dir))[0] == 0
    assert target.read_bytes() == whole.read_bytes()


@pytest.mark.parametrize("record", ["deleted", "invalid"])
def test_resume_without_a_usable_progress_record_says_so(run_main, monkeypatch, tmp_path, llama_dir, record):
    """Before: a deleted or unreadable progress record made --resume start again from row 0 without
    a word, dropping the partial. Now it is refused, naming the record; --restart starts over."""
    src = make_input(tmp_path / "in.csv", 40)
    target = tmp_path / "out.csv"
    _interrupted_run(run_main, monkeypatch, src, target, llama_dir)
    progress = Path(f"{target}.progress.json")
    if record == "deleted":
        progress.unlink()
    else:
        progress.write_text("{not json")
    before = Path(f"{target}.partial").read_bytes()
    code, _, err = run_main(*classify_args(src, target, llama_dir, "--resume"))
    assert one_error(code, err).startswith(f"slmclassify: error: cannot resume {target}: its progress record ")
    assert "--restart" in err
    assert Path(f"{target}.partial").read_bytes() == before
    assert run_main(*classify_args(src, target, llama_dir, "--restart"))[0] == 0


def test_resume_still_accepts_a_partial_longer_than_its_record(run_main, monkeypatch, tmp_path, llama_dir):
    """A chunk half-written when the run died is dropped (the record's length and tail still match)."""
    src = make_input(tmp_path / "in.csv", 40)
    target = tmp_path / "out.csv"
    _interrupted_run(run_main, monkeypatch, src, target, llama_dir)
    with open(f"{target}.partial", "ab") as fh:
        fh.write(b"00099,half a row")
    code, _, err = run_main(*classify_args(src, target, llama_dir, "--resume"))
    assert code == 0, err
    whole = tmp_path / "whole.csv"
    assert run_main(*classify_args(src, whole, llama_dir))[0] == 0
    assert target.read_bytes() == whole.read_bytes()


def _big_rows_input(path: Path) -> Path:
    """40 rows, the first 16 with a 100 KB note: rows done after 2 windows of 8 reach past 1 MiB."""
    import pandas as pd

    frame = pd.DataFrame({"id": [f"{i:05d}" for i in range(40)],
                          "note": [("n" * 100_000) if i < 16 else "" for i in range(40)],
                          "text": [f"card charged twice {i}" for i in range(40)]})
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_json(path, orient="records", lines=True)
    return path


@pytest.mark.parametrize("ext", ["csv", "jsonl"])
def test_resume_refuses_an_input_edited_where_it_was_read(run_main, monkeypatch, tmp_path, llama_dir, ext):
    """Before: an edit past the first MiB, same size, mtime restored, was resumed silently and the
    output kept the old row's text and label. Now the bytes already read are re-hashed on resume, and
    the refusal names how many were read: the rows done and the reader's read-ahead (the sweep found
    "in the 5626653 bytes already read for the 1000 rows done" misleading)."""
    src = _big_rows_input(tmp_path / f"in.{ext}")
    target = tmp_path / "out.csv"
    _interrupted_run(run_main, monkeypatch, src, target, llama_dir)
    data = src.read_bytes()
    at = data.index(b"card charged twice 12")
    assert at > 1 << 20
    stat = src.stat()
    src.write_bytes(data[:at] + b"crash" + data[at + 5:])
    os.utime(src, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    read = json.loads(Path(f"{target}.progress.json").read_text())["input_read"]["bytes"]
    assert read > at
    code, _, err = run_main(*classify_args(src, target, llama_dir, "--resume"))
    where = (f"the input file changed; the interrupted run had read all of it ({read:,} bytes: the reader reads "
             "ahead of the 16 rows done), so it cannot tell whether those rows changed" if read >= len(data) else
             f"the input file changed in its first {read:,} bytes, which the interrupted run had read (the 16 rows "
             "done and the rows the reader had read ahead of them)")
    assert one_error(code, err) == (
        f"slmclassify: error: cannot resume {target}: {where} since {target}.partial was started; run with the "
        "same input and options, or pass --restart to start over")


def test_resume_checks_a_parquet_input_whole(run_main, monkeypatch, tmp_path, llama_dir):
    """A Parquet file is read by row groups from anywhere in it: its record hashes all of it."""
    import pandas as pd

    src = tmp_path / "in.parquet"
    pd.read_csv(make_input(tmp_path / "in.csv", 40), dtype=str, keep_default_na=False).to_parquet(src)
    target = tmp_path / "out.csv"
    _interrupted_run(run_main, monkeypatch, src, target, llama_dir)
    record = json.loads(Path(f"{target}.progress.json").read_text())
    assert record["input_read"]["bytes"] == src.stat().st_size


def test_resume_refuses_a_record_without_the_input_read(run_main, monkeypatch, tmp_path, llama_dir):
    """A record of an older slmclassify cannot vouch for the input it read: refused, not trusted."""
    src = make_input(tmp_path / "in.csv", 40)
    target = tmp_path / "out.csv"
    _interrupted_run(run_main, monkeypatch, src, target, llama_dir)
    record_path = Path(f"{target}.progress.json")
    record = json.loads(record_path.read_text())
    del record["input_read"]
    record_path.write_text(json.dumps(record))
    code, _, err = run_main(*classify_args(src, target, llama_dir, "--resume"))
    assert one_error(code, err) == (
        f"slmclassify: error: cannot resume {target}: its progress record was written by an older slmclassify and "
        "does not say which input bytes were read; its rows cannot be trusted, pass --restart to start over")


# --------------------------------------------------------------------------- 5. cells as the model saw them


def test_parquet_list_and_binary_cells_are_written_as_text(run_main, tmp_path, llama_dir):
    """Before: a Parquet list cell was written to CSV as numpy's repr `['a' 'b']` and a binary cell
    as `b'hello'`, while the model scored `["a", "b"]` and `hello`. Now the CSV holds the text the
    model saw: JSON for lists and structs, UTF-8 for binary."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({
        "id": ["1", "2"],
        "tags": pa.array([["a", "b"], ["c"]]),
        "nested": pa.array([[["x"]], []], pa.list_(pa.list_(pa.string()))),
        "meta": pa.array([{"k": 1}, {"k": 2}]),
        "blob": pa.array([b"hello", "caf\u00e9".encode()], pa.binary()),
        "text": pa.array([["card", "charged"], ["app crash"]]),
    }), src)
    target = tmp_path / "out.csv"
    code, _, err = run_main(*classify_args(src, target, llama_dir, "--probes", "2"))
    assert code == 0, err
    out = pd.read_csv(target, dtype=str, keep_default_na=False)
    assert out["tags"].tolist() == ['["a", "b"]', '["c"]']
    assert out["nested"].tolist() == ['[["x"]]', "[]"]
    assert out["meta"].tolist() == ['{"k": 1}', '{"k": 2}']
    assert out["blob"].tolist() == ["hello", "caf\u00e9"]
    assert out["text"].tolist() == ['["card", "charged"]', '["app crash"]']


def test_binary_cells_that_are_not_utf8_are_refused_in_csv(run_main, tmp_path, llama_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"blob": pa.array([b"ok", b"\xff\xfe"], pa.binary()), "text": ["card", "crash"]}), src)
    target = tmp_path / "out.csv"
    code, _, err = run_main(*classify_args(src, target, llama_dir))
    assert one_error(code, err) == (f"slmclassify: error: cannot write {target} as CSV: row 2, column 'blob' holds "
                                    "bytes that are not UTF-8 text; write .parquet, or pass --errors replace")
    assert not target.exists()
    code, _, err = run_main(*classify_args(src, target, llama_dir, "--errors", "replace"))
    assert code == 0, err
    assert "\ufffd" in target.read_text(encoding="utf-8")


def _labelled(path: Path) -> Path:
    path.write_text("text,gold\n" + "".join(f"ticket {i} about my card,{('billing', 'technical')[i % 2]}\n"
                                            for i in range(12)))
    return path


@pytest.mark.parametrize("case", ["fit -o input", "fit --json input", "fit -o hard link to input",
                                  "evaluate --json input", "evaluate --json task", "classify -o task",
                                  "classify -o head", "label --export store", "label --fit input link",
                                  "label --fit store", "bench --json input"])
def test_no_command_writes_over_a_file_it_reads(run_main, tmp_path, llama_dir, case):
    """Before: `fit -o` = the labelled input replaced it by the head (PK...), `fit --json` and
    `evaluate --json` = the input replaced it, `label --fit` = a hard link to the input replaced it,
    `label --export` / `--fit` = the store destroyed the answers. Now every output path of every
    command is checked against every file it reads, through links, before any work."""
    src = _labelled(tmp_path / "gold.csv")
    task = tmp_path / "task.toml"
    task.write_text('labels = ["billing", "technical"]\n')
    store = tmp_path / "gold.labels.sqlite"
    link = tmp_path / "link.csv"
    os.link(src, link)
    head = tmp_path / "head.npz"
    head.write_bytes(b"a head")
    model = ["--model", llama_dir]
    command = {
        "fit -o input": ["fit", src, "-o", src, "--gold-column", "gold", "--task", task, *model],
        "fit --json input": ["fit", src, "-o", tmp_path / "h.npz", "--json", src, "--gold-column", "gold",
                             "--task", task, *model],
        "fit -o hard link to input": ["fit", src, "-o", link, "--gold-column", "gold", "--task", task, *model],
        "evaluate --json input": ["evaluate", src, "--gold-column", "gold", "--json", src, "--task", task, *model],
        "evaluate --json task": ["evaluate", src, "--gold-column", "gold", "--json", task, "--task", task, *model],
        "classify -o task": ["classify", src, "-o", task, "--task", task, *model],
        "classify -o head": ["classify", src, "-o", head, "--head", head, *model],
        "label --export store": ["label", src, "--task", task, "--store", store, "--export", store, *model],
        "label --fit input link": ["label", src, "--task", task, "--fit", link, *model],
        "label --fit store": ["label", src, "--task", task, "--store", store, "--fit", store, *model],
        "bench --json input": ["bench", "--input", src, "--json", src, "--n", "2", *model],
    }[case]
    before = {p: p.read_bytes() for p in (src, task, head)}
    code, _, err = run_main(*command)
    line = one_error(code, err)
    assert "a command never writes over a file it reads" in line, line
    assert {p: p.read_bytes() for p in before} == before
    assert not store.exists() or store.stat().st_size == 0
