"""Unit tests of `slmclassify.io`: formats, reading (strings kept as read, errors named),
`texts_of`, and atomic writing. No model is involved."""

from __future__ import annotations

import io
import json
import math
import sys

import pandas as pd
import pytest

from slmclassify.io import writers
from slmclassify.errors import InputError
from slmclassify.io import read_table, table_format, texts_of, write_table

# --------------------------------------------------------------------------- table_format


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("in.csv", "csv"),
        ("IN.CSV", "csv"),
        ("dir.v2/in.jsonl", "jsonl"),
        ("in.ndjson", "jsonl"),
        ("in.parquet", "parquet"),
        ("in.pq", "parquet"),
        ("-", "csv"),
    ],
)
def test_table_format_from_extension(path, expected):
    assert table_format(path) == expected


def test_table_format_explicit_wins():
    assert table_format("-", "jsonl") == "jsonl"
    assert table_format("-", "parquet") == "parquet"
    assert table_format("data.csv", "jsonl") == "jsonl"


@pytest.mark.parametrize(("path", "shown"), [("book.xlsx", "'.xlsx'"), ("data.txt", "'.txt'"), ("noext", "'(no extension)'")])
def test_table_format_unknown_names_path_and_suffix(path, shown):
    with pytest.raises(InputError) as info:
        table_format(path)
    message = str(info.value)
    assert message.startswith(f"{path}: unknown format {shown}")
    assert message.endswith("(or fmt)")  # the library's name; the CLI's is the flag
    from slmclassify.cli.options import flag_error

    assert str(flag_error(info.value)).endswith("(or --format)")
    assert "\n" not in message


# --------------------------------------------------------------------------- read_table


