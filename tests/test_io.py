"""`slmclassify.io`: chunked reading and writing of each format, and the input/output defects of
issue 8 (each test names the defect it pins). No model is involved."""

from __future__ import annotations

import io
import json
import os
import stat
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slmclassify.errors import InputError
from slmclassify.io import check_output, open_table, read_table, write_table
from slmclassify.io.writers import ChunkWriter, ipc_to_parquet, parquet_schema
from slmclassify.core.readout import ONE_LABEL
from slmclassify.core.results import Columns, Result, result_arrow_fields, result_frame

AB = Columns(((None, ("a", "b"), ONE_LABEL),))
"""The result columns of a task of labels a and b."""

ROWS = [{"id": f"{i:04d}", "text": f"text number {i}, with a comma", "n": str(i)} for i in range(23)]


def _write_rows(path, rows=ROWS):
    frame = pd.DataFrame(rows)
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path, row_group_size=5)
    return path


# --------------------------------------------------------------------------- chunked reading


@pytest.mark.parametrize("ext", ["csv", "jsonl", "parquet"])
@pytest.mark.parametrize("chunk_rows", [1, 4, 23, 100])
def test_chunks_have_exact_sizes_and_numbers(tmp_path, ext, chunk_rows):
    """Chunk boundaries depend only on row numbers (not on blocks or row groups): resume relies on it."""
    reader = open_table(str(_write_rows(tmp_path / f"in.{ext}")), "text")
    chunks = list(reader.chunks(chunk_rows))
    sizes = [len(frame) for _, frame in chunks]
    assert sizes == [min(chunk_rows, 23 - s) for s in range(0, 23, chunk_rows)]
    assert [start for start, _ in chunks] == list(range(0, 23, chunk_rows))
    whole = pd.concat([frame for _, frame in chunks])
    assert whole["id"].tolist() == [r["id"] for r in ROWS]  # strings kept, in order
    assert list(whole.index) == list(range(23))


@pytest.mark.parametrize("ext", ["csv", "jsonl", "parquet"])
def test_chunks_skip_rows(tmp_path, ext):
    reader = open_table(str(_write_rows(tmp_path / f"in.{ext}")), "text")
    chunks = list(reader.chunks(5, skip_rows=10))
    assert [start for start, _ in chunks] == [10, 15, 20]
    assert chunks[0][1]["id"].tolist()[0] == "0010"


def test_row_counts_known_up_front(tmp_path):
    """Every file format is counted before the work (a first pass for CSV and JSONL): progress has an ETA,
    and a ragged row or invalid UTF-8 anywhere in the file is found before the model loads."""
    assert open_table(str(_write_rows(tmp_path / "in.parquet")), "text").total_rows == 23
    assert open_table(str(_write_rows(tmp_path / "in.jsonl")), "text").total_rows == 23
    assert open_table(str(_write_rows(tmp_path / "in.csv")), "text").total_rows == 23


def test_csv_quoted_newlines_and_empty_cells(tmp_path):
    path = tmp_path / "in.csv"
    path.write_bytes(b'id,text\n1,"line one\nline two"\n2,\n3,"a, b"\n')
    frame = read_table(str(path), "text")
    assert frame["text"].tolist() == ["line one\nline two", "", "a, b"]


def test_stdin_jsonl_is_read_in_one_pass(monkeypatch):
    lines = "".join(json.dumps({"id": i, "text": f"t{i}"}) + "\n" for i in range(2500)).encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(lines), encoding="utf-8"))
    reader = open_table("-", "text", fmt="jsonl")
    ids = [v for _, frame in reader.chunks(1000) for v in frame["id"]]
    assert ids == list(range(2500))


# --------------------------------------------------------------------------- issue 8: input defects


@pytest.mark.parametrize("content", [b"id,text\n1,hello, world\n2,ok\n", b"id,text\n1,ok\n2,too,many\n3,x\n",
                                     b"id,text,note\n1,ok,a\n2,short\n"], ids=["first-row", "middle", "short"])
