"""The `--ray` job's input (`slmclassify.ray.reading`): one small file is read by the driver and
handed to Ray as ready blocks; it must give exactly the rows, order and types of Ray's readers."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pytest

ray = pytest.importorskip("ray")

from slmclassify.errors import InputError  # noqa: E402
from slmclassify.ray import reading  # noqa: E402
from slmclassify.ray.dataset import _cut  # noqa: E402


def _inputs(folder) -> dict[str, str]:
    """The same 103 rows as CSV, JSONL and Parquet: ids with leading zeros, a quoted comma, a quoted
    quote, empty texts, non-ASCII, a number and a null in JSONL."""
    ids = [f"{i:03d}" for i in range(103)]
    texts = [f"ticket {i}, café \"{i % 7}\"" if i % 5 else "" for i in range(103)]
    paths = {fmt: str(folder / f"in.{fmt}") for fmt in ("csv", "jsonl", "parquet")}
    pd.DataFrame({"id": ids, "text": texts}).to_csv(paths["csv"], index=False)
    with open(paths["jsonl"], "w") as fh:
        for i, (ident, text) in enumerate(zip(ids, texts)):
            fh.write(json.dumps({"id": ident, "n": i, "text": text, "extra": None if i % 3 else "x"}) + "\n")
    pd.DataFrame({"id": ids, "n": range(103), "text": texts}).to_parquet(paths["parquet"], index=False)
    return paths


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_the_driver_read_gives_the_rows_order_and_types_of_rays_readers(local_ray, tmp_path, fmt):
    path = _inputs(tmp_path)[fmt]
    blocks = reading.driver_blocks(fmt, path, 25)
    assert [b.num_rows for b in blocks] == [25, 25, 25, 25, 3]
    mine = pa.concat_tables(blocks)
    theirs = reading.ray_read(fmt, [path]).to_arrow_refs()
    theirs = pa.concat_tables(ray.get(theirs))
    assert mine.schema == theirs.schema
    assert mine.to_pylist() == theirs.to_pylist()
    if fmt == "csv":
        assert mine["id"].to_pylist()[:2] == ["000", "001"]  # strings, as without Ray


def test_blocks_read_by_the_driver_are_not_cut_again(local_ray, tmp_path):
    """No cut task (and no Ray worker process for it) when the blocks are already cut; any other
    Dataset is still cut into blocks of exactly block_rows rows, in order."""
    path = _inputs(tmp_path)["csv"]
    ready = ray.data.from_blocks(reading.driver_blocks("csv", path, 25))
    assert _cut(ready, 25) is ready
    assert _cut(ready, 30) is not ready  # blocks of 25 are not blocks of 30
    one_block = ray.data.from_blocks([pa.concat_tables(reading.driver_blocks("csv", path, 25))])
    assert _cut(one_block, 25) is not one_block


def test_which_inputs_the_driver_reads(tmp_path, monkeypatch):
    paths = _inputs(tmp_path)
    assert reading.reads_on_driver("csv", [paths["csv"]]) and reading.reads_on_driver("jsonl", [paths["jsonl"]])
    assert not reading.reads_on_driver("csv", [paths["csv"], paths["csv"]])  # a folder's files: Ray's readers
    assert not reading.reads_on_driver("parquet", [paths["parquet"]])  # read by row groups: Ray's reader
    monkeypatch.setattr(reading, "DRIVER_READ_BYTES", 100)
    assert not reading.reads_on_driver("csv", [paths["csv"]])  # a big file: Ray's readers


def test_bad_rows_are_named(local_ray, tmp_path):
    (tmp_path / "bad.csv").write_text("id,text\n1,fine\n2,one, too many\n3,fine\n")
    with pytest.raises(InputError, match=r"bad.csv: not readable as CSV \(line 3: Expected 2 columns, got 3: "
                                         r"2,one, too many\)$"):
        reading.driver_blocks("csv", str(tmp_path / "bad.csv"), 10)
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n{"text": \n{"text": "d"}\n')
    with pytest.raises(InputError, match=r"bad.jsonl: not readable as JSONL \(line 3 is not valid JSON: Expecting value\)$"):
        reading.driver_blocks("jsonl", str(tmp_path / "bad.jsonl"), 10)


def test_a_csv_error_without_a_row_number_still_names_the_line(tmp_path):
    # pyarrow names the row ("Row #3") only when it parsed the file in one block; otherwise the
    # line is found by reading the file again
    from slmclassify.ray.reading import _bad_row

    bad = tmp_path / "bad.csv"
    bad.write_text('id,text\n1,"two\nlines"\n2,one, too many\n3,fine\n')
    error = ValueError("CSV parse error: Expected 2 columns, got 3: 2,one, too many")
    assert _bad_row("csv", str(bad), error) == "line 4: Expected 2 columns, got 3: 2,one, too many"