def test_read_csv_keeps_cells_as_strings(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text('id,text,score,note\n007,hello,1.50,\n0001,"a, b",2,NA\n10,,nan,null\n', encoding="utf-8")
    frame = read_table(str(path), "text")
    assert list(frame.columns) == ["id", "text", "score", "note"]
    assert frame.to_dict("list") == {
        "id": ["007", "0001", "10"],  # leading zeros kept
        "text": ["hello", "a, b", ""],  # empty cell stays '' (keep_default_na=False)
        "score": ["1.50", "2", "nan"],  # not parsed as numbers
        "note": ["", "NA", "null"],  # NA markers are not missing values
    }
    assert all(isinstance(v, str) for col in frame.columns for v in frame[col])


def test_read_csv_strips_bom_and_keeps_unicode(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes("\ufeffid,text\n1,Grüße ✓\n".encode("utf-8"))
    frame = read_table(str(path), "text")
    assert list(frame.columns) == ["id", "text"]
    assert frame["text"].tolist() == ["Grüße ✓"]


def test_read_missing_file(tmp_path):
    path = tmp_path / "nope.csv"
    with pytest.raises(InputError, match=r"^input file not found: .*nope\.csv$"):
        read_table(str(path), "text")


def test_read_missing_text_column_lists_columns(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text("id,body\n1,x\n", encoding="utf-8")
    with pytest.raises(InputError) as info:
        read_table(str(path), "text")
    assert str(info.value) == f"{path}: no column 'text' (use text_column); columns are: id, body"
    from slmclassify.cli.options import flag_error  # the CLI names the flag

    assert str(flag_error(info.value)) == f"{path}: no column 'text' (use --text-column); columns are: id, body"


def test_read_missing_id_column(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text("id,text\n1,x\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"no id column 'ticket'; columns are: id, text"):
        read_table(str(path), "text", id_column="ticket")


def test_read_jsonl_skips_blank_lines_and_counts_them(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"id": "007", "text": "a"}\n\n{"id": "0001", "text": null}\n', encoding="utf-8")
    frame = read_table(str(path), "text")
    assert frame["id"].tolist() == ["007", "0001"]
    assert texts_of(frame, "text") == ["a", ""]

    path.write_text('{"id": 1, "text": "a"}\n\n{"id": 2, text: "b"}\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"in\.jsonl: line 3 is not valid JSON \("):
        read_table(str(path), "text")


UNREADABLE = {
    "csv-empty": ("in.csv", b"", "the file is empty"),
    "csv-blank-lines": ("in.csv", b"  \n\n \t\n", "the file is empty"),
    "csv-bom-only": ("in.csv", b"\xef\xbb\xbf", "the file is empty"),
    "csv-ragged": ("in.csv", b"id,text\n1,a\n2,b,extra,fields\n", "not a readable CSV file ("),
    "jsonl-not-object": ("in.jsonl", b'{"text": "a"}\n[1, 2]\n', "line 2 is not a JSON object"),
    "jsonl-blank": ("in.jsonl", b"\n", "no column 'text' (use text_column); columns are: (none)"),
    "parquet-empty": ("in.parquet", b"", "not a readable Parquet file ("),
    "parquet-garbage": ("in.parquet", b"PAR1 definitely not parquet", "not a readable Parquet file ("),
}


@pytest.mark.parametrize(("name", "content", "message"), UNREADABLE.values(), ids=UNREADABLE.keys())
def test_read_unreadable_file(tmp_path, name, content, message):
    """One line that starts with the file's path and says what is wrong."""
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InputError) as info:
        read_table(str(path), "text")
    assert str(info.value).startswith(f"{path}: {message}")
    assert "\n" not in str(info.value)


def test_read_stdin(monkeypatch):
    data = b'{"id": "007", "text": "from stdin"}\n'
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    frame = read_table("-", "text", fmt="jsonl")
    assert frame.to_dict("list") == {"id": ["007"], "text": ["from stdin"]}


def test_read_stdin_missing_column_is_named_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a,b\n1,2\n"), encoding="utf-8"))
    with pytest.raises(InputError, match=r"^<stdin>: no column 'text'"):
        read_table("-", "text")


BAD_UTF8_CSV = b"id,text\n1,fine\n2,also fine\n3,broken \xff\xfe bytes\n4,after\n"


def test_read_invalid_utf8_replace(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_bytes(BAD_UTF8_CSV)
    frame = read_table(str(path), "text", errors="replace")
    assert frame["text"].tolist() == ["fine", "also fine", "broken \ufffd\ufffd bytes", "after"]


def test_read_invalid_utf8_strict_is_an_input_error(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_bytes(BAD_UTF8_CSV)
    with pytest.raises(InputError):
        read_table(str(path), "text")


def test_read_invalid_utf8_strict_names_row_and_id(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_bytes(BAD_UTF8_CSV)
    with pytest.raises(InputError) as info:
        read_table(str(path), "text", id_column="id")
    assert "row 3 (id 3), column 'text' is not valid UTF-8" in str(info.value)
    assert "pass errors replace" in str(info.value)


def test_read_invalid_utf8_jsonl_strict_names_row(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "bad \xff here"}\n')
    with pytest.raises(InputError, match=r"row 2"):
        read_table(str(path), "text")


# --------------------------------------------------------------------------- texts_of


def test_texts_of_missing_values_become_empty():
    frame = pd.DataFrame({"text": pd.Series(["a", None, float("nan"), 5, "  "], dtype=object)})
    assert texts_of(frame, "text") == ["a", "", "", "5", "  "]


def test_texts_of_pandas_string_column_with_nan():
    frame = pd.DataFrame({"text": ["a", None, "c"]})  # pandas' default string dtype, NaN for missing
    assert texts_of(frame, "text") == ["a", "", "c"]


def test_texts_of_pd_na_becomes_empty():
    frame = pd.DataFrame({"text": pd.array(["a", None], dtype="string")})
    assert texts_of(frame, "text") == ["a", ""]


# --------------------------------------------------------------------------- write_table


def _sample() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": ["007", "0001", "10"],
            "text": ['a, "quoted" text', "line one\nline two", "Grüße ✓ {braces}"],
            "p": [0.25, 0.5, 0.125],
            "flag": [True, False, True],
        }
    )


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_write_table_round_trip_and_no_temp_file(tmp_path, fmt):
    target = tmp_path / f"out.{fmt}"
    frame = _sample()
    write_table(frame, str(target))
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]  # no .partial left behind

    back = read_table(str(target), "text")
    assert list(back.columns) == list(frame.columns)
    assert back["id"].tolist() == ["007", "0001", "10"]
    assert back["text"].tolist() == frame["text"].tolist()
    if fmt == "csv":  # CSV cells come back as the strings written
        assert back["p"].tolist() == ["0.25", "0.5", "0.125"]
        assert back["flag"].tolist() == ["True", "False", "True"]
    else:
        assert back["p"].tolist() == [0.25, 0.5, 0.125]
        assert back["flag"].tolist() == [True, False, True]
    if fmt == "parquet":
        pd.testing.assert_frame_equal(back, frame)


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_write_table_missing_values(tmp_path, fmt):
    target = tmp_path / f"out.{fmt}"
    frame = pd.DataFrame({"text": ["a", "b"], "label": ["x", None], "p": [0.5, float("nan")]})
    write_table(frame, str(target))
    if fmt == "jsonl":
        records = [json.loads(line) for line in target.read_text(encoding="utf-8").splitlines()]
        assert records == [{"text": "a", "label": "x", "p": 0.5}, {"text": "b", "label": None, "p": None}]
    elif fmt == "csv":
        assert target.read_text(encoding="utf-8") == "text,label,p\na,x,0.5\nb,,\n"
    else:
        back = pd.read_parquet(target)
        assert back["label"].iloc[0] == "x" and pd.isna(back["label"].iloc[1])
        assert back["p"].iloc[0] == 0.5 and math.isnan(back["p"].iloc[1])


def test_write_table_replaces_existing_file(tmp_path):
    target = tmp_path / "out.csv"
    target.write_text("old content\n", encoding="utf-8")
    write_table(pd.DataFrame({"text": ["new"]}), str(target))
    assert target.read_text(encoding="utf-8") == "text\nnew\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]


@pytest.mark.parametrize("existed", [False, True])
def test_write_table_failure_leaves_no_partial_and_old_file_intact(tmp_path, monkeypatch, existed):
    target = tmp_path / "out.csv"
    if existed:
        target.write_bytes(b"previous,complete\n1,2\n")

    def half_write(writer, frame):
        writer.fh.write(b"text\nfirst row only\n")
        raise RuntimeError("disk full")

    monkeypatch.setattr(writers, "_write", half_write)
    with pytest.raises(RuntimeError, match="disk full"):
        write_table(pd.DataFrame({"text": ["a", "b"]}), str(target))
    if existed:
        assert target.read_bytes() == b"previous,complete\n1,2\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]
    else:
        assert list(tmp_path.iterdir()) == []


def test_write_table_missing_folder(tmp_path):
    with pytest.raises(InputError, match=r"output folder does not exist: .*missing"):
        write_table(pd.DataFrame({"text": ["a"]}), str(tmp_path / "missing" / "out.csv"))


def test_write_table_unknown_extension_writes_nothing(tmp_path):
    with pytest.raises(InputError, match=r"unknown format '\.xlsx'"):
        write_table(pd.DataFrame({"text": ["a"]}), str(tmp_path / "out.xlsx"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_write_table_to_stdout(capsysbinary, fmt):
    write_table(pd.DataFrame({"id": ["007"], "text": ["ü"]}), "-", fmt)
    out = capsysbinary.readouterr().out
    expected = {"csv": "id,text\n007,ü\n", "jsonl": '{"id":"007","text":"ü"}\n'}[fmt]
    assert out == expected.encode("utf-8")


def test_write_jsonl_keeps_float_precision(tmp_path):
    target = tmp_path / "out.jsonl"
    values = [1.5e-12, 0.123456789012345, 1 - 1.5e-12]
    write_table(pd.DataFrame({"text": ["a", "b", "c"], "p": values}), str(target))
    back = [json.loads(line)["p"] for line in target.read_text(encoding="utf-8").splitlines()]
    assert back == values