def test_ragged_csv_row_is_an_error_naming_the_row(tmp_path, content):
    """Regression: `id,text / 1,hello, world / 2,ok` exited 0 with ids dropped and rows shifted."""
    path = tmp_path / "in.csv"
    path.write_bytes(content)
    with pytest.raises(InputError) as info:
        read_table(str(path), "text")
    message = str(info.value)
    bad = [n for n, line in enumerate(content.decode().splitlines()) if line.count(",") != content.decode().splitlines()[0].count(",")][0]
    assert message.startswith(f"{path}: not a readable CSV file (row {bad} has ")
    assert "fields, the header has" in message


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32"])
def test_utf16_csv_says_not_utf8(tmp_path, encoding):
    """Regression: a UTF-16 CSV gave `no column 'text'` with garbled column names."""
    path = tmp_path / "in.csv"
    path.write_bytes("id,text\n1,hello\n".encode(encoding))
    with pytest.raises(InputError, match=r"the file is not UTF-8 \(it looks like UTF-(16|32)\); save it as UTF-8"):
        read_table(str(path), "text")


def test_jsonl_list_text_is_scored_as_its_json(tmp_path):
    """Regression: a list as the text crashed (`truth value of an array is ambiguous`)."""
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": ["a", "b"]}\n{"text": {"k": 1}}\n{"text": 5}\n{"text": null}\n', encoding="utf-8")
    reader = open_table(str(path), "text")
    (_, frame), = reader.chunks(10)
    assert reader.texts(frame) == ['["a", "b"]', '{"k": 1}', "5", ""]


def test_parquet_list_and_binary_text(tmp_path):
    """Regression: a Parquet binary column was scored as the literal `b'ok'`; a list column crashed."""
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": pa.array([b"ok", "caf\u00e9".encode()], pa.binary()),
                             "tags": pa.array([["x"], ["y", "z"]])}), path)
    reader = open_table(str(path), "text")
    (_, frame), = reader.chunks(10)
    assert reader.texts(frame) == ["ok", "café"]
    reader = open_table(str(path), "tags")
    (_, frame), = reader.chunks(10)
    assert reader.texts(frame) == ['["x"]', '["y", "z"]']


def test_parquet_binary_text_invalid_utf8_names_the_row(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": pa.array([b"ok", b"bad \xff"], pa.binary())}), path)
    reader = open_table(str(path), "text")
    (_, frame), = reader.chunks(10)
    with pytest.raises(InputError, match=r"row 2, column 'text' is not valid UTF-8"):
        reader.texts(frame)


@pytest.mark.parametrize("errors", ["strict", "replace"])
def test_jsonl_lone_surrogate(tmp_path, errors):
    """Regression: a JSONL lone surrogate "\\ud800" raised UnicodeEncodeError."""
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "fine"}\n{"text": "bad \\ud800 here"}\n', encoding="utf-8")
    if errors == "strict":
        with pytest.raises(InputError, match=r"row 2, column 'text' is not valid UTF-8; .*pass errors replace"):
            read_table(str(path), "text")
    else:
        assert read_table(str(path), "text", errors="replace")["text"].tolist() == ["fine", "bad \ufffd here"]


# --------------------------------------------------------------------------- chunked writing


def _results(n, labels=("a", "b")):
    out = []
    for i in range(n):
        if i % 3 == 2:
            out.append(Result(None, None, {}, True, "empty"))
        else:
            out.append(Result("a", 0.75, {"a": 0.75, "b": 0.25}, False, "ok"))
    return out


