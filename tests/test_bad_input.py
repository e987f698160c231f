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

from helpers import LABEL_ARG, classify_args, cli_command, cli_env, interrupt_after, make_input, one_error

pytestmark = pytest.mark.usefixtures("one_torch_thread")


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
    # the abort came every time, so one run per kind of bad row tells a regression
    proc = subprocess.run([*cli_command(), *classify_args(src, tmp_path / "out.csv", llama_dir)],
                          capture_output=True, env=cli_env(tmp_path), timeout=120)
    line = one_error(proc.returncode, proc.stderr.decode())
    assert f"row {bad_row} has {fields}, the header has 2" in line


def test_csv_rows_over_the_block_size_are_read(run_main, tmp_path, llama_dir):
    """Before: a valid CSV with a cell of ~500 KB or more (one the tool itself wrote from a JSONL)
    was refused with pyarrow's `straddling object straddles two block boundaries`. Now the first
    pass reads it again in bigger blocks, and the output keeps the cell whole."""
    big = "line of text\n" * 160_000  # 2 MB with newlines inside the quoted cell
    src = tmp_path / "in.jsonl"
    pd.DataFrame({"id": ["1", "2", "3"], "text": ["short", big, "y"]}).to_json(src, orient="records", lines=True)
    first = tmp_path / "first.csv"
    assert run_main(*classify_args(src, first, llama_dir, "--max-tokens", "16"))[0] == 0
    second = tmp_path / "second.csv"
    code, _, err = run_main(*classify_args(first, second, llama_dir, "--max-tokens", "16", "--result-prefix", "again_"))
    assert code == 0, err
    out = pd.read_csv(second, dtype=str, keep_default_na=False)
    assert out["text"].tolist() == ["short", big, "y"]
    assert out["again_status"].tolist() == ["ok", "truncated", "ok"]


def test_csv_row_over_the_limit_is_one_line(run_main, tmp_path, llama_dir, monkeypatch):
    from slmclassify.io import readers

    monkeypatch.setattr(readers, "MAX_CSV_ROW", 1 << 20)
    src = tmp_path / "in.csv"
    pd.DataFrame({"id": ["1", "2"], "text": ["short", "x" * (3 << 20)]}).to_csv(src, index=False)
    code, _, err = run_main(*classify_args(src, tmp_path / "out.csv", llama_dir))
    assert one_error(code, err) == (f"slmclassify: error: {src}: a row is larger than 1 MiB, the largest CSV row "
                                    "read; give such texts as JSONL or Parquet (or pass the file itself)")


# --------------------------------------------------------------------------- a full disk


def _failing_after(monkeypatch, owner, name, calls: int):
    """`owner.name` raises ENOSPC from call number `calls` (0-based) on."""
    original, seen = getattr(owner, name), []

    def failing(*args, **kwargs):
        seen.append(1)
        if len(seen) > calls:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, failing)


@pytest.mark.parametrize("ext", ["csv", "parquet"])
@pytest.mark.parametrize("where", ["chunk", "record", "finish"])
def test_full_disk_is_one_line_and_resumes(run_main, monkeypatch, tmp_path, llama_dir, ext, where):
    """Before: `OSError: [Errno 28]` as a traceback (two chained ones for Parquet). Now one line that
    says what is kept; after space is freed, --resume gives the uninterrupted run's bytes."""
    from slmclassify.io import sink
    from slmclassify.io.checkpoint import Checkpoint
    from slmclassify.io.writers import ChunkWriter

    src = make_input(tmp_path / "in.csv", 40)
    whole, target = tmp_path / f"whole.{ext}", tmp_path / f"out.{ext}"
    assert run_main(*classify_args(src, whole, llama_dir))[0] == 0
    with monkeypatch.context() as patch:
        if where == "chunk":
            _failing_after(patch, ChunkWriter, "write", 2)
        elif where == "record":
            _failing_after(patch, Checkpoint, "save", 2)
        elif ext == "parquet":
            _failing_after(patch, sink, "ipc_to_parquet", 0)
        else:  # the rename of the finished partial (os.replace is also how records are saved)
            replace = os.replace

            def renaming(source, *args):
                if str(source).endswith(".partial"):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                return replace(source, *args)

            patch.setattr(sink.os, "replace", renaming)
        code, _, err = run_main(*classify_args(src, target, llama_dir))
    rows = 40 if where == "finish" else 16
    assert one_error(code, err) == (
        f"slmclassify: error: cannot write {target}: No space left on device; the {rows} rows done are kept in "
        f"{target}.partial: free some space and run the same command with --resume")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out")) == [
        f"out.{ext}.partial", f"out.{ext}.progress.json"]
    code, _, err = run_main(*classify_args(src, target, llama_dir, "--resume"))
    assert code == 0, err
    assert target.read_bytes() == whole.read_bytes()


