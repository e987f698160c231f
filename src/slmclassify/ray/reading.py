"""The `--ray` job's input: read by this process (the driver) when it is one small file, by Ray's
readers on the workers otherwise.

    one CSV/JSONL file of at most DRIVER_READ_BYTES → read here by Ray's own reader code (one
        pyarrow Table), ordered longest text first and cut into blocks of about equal work
        (`blocks.py`), fed to the actors by this process (`pool.py`): no read task, no cut task
        and no Ray Data executor run, so no Ray worker process is started for them
    a folder, a Parquet file or a bigger file → Ray's readers on the workers (parallel, streamed,
        never held whole here), then cut into blocks by `dataset._cut` (Ray Data)

Why: on a small cluster every task or actor of a run may need a Ray worker process of its own,
and each one imports ray and ray.data (~1.5 s of CPU) while the classifier actors start on the
same cores; reading a few MB here costs milliseconds. Both paths run the same reader code, so they
give the same rows in the same order with the same types (CSV columns as strings, JSONL as Ray's
pandas-based reader types it) and results do not depend on the path (`tests/test_ray_reading.py`).
A bad file fails here with an error naming the line (while the actors load the model).
"""

from __future__ import annotations

import os

import ray

from ..errors import InputError

DRIVER_READ_BYTES = 32 << 20
"""Largest single input file read by the driver (a few hundred thousand short texts); bigger files
and folders are read by Ray's readers on the workers."""


def reads_on_driver(fmt: str, files: list[str]) -> bool:
    """One CSV or JSONL file of at most DRIVER_READ_BYTES (a Parquet file stays with Ray's reader:
    it is not read as a single block)."""
    return fmt in ("csv", "jsonl") and len(files) == 1 and os.path.getsize(files[0]) <= DRIVER_READ_BYTES


def driver_table(fmt: str, path: str):
    """The file as one pyarrow Table, in row order. Read by Ray's own reader (`ray_read`'s
    datasource, its read tasks run here instead of in a worker), so the rows and types are those
    of Ray's readers by construction. Errors name the line."""
    import pyarrow as pa
    from ray.data.block import BlockAccessor

    try:
        source = ray_read(fmt, [path])._logical_plan.dag.datasource
        tables = [BlockAccessor.for_block(block).to_arrow()
                  for task in source.get_read_tasks(1) for block in task()]
    except Exception as exc:  # pyarrow, pandas and json raise many types for a bad file
        raise InputError(f"{path}: not readable as {fmt.upper()} ({_bad_row(fmt, path, exc)})") from None
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def ray_read(fmt: str, files: list[str]) -> ray.data.Dataset:
    """Ray's reader for the format; read tasks reserve no CPU, so actors holding every CPU of a
    small cluster cannot starve them."""
    if fmt == "parquet":
        return ray.data.read_parquet(files, num_cpus=0)
    if fmt == "jsonl":
        return ray.data.read_json(files, lines=True, num_cpus=0)
    return ray.data.read_csv(files, convert_options=_csv_convert(files[0]), num_cpus=0)


def _csv_convert(path: str):
    """Every column as a string, like the single-process reader (so `007` stays `007`)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    with open(path, "rb") as fh:
        names = pacsv.open_csv(fh).schema.names
    return pacsv.ConvertOptions(column_types={n: pa.string() for n in names}, strings_can_be_null=False)


def _bad_row(fmt: str, path: str, exc: Exception) -> str:
    """What is wrong, naming the line: pyarrow's CSV error names it ("Row #N", counting the header);
    for JSONL (read with pandas, whose errors name none) the first line that is not a JSON object."""
    import json
    import re

    first = (str(exc).splitlines() or [type(exc).__name__])[0]
    if fmt == "csv":
        found = re.search(r"Row #(\d+): ", first)
        if found:
            return f"line {found.group(1)}: {first[found.end():]}"
        # pyarrow names the row only when it parsed the file in one block: find it ourselves
        line = _csv_ragged_line(path)
        if line is not None:
            return f"line {line}: {re.sub(r'^CSV parse error: ', '', first)}"
    if fmt == "jsonl":
        with open(path, "rb") as fh:
            for number, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as bad:
                    return f"line {number} is not valid JSON: {getattr(bad, 'msg', bad)}"
                if not isinstance(record, dict):
                    return f"line {number} is not a JSON object"
    return first


def _csv_ragged_line(path: str) -> int | None:
    """The line on which the first record whose column count differs from the header's ends."""
    import csv

    with open(path, newline="", encoding="utf-8", errors="replace") as fh:
        rows = csv.reader(fh)
        header = next(rows, None)
        for row in rows:
            if header is not None and row and len(row) != len(header):
                return rows.line_num
    return None