@pytest.mark.parametrize("ext", ["csv", "jsonl", "parquet"])
def test_written_in_chunks_equals_written_whole(tmp_path, ext):
    """Bytes depend only on the rows: 1, 4 or 23 rows per chunk give the same file."""
    src = _write_rows(tmp_path / f"in.{ext}")
    outputs = []
    for chunk_rows in (1, 4, 23):
        reader = open_table(str(src), "text")
        schema = (parquet_schema(reader, result_arrow_fields(AB)) if ext == "parquet"
                  else reader.columns + ["label"])
        target = tmp_path / f"out{chunk_rows}.{ext}"
        log = tmp_path / f"log{chunk_rows}"
        with open(log if ext == "parquet" else target, "wb") as fh:
            writer = ChunkWriter(fh, ext, schema, ipc=ext == "parquet")
            for start, frame in reader.chunks(chunk_rows):
                results = result_frame(_results(len(frame) + start)[start:], AB, index=frame.index)
                writer.write(pd.concat([frame, results], axis=1))
            writer.close()
        if ext == "parquet":
            ipc_to_parquet(str(log), str(target))
        outputs.append(target)
    back = read_table(str(outputs[0]), "text")
    assert back["id"].tolist() == [r["id"] for r in ROWS]
    assert back["status"].tolist() == [r.status for r in _results(23)]
    if ext != "parquet":
        assert outputs[0].read_bytes() == outputs[1].read_bytes() == outputs[2].read_bytes()
    else:  # one row group per chunk, same rows and types
        tables = [pq.read_table(p) for p in outputs]
        assert tables[0].equals(tables[1]) and tables[0].equals(tables[2])
        assert tables[0].schema.field("needs_review").type == pa.bool_()


def test_result_frame_types_do_not_depend_on_the_rows():
    all_empty = result_frame([Result(None, None, {}, True, "empty")], AB)
    assert str(all_empty["confidence"].dtype) == "float64" and all_empty["needs_review"].dtype == bool
    assert list(all_empty.columns) == ["label", "confidence", "needs_review", "p_a", "p_b", "status"]


def test_mixed_type_jsonl_to_parquet(tmp_path):
    """Regression: JSONL with mixed-type columns written to Parquet raised ArrowTypeError after all the work."""
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": 1, "text": "a", "x": 1.5, "v": "s"}\n{"id": 2, "text": "b", "x": 2, "v": 3}\n'
                   '{"id": 3, "text": "c", "x": null, "v": [1, 2]}\n', encoding="utf-8")
    reader = open_table(str(src), "text")
    schema = parquet_schema(reader, result_arrow_fields(AB))
    assert [str(schema.field(c).type) for c in ("id", "text", "x", "v")] == ["int64", "string", "double", "string"]
    target = tmp_path / "out.parquet"
    with open(tmp_path / "log", "wb") as fh:
        writer = ChunkWriter(fh, "parquet", schema, ipc=True)
        for _, frame in reader.chunks(2):
            writer.write(pd.concat([frame, result_frame(_results(len(frame)), AB, index=frame.index)], axis=1))
    ipc_to_parquet(str(tmp_path / "log"), str(target))
    back = pq.read_table(target).to_pydict()
    assert back["id"] == [1, 2, 3] and back["x"] == [1.5, 2.0, None] and back["v"] == ["s", "3", "[1, 2]"]


def test_parquet_to_stdout(capsysbinary):
    write_table(pd.DataFrame({"id": ["007"], "p": [0.5]}), "-", "parquet")
    data = capsysbinary.readouterr().out
    assert pq.read_table(io.BytesIO(data)).to_pydict() == {"id": ["007"], "p": [0.5]}


# --------------------------------------------------------------------------- issue 8: output defects


def test_output_checks_before_any_work(tmp_path):
    """Regression: a missing folder, unknown extension, non-folder parent or folder as output were
    found only after scoring, some as tracebacks."""
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    cases = {
        str(tmp_path / "missing" / "out.csv"): f"output folder does not exist: {tmp_path / 'missing'}",
        str(tmp_path / "out.xlsx"): "unknown format '.xlsx'",
        str(tmp_path / "afile" / "out.csv"): f"{tmp_path / 'afile'} is a file, not a folder",
        str(tmp_path / "afile" / "deeper" / "out.csv"): f"{tmp_path / 'afile'} is a file, not a folder",
        str(tmp_path / "adir"): "is a folder; give a file name",
    }
    for path, message in cases.items():
        with pytest.raises(InputError) as info:
            check_output(path)
        assert message in str(info.value), (path, str(info.value))
    assert check_output(str(tmp_path / "ok.parquet")) == "parquet"
    assert check_output("-", "jsonl") == "jsonl"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into read-only folders")
def test_output_under_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(InputError, match="no permission to create files in"):
            check_output(str(folder / "out.csv"))
    finally:
        folder.chmod(0o700)