def test_full_tmpfs_is_one_line_and_resumes(run_main, tmp_path, llama_dir):
    """The real thing where a tmpfs can be mounted (root): 48 KiB fill up mid-run (600 rows write over 64 KiB)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    size = 48 << 10
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size >> 10}k", "tmpfs", str(disk)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        src = make_input(tmp_path / "in.csv", 600)
        base = ["classify", str(src), "--labels", LABEL_ARG, "--model", str(llama_dir), "--window", "64", "--quiet",
                "--no-verify"]
        whole, target = tmp_path / "whole.csv", disk / "out.csv"
        assert run_main(*base, "-o", whole)[0] == 0
        assert whole.stat().st_size > size + (16 << 10)  # fills up with rows left to write
        code, _, err = run_main(*base, "-o", target)
        line = one_error(code, err)
        assert line.startswith(f"slmclassify: error: cannot write {target}: No space left on device; the ")
        subprocess.run(["mount", "-o", "remount,size=4m", str(disk)], check=True)
        code, _, err = run_main(*base, "-o", target, "--resume")
        assert code == 0, err
        assert target.read_bytes() == whole.read_bytes()
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


# --------------------------------------------------------------------------- duplicate columns


@pytest.mark.parametrize("header, name", [("text,text,id", "text"), ("id,id,text", "id")])
def test_duplicate_csv_columns_are_one_line(run_main, tmp_path, llama_dir, header, name):
    """Before: traceback `KeyError: 'Field "text" exists 2 times in schema'`."""
    src = tmp_path / "in.csv"
    src.write_text(f"{header}\na,b,c\n", encoding="utf-8")
    code, _, err = run_main(*classify_args(src, tmp_path / "out.csv", llama_dir))
    assert one_error(code, err) == (f"slmclassify: error: {src}: column {name!r} appears 2 times in the header; "
                                    "give each column its own name")


def test_duplicate_parquet_columns_are_one_line(run_main, tmp_path, llama_dir):
    """Before: classified, with an output of two columns of one name."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"])], names=["text", "text"]), src)
    code, _, err = run_main(*classify_args(src, tmp_path / "out.csv", llama_dir))
    assert "column 'text' appears 2 times in the header" in one_error(code, err)


# --------------------------------------------------------------------------- the service


