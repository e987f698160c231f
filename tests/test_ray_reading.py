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
from slmclassify.ray.blocks import cut_blocks  # noqa: E402


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
    blocks = cut_blocks(reading.driver_table(fmt, path), 25)
    assert [b.num_rows for b in blocks] == [25, 25, 25, 25, 3]
    mine = pa.concat_tables(blocks)
    theirs = reading.ray_read(fmt, [path]).to_arrow_refs()
    theirs = pa.concat_tables(ray.get(theirs))
    assert mine.schema == theirs.schema
    assert mine.to_pylist() == theirs.to_pylist()
    if fmt == "csv":
        assert mine["id"].to_pylist()[:2] == ["000", "001"]  # strings, as without Ray


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
        reading.driver_table("csv", str(tmp_path / "bad.csv"))
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n{"text": \n{"text": "d"}\n')
    with pytest.raises(InputError, match=r"bad.jsonl: not readable as JSONL \(line 3 is not valid JSON: Expecting value\)$"):
        reading.driver_table("jsonl", str(tmp_path / "bad.jsonl"))


def test_a_csv_error_without_a_row_number_still_names_the_line(tmp_path):
    # pyarrow names the row ("Row #3") only when it parsed the file in one block; otherwise the
    # line is found by reading the file again
    from slmclassify.ray.reading import _bad_row

    bad = tmp_path / "bad.csv"
    bad.write_text('id,text\n1,"two\nlines"\n2,one, too many\n3,fine\n')
    error = ValueError("CSV parse error: Expected 2 columns, got 3: 2,one, too many")
    assert _bad_row("csv", str(bad), error) == "line 4: Expected 2 columns, got 3: 2,one, too many"


def test_rows_go_out_longest_first_and_come_back_in_input_order():
    """`blocks.py`: the driver sends the rows of a file it read longest text first (equal lengths
    in input order, missing and empty texts last), so each block holds rows of about one length;
    `restore` puts the rows that come back in that order where they were."""
    import numpy as np

    from slmclassify.ray.blocks import _sort_keys, _work, restore, spread

    def longest_first(table, column="text"):  # the order `spread` sends the rows in
        return spread(table, column, block_rows=1000, actors=1)[1]

    table = pa.table({"id": list(range(6)), "text": ["abc", "ten chars!", "", None, "ten chars?", "héllo"]})
    order = longest_first(table, "text")
    assert order.tolist() == [1, 4, 5, 0, 2, 3]  # "héllo" is 5 characters, not 6 bytes
    sent = table.take(order)
    assert [b.column("id").to_pylist() for b in cut_blocks(sent, 2)] == [[1, 4], [5, 0], [2, 3]]
    assert restore(sent, order).equals(table)
    assert longest_first(table, "body") is None  # no such column: the classifier names the problem
    # work per sorted row: length + ROW_CHARS; none for a repeat of the row before nor an empty/missing text
    assert _work(_sort_keys(table, "text"), order).tolist() == [74, 74, 69, 67, 0, 0]
    twice = pa.table({"text": ["aa", "b", "aa"]})
    assert _work(_sort_keys(twice, "text"), longest_first(twice, "text")).tolist() == [66, 0, 65]
    numbers = pa.table({"text": [7, 12345, None]})  # JSONL may type a column as numbers
    assert longest_first(numbers, "text").tolist() == [1, 0, 2]
    blocks, order = spread(numbers, "text", block_rows=2, actors=2)
    assert order.tolist() == [1, 0, 2] and restore(pa.concat_tables(blocks), order).equals(numbers)
    empty = table.slice(0, 0)
    assert restore(empty.take(longest_first(empty, "text")), np.array([], dtype=np.int64)).num_rows == 0


def test_the_driver_cuts_blocks_of_about_equal_work_longest_first():
    """`blocks.spread`: equal rows per block gave one actor the 150 longest of the article's 600
    tickets (half of the work: 51 s against 30 s for the 450 others). Blocks now hold about equal
    work (a repeated text counts once: it is run once), at least 4 per actor, each of at most
    block_rows rows, longest first; put back together they are the input, in order."""
    from slmclassify.ray.blocks import ROW_CHARS, restore, spread

    texts = ["a" * 2000] * 5 + [f"{i:03d}" + "b" * 297 for i in range(60)] + [f"{i:03d}" + "c" * 57 for i in range(335)]
    table = pa.table({"id": list(range(400)), "text": texts[::-1]})  # shortest first in the file
    blocks, order = spread(table, "text", block_rows=150, actors=2)
    assert [len(t) for t in blocks[0].column("text").to_pylist()][:5] == [2000] * 5
    assert sum(b.num_rows for b in blocks) == 400 and max(b.num_rows for b in blocks) <= 150
    assert len(blocks) >= 8
    work = [sum(len(t) + ROW_CHARS for t in set(b.column("text").to_pylist())) for b in blocks]
    assert max(work) < 1.6 * sum(work) / len(work), work
    assert restore(pa.concat_tables(blocks), order).equals(table)
    blocks, order = spread(table, "body", block_rows=150, actors=2)  # no such column: input order
    assert order is None and [b.num_rows for b in blocks] == [150, 150, 100]