def test_output_under_read_only_folder_any_user(tmp_path, monkeypatch):
    """The same check where the tests run as root: the folder is reported as not writable."""
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(InputError, match=f"cannot write {tmp_path}/out.csv: no permission to create files in"):
        check_output(str(tmp_path / "out.csv"))


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_output_mode_follows_umask(tmp_path, fmt):
    """Regression: outputs were created 0600 (the temporary file's mode), not per the umask."""
    old = os.umask(0o022)
    try:
        target = tmp_path / f"out.{fmt}"
        write_table(pd.DataFrame({"text": ["a"]}), str(target))
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_permission_error_when_writing_is_one_line(tmp_path, monkeypatch):
    """Regression: PermissionError when writing escaped as a traceback."""

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", denied)
    with pytest.raises(InputError, match=r"^cannot write .*out\.csv: Permission denied$"):
        write_table(pd.DataFrame({"text": ["a"]}), str(tmp_path / "out.csv"))
    assert not any(p.name.endswith(".partial") for p in tmp_path.iterdir())


def test_empty_table_writes_header_or_schema(tmp_path):
    frame = pd.DataFrame({"id": pd.Series([], dtype=object), "p": pd.Series([], dtype=np.float64)})
    write_table(frame, str(tmp_path / "out.csv"))
    assert (tmp_path / "out.csv").read_text() == "id,p\n"
    write_table(frame, str(tmp_path / "out.parquet"))
    assert pq.read_table(tmp_path / "out.parquet").column_names == ["id", "p"]


@pytest.mark.parametrize("ext", ["csv", "jsonl", "parquet"])
def test_parquet_integers_with_nulls_stay_exact_integers(tmp_path, run_main, llama_dir, ext, one_torch_thread):
    """Before: pandas read `int64 [1, null, 2**53 + 1]` as floats: the output said `1.0`, NaN and
    `9007199254740992.0` (another number), and a template field showed the model `Order 1.0`. Integers
    stay integers (nulls empty in CSV, null in JSONL and Parquet), and the model reads `Order 1`."""
    from slmclassify import Task
    from slmclassify.io.readers import item_texts

    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"n": pa.array([1, None, 2**53 + 1], pa.int64()),
                             "text": ["my card was charged twice", "the app crashes", "refund"]}), src)
    task = Task(labels=("billing", "technical"), user_template="Order {n}: {text}")
    frame = read_table(str(src), "text", fields=task.fields)
    assert item_texts(frame, "text", task.fields, task.compose) == [
        "Order 1: my card was charged twice", "Order : the app crashes", f"Order {2**53 + 1}: refund"]
    out = tmp_path / f"out.{ext}"
    code, _, err = run_main("classify", src, "-o", out, "--labels", "billing,technical", "--model", llama_dir,
                            "--user-template", "Order {n}: {text}", "--no-verify", "--quiet")
    assert code == 0, err
    if ext == "csv":
        assert [line.split(",")[0] for line in out.read_text().splitlines()] == ["n", "1", "", str(2**53 + 1)]
    elif ext == "jsonl":
        assert [json.loads(line)["n"] for line in out.read_text().splitlines()] == [1, None, 2**53 + 1]
    else:
        column = pq.read_table(out).column("n")
        assert column.type == pa.int64() and column.to_pylist() == [1, None, 2**53 + 1]


@pytest.mark.parametrize("end", ["\r", "\r\n", "\n"])
def test_a_csv_with_any_line_end_reads_the_same_rows(tmp_path, end):
    """Before: a CSV with CR-only line ends (old Mac files, some exports) stopped with `_csv.Error:
    new-line character seen in unquoted field` (the header's parse). Every line end reads the same rows,
    a quoted line break inside a cell kept as it is."""
    src = tmp_path / "in.csv"
    src.write_bytes(end.join(["id,text", "1,hello there", '2,"my card\rwas charged"', "3,third", ""]).encode())
    frame = read_table(str(src), "text")
    assert frame.to_dict("records") == [{"id": "1", "text": "hello there"},
                                        {"id": "2", "text": "my card\rwas charged"},
                                        {"id": "3", "text": "third"}]
    reader = open_table(str(src), "text")
    try:
        assert reader.total_rows == 3
    finally:
        reader.close()