def test_service_lone_surrogate_is_the_json_422(llama_loaded):
    """Before: `{"texts": ["\\ud800"]}` got `500 Internal Server Error` as plain text and a traceback
    in the log. Now the documented JSON error, 422, naming the text (as the Python API does)."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from test_serve import running

    with running(llama_loaded) as (url, _app):
        for body, where in ((b'{"task": "support", "texts": ["ok", "\\ud800x"]}', "texts[1]"),
                            (b'{"task": "support", "text": "a\\udc00b"}', "text")):
            answer = httpx.post(f"{url}/v1/classify", content=body, headers={"content-type": "application/json"},
                                timeout=60)
            assert answer.status_code == 422, answer.text
            field = where.split("[")[0]
            assert answer.json()["error"] == (f"invalid request body: {field}: Value error, {where} is not valid "
                                              "Unicode (it holds a lone surrogate)")
        assert httpx.post(f"{url}/v1/classify", json={"task": "support", "text": "refund"}, timeout=60).status_code == 200


# --------------------------------------------------------------------------- messages that mislead


def test_nul_byte_in_utf8_csv_is_read(run_main, tmp_path, llama_dir):
    """Before: a valid UTF-8 CSV with one NUL byte was refused as `not UTF-8 (it looks like UTF-16)`."""
    src = tmp_path / "in.csv"
    src.write_bytes(b"id,text\n1,hello\x00world\n2,card charged twice\n")
    target = tmp_path / "out.csv"
    code, _, err = run_main(*classify_args(src, target, llama_dir))
    assert code == 0, err
    assert pd.read_csv(target, dtype=str)["text"].tolist() == ["hello\x00world", "card charged twice"]


def test_utf16_without_bom_is_still_named(run_main, tmp_path, llama_dir):
    src = tmp_path / "in.csv"
    src.write_bytes("id,text\n1,card charged twice\n".encode("utf-16-le"))
    code, _, err = run_main(*classify_args(src, tmp_path / "out.csv", llama_dir))
    assert "the file is not UTF-8 (it looks like UTF-16)" in one_error(code, err)


@pytest.mark.parametrize("name", ["folder", "folder.csv"])
def test_folder_as_input_is_named(run_main, tmp_path, llama_dir, name):
    """Before: `input file not found` (folder.csv) or an extension complaint whose --format hint did not help."""
    (tmp_path / name).mkdir()
    code, _, err = run_main(*classify_args(tmp_path / name, tmp_path / "out.csv", llama_dir))
    assert one_error(code, err) == (f"slmclassify: error: input {tmp_path / name} is a folder, not a file; give a "
                                    ".csv, .jsonl or .parquet file (folders of files are read by --ray)")


@pytest.mark.parametrize("name", ["fifo", "fifo.csv"])
def test_fifo_as_input_is_named(run_main, tmp_path, llama_dir, name):
    os.mkfifo(tmp_path / name)
    code, _, err = run_main(*classify_args(tmp_path / name, tmp_path / "out.csv", llama_dir))
    assert one_error(code, err) == (
        f"slmclassify: error: input {tmp_path / name} is not a regular file (a pipe or a device), and a file is read "
        f"twice (a check, then the rows); pipe it to stdin instead: slmclassify classify - --format csv ... < "
        f"{tmp_path / name}")


def test_empty_label_between_commas_is_refused(run_main, tmp_path, llama_dir):
    """Before: `--labels "a,,b"` silently dropped the empty label (the Python Task refuses it)."""
    src = make_input(tmp_path / "in.csv", 4)
    code, _, err = run_main("classify", src, "-o", tmp_path / "out.csv", "--labels", "a,,b", "--model", llama_dir)
    assert one_error(code, err) == ("slmclassify: error: --labels 'a,,b': label 2 is empty; remove the extra comma "
                                    "or give it a name")


@pytest.mark.parametrize("labels, message", [
    (["a", None], "label None is a NoneType, not a str"),
    ([1, 2], "label 1 is a int, not a str"),
])
def test_task_labels_must_be_strings(labels, message):
    """Before: Task(labels=["a", None]) and [1, 2] silently became the labels 'None', '1', '2'."""
    from slmclassify import Task
    from slmclassify.errors import TaskError

    with pytest.raises(TaskError) as info:
        Task(labels=labels)
    assert str(info.value) == f"{message}; labels are names, e.g. labels=('billing', 'technical')"


def test_folder_without_tokenizer_is_named(run_main, tmp_path, llama_dir):
    """Before: the message stopped at `Couldn't instantiate the backend tokenizer from one of: `."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_bytes((Path(llama_dir) / "config.json").read_bytes())
    src = make_input(tmp_path / "in.csv", 4)
    code, _, err = run_main("classify", src, "-o", tmp_path / "out.csv", "--labels", LABEL_ARG, "--model", folder)
    assert one_error(code, err) == (
        f"slmclassify: error: cannot load model '{folder}': no usable tokenizer in the folder (it needs "
        "tokenizer.json, or tokenizer.model / vocab.json + merges.txt with tokenizer_config.json; found: none); "
        "copy the tokenizer files next to config.json")


def test_truncated_gguf_is_named_before_dequantising(tmp_path, monkeypatch):
    """Before: a GGUF cut to its first 10 MB failed after 15 s with numpy's `cannot reshape array of
    size 4052224 into shape (151936,952)`. Now its size is checked against its tensors first."""
    import numpy as np
    from gguf import GGUFWriter

    from slmclassify import load_model
    from slmclassify.models import loading
    from slmclassify.errors import ModelLoadError

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(loading, "_dequantise", lambda path: pytest.fail("de-quantised a truncated GGUF"))
    path = tmp_path / "model.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.ones((256, 64), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    size = path.stat().st_size
    os.truncate(path, size - 1000)
    with pytest.raises(ModelLoadError) as info:
        load_model(str(path))
    assert str(info.value) == (f"GGUF file {path} is truncated: it has {size - 1000:,} bytes, its tensors need "
                               f"{size:,}; copy or download it again")


def test_gold_labels_outside_the_task_are_warned(run_main, tmp_path, llama_dir):
    """Before: `classify --gold-column` counted gold labels outside the task as wrong with no
    warning (`evaluate` refuses the same file)."""
    src = tmp_path / "in.csv"
    pd.DataFrame({"text": ["card charged", "app crash", "login", "refund"],
                  "gold": ["billing", "shipping", "account", "Shipping"]}).to_csv(src, index=False)
    code, _, err = run_main(*classify_args(src, tmp_path / "out.csv", llama_dir, "--gold-column", "gold"))
    assert code == 0, err
    lines = err.splitlines()
    warning = ("warning: 2 scored rows have a gold label that is not a label of the task ('Shipping', 'shipping'); "
               "they count as wrong below")
    assert warning in lines
    assert lines[lines.index(warning) + 1].startswith("accuracy vs gold: ")


@pytest.mark.parametrize("change, expected", [
    (["--labels", "billing,technical,refund"],
     "the task changed (labels ['billing', 'technical', 'account'] → ['billing', 'technical', 'refund'])"),
    (["--min-confidence", "0.7", "--no-calibrate"], "the task changed (min_confidence 0.5 → 0.7, calibrate True → False)"),
    (["--window", "4"], "the settings changed (window 8 → 4)"),
])
def test_resume_names_every_field_that_changed(run_main, monkeypatch, tmp_path, llama_dir, change, expected):
    """Before: `--resume` after a label change said only `the task changed` (a --window change named
    the old and new values); now every field of the task, the settings and the model is named."""
    src, target = _interrupted_run(run_main, monkeypatch, tmp_path, llama_dir)
    args = classify_args(src, target, llama_dir, "--resume")
    if change[0] == "--labels":
        args[args.index("--labels") + 1] = change[1]
    else:
        args += change
    code, _, err = run_main(*args)
    assert one_error(code, err) == (f"slmclassify: error: cannot resume {target}: {expected} since {target}.partial "
                                    "was started; run with the same input and options, or pass --restart to start over")


def _interrupted_run(run_main, monkeypatch, tmp_path, llama_dir):
    """(input, output) of a classify run stopped after 2 chunks, its partial and record left."""
    src = make_input(tmp_path / "in.csv", 40)
    target = tmp_path / "out.csv"
    with monkeypatch.context() as patch:
        interrupt_after(patch, 2)
        assert run_main(*classify_args(src, target, llama_dir))[0] == 130
    return src, target


def test_resume_names_the_other_model(run_main, monkeypatch, tmp_path, llama_dir, model_dir_factory):
    other = model_dir_factory("llama", seed=5)
    src, target = _interrupted_run(run_main, monkeypatch, tmp_path, llama_dir)
    args = classify_args(src, target, llama_dir, "--resume")
    args[args.index("--model") + 1] = str(other)
    code, _, err = run_main(*args)
    assert f"cannot resume {target}: the model changed (model '{llama_dir}' → '{other}') since" in one_error(code, err)


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "::", "myhost"])
def test_serve_off_loopback_needs_an_api_key(run_main, monkeypatch, tmp_path, host):
    """Before: `serve --host 0.0.0.0` without --api-key listened on every interface with no warning,
    and /v1/tasks showed the model's file path to anyone."""
    monkeypatch.delenv("SLMCLASSIFY_API_KEY", raising=False)
    code, _, err = run_main("serve", "--task", "a=t.toml", "--host", host)
    assert one_error(code, err) == (
        f"slmclassify: error: --host {host} listens beyond this machine, and without --api-key anyone who reaches "
        "the port can use the model and read its file path (/v1/tasks); set --api-key (or $SLMCLASSIFY_API_KEY), "
        "or pass --insecure to serve it openly")


@pytest.mark.parametrize("args, warned", [
    (["--host", "0.0.0.0", "--insecure"], True),
    (["--host", "0.0.0.0", "--api-key", "k"], False),
    (["--host", "127.0.0.2"], False),
    (["--host", "localhost"], False),
    (["--host", "::1"], False),
])
def test_serve_insecure_warns(run_main, monkeypatch, tmp_path, args, warned):
    pytest.importorskip("fastapi")
    from slmclassify.errors import TaskError
    from slmclassify.serve import server

    monkeypatch.delenv("SLMCLASSIFY_API_KEY", raising=False)

    def stop(*_args, **_kwargs):
        raise TaskError("stopped before binding")

    monkeypatch.setattr(server, "bind", stop)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.toml").write_text('labels = ["billing", "technical"]\n')
    code, _, err = run_main("serve", "--task", "a=t.toml", *args)
    assert code == 2
    warning = ("slmclassify: warning: serving on 0.0.0.0 without --api-key (--insecure): anyone who reaches the port "
               "can use the model and read its file path")
    assert err.splitlines() == ([warning] if warned else []) + ["slmclassify: error: stopped before binding"]


# --------------------------------------------------------------------------- second pass (issue 33, item 5)


def test_service_invalid_utf8_body_is_the_documented_json_error(llama_loaded):
    """Before: a body with an invalid UTF-8 byte got `400 {"error": "There was an error parsing the
    body"}`; now the documented invalid-body error, 422, saying what to send."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from test_serve import running

    with running(llama_loaded) as (url, _app):
        answer = httpx.post(f"{url}/v1/classify", content=b'{"task": "support", "text": "caf\xe9"}',
                            headers={"content-type": "application/json"}, timeout=60)
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"].startswith("invalid request body: it is not JSON text in UTF-8")


@pytest.mark.parametrize("args,named", [(["classify", "--probes", "-1"], "--probes must be 0 (no check) or more"),
                                        (["verify", "--probes", "0"], "--probes must be at least 1 for verify"),
                                        (["verify", "--probes", "-1"], "--probes must be at least 1 for verify")])
def test_a_check_that_checks_nothing_is_refused(run_main, tmp_path, llama_dir, args, named):
    """Before: `classify --probes -1` ran without a check and exit 0; `verify --probes 0` passed with
    '0/0 probes agree'."""
    src = tmp_path / "in.csv"
    src.write_text("text\nmy card was charged twice\n")
    command, *rest = args
    extra = ["-o", tmp_path / "out.csv"] if command == "classify" else []
    code, _, err = run_main(command, src, *extra, *rest, "--labels", "billing,technical", "--model", llama_dir)
    assert named in one_error(code, err)


def test_a_parquet_list_with_a_null_reaches_the_model_and_csv_as_json(run_main, tmp_path, llama_dir):
    """Before: a Parquet `list<int64>` cell with a null reached CSV (and the model) as
    `[1.0, NaN, 3.0]`; now `[1, null, 3]`, as the cell holds it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": ["my card was charged twice", "the app crashes"],
                             "ids": pa.array([[1, None, 3], [4]], type=pa.list_(pa.int64()))}), src)
    out = tmp_path / "out.csv"
    code, _, err = run_main("classify", src, "-o", out, "--labels", "billing,technical", "--model", llama_dir)
    assert code == 0, err
    import csv

    rows = list(csv.DictReader(out.open()))
    assert [r["ids"] for r in rows] == ["[1, null, 3]", "[4]"]
    code, _, err = run_main("classify", src, "-o", tmp_path / "by-list.csv", "--text-column", "ids",
                            "--labels", "billing,technical", "--model", llama_dir)
    assert code == 0, err


def test_a_long_cell_is_cut_before_it_is_tokenized(llama_loaded, monkeypatch):
    """Before: a 20 MB cell was tokenized whole before the 512-token cut (~220 bytes of memory per
    character: 4.9 GiB). Now no tokenizer call sees more than the character bound, and the result is
    the same as for the text cut at the bound."""
    from slmclassify import Classifier, Task
    from slmclassify.core.encode import char_bound

    clf = Classifier(Task(labels=("billing", "technical")), model=llama_loaded)
    tokenizer = clf.loaded.tokenizer
    bound = char_bound(tokenizer, 512)
    seen = []
    original = type(tokenizer).__call__

    def recording(self, text, *args, **kwargs):
        texts = [text] if isinstance(text, str) else list(text)
        seen.append(max((len(t) for t in texts), default=0))
        return original(self, text, *args, **kwargs)

    long_text = "refund my card " * 400_000  # 6 MB
    monkeypatch.setattr(type(tokenizer), "__call__", recording)
    encoded = clf.encode([long_text, "short"])
    assert max(seen) < bound + 5_000  # the bound plus the prompt's template
    assert list(encoded.status) == ["truncated", "ok"]
    monkeypatch.undo()
    again = clf.encode([long_text[:bound], "short"])
    assert list(encoded.ids[0]) == list(again.ids[0])


def test_weights_that_give_nan_are_one_line(tmp_path, model_dir_factory):
    """Before: NaN weights stopped the engine's self-check with `AssertionError: nan`; a model folder
    saved broken is now a one-line load error."""
    import torch
    from safetensors.torch import load_file, save_file

    from slmclassify import ModelLoadError, load_model

    folder = model_dir_factory("llama")
    state = load_file(str(folder / "model.safetensors"))
    state["model.embed_tokens.weight"][:, :] = float("nan")
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="non-finite logits") as info:
        load_model(str(folder))
    assert "\n" not in str(info.value)
    del torch
