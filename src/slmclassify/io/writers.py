"""Write a table chunk by chunk: CSV rows, JSONL lines, Parquet row groups.

A chunk's bytes depend only on the chunk (no column-wide formatting across chunks), so a file
written in one go and one written across interrupted, resumed runs are byte-identical. Parquet
cannot be appended to once its footer is missing, so a resumable run keeps the finished chunks
as an Arrow IPC stream (`ipc=True`: schema, then one record batch per chunk, each appended
whole) and `ipc_to_parquet` turns it into the Parquet file, one row group per chunk, at the end.
Files are created with `open()`, so their mode follows the user's umask.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import InputError
from .formats import json_text, table_format

_ARROW_KINDS = {"str": "string", "int": "int64", "float": "float64", "bool": "bool"}


def parquet_schema(reader, result_fields: list):
    """The Parquet schema of the output: the input's columns as read, then the result columns.

    CSV columns are strings; Parquet keeps its own types; a JSONL column takes the one type of its
    values (ints with floats → float64), and a column that mixes types, or holds lists or
    objects, is stored as JSON text.
    """
    import pyarrow as pa

    if reader.fmt == "parquet":
        fields = list(reader.schema)
    elif reader.fmt == "csv":
        fields = [pa.field(c, pa.string()) for c in reader.columns]
    else:
        fields = [pa.field(c, pa.type_for_alias(_jsonl_arrow_kind(reader.json_kinds().get(c, set()))))
                  for c in reader.columns]
    return pa.schema(fields + list(result_fields))


def _jsonl_arrow_kind(kinds: set[str]) -> str:
    kinds = kinds - {"null"}
    if kinds == {"int", "float"}:
        return "float64"
    if len(kinds) == 1 and next(iter(kinds)) in _ARROW_KINDS:
        return _ARROW_KINDS[next(iter(kinds))]
    return "string"  # mixed, lists, objects, or only nulls: JSON text


def _fit_to_schema(frame: pd.DataFrame, schema, name: str):
    """A chunk as an Arrow table of `schema`; JSON-text columns get their values as JSON."""
    import pyarrow as pa

    columns = []
    for field in schema:
        values = frame[field.name]
        if pa.types.is_string(field.type) and values.dtype == object:
            values = [v if v is None or isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)
                      for v in values]
        try:
            columns.append(pa.array(values, type=field.type, from_pandas=True))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise InputError(f"{name}: column {field.name!r} changes type after the first rows read "
                             f"({str(exc).splitlines()[0]}); write .jsonl or .csv instead") from None
    return pa.Table.from_arrays(columns, schema=schema)


def _csv_cells(frame: pd.DataFrame, name: str, errors: str) -> pd.DataFrame:
    """The chunk with list/object cells as their JSON text and binary cells as UTF-8 text: the text
    the model saw, where pandas would write numpy's `['a' 'b']` and Python's `b'hello'`. Binary
    cells that are not UTF-8 are refused (or their bytes replaced under errors='replace')."""
    out = frame
    for column in frame.columns:
        values = frame[column]
        if values.dtype != object or not any(isinstance(v, _NOT_TEXT) for v in values):
            continue
        cells = []
        for row, value in zip(frame.index, values):
            if isinstance(value, (bytes, bytearray)):
                try:
                    value = bytes(value).decode("utf-8", "replace" if errors == "replace" else "strict")
                except UnicodeDecodeError:
                    raise InputError("cannot write {name} as CSV: row {row}, column {column!r} holds bytes that are "
                                     "not UTF-8 text; write .parquet, or pass {errors} replace",
                                     names={"errors": "errors"}, name=name, row=row + 1, column=column) from None
            elif isinstance(value, _NOT_TEXT):
                value = json_text(value)
            cells.append(value)
        if out is frame:
            out = frame.copy(deep=False)
        out[column] = pd.Series(cells, index=frame.index, dtype=object)
    return out


_NOT_TEXT = (bytes, bytearray, np.ndarray, list, tuple, dict)


class ChunkWriter:
    """Appends chunks of one table to a binary file handle."""

    def __init__(self, fh, fmt: str, schema=None, header: bool = True, ipc: bool = False, name: str = "output",
                 errors: str = "strict"):
        self.fh, self.fmt, self.schema, self.header, self.ipc, self.name = fh, fmt, schema, header, ipc, name
        self.errors = errors
        self._parquet = None
        if fmt == "parquet" and ipc and header:
            fh.write(schema.serialize().to_pybytes())

    def write(self, frame: pd.DataFrame) -> None:
        if self.fmt == "csv":
            frame = _csv_cells(frame, self.name, self.errors)
            self.fh.write(frame.to_csv(index=False, header=self.header).encode("utf-8"))
        elif self.fmt == "jsonl":
            if len(frame):
                text = frame.to_json(orient="records", lines=True, force_ascii=False, double_precision=15)
                self.fh.write(text.encode("utf-8") + (b"" if text.endswith("\n") else b"\n"))
        else:
            import pyarrow.parquet as pq

            table = _fit_to_schema(frame, self.schema, self.name)
            if self.ipc:
                for batch in table.combine_chunks().to_batches():
                    self.fh.write(batch.serialize().to_pybytes())
            else:
                if self._parquet is None:
                    self._parquet = pq.ParquetWriter(self.fh, self.schema)
                self._parquet.write_table(table)
        self.header = False

    def close(self) -> None:
        """Finish the format (the Parquet footer); the handle stays open."""
        if self.fmt == "parquet" and not self.ipc:
            import pyarrow.parquet as pq

            if self._parquet is None:
                self._parquet = pq.ParquetWriter(self.fh, self.schema)
            self._parquet.close()
        elif self.fmt == "csv" and self.header:  # no rows at all: still the header line
            self.fh.write(pd.DataFrame(columns=self.schema).to_csv(index=False).encode("utf-8"))
            self.header = False


def ipc_to_parquet(ipc_path: str, parquet_path: str) -> None:
    """Turn a chunk log (Arrow IPC stream) into a Parquet file, one row group per chunk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pa.memory_map(ipc_path) as source, open(parquet_path, "wb") as out:
        reader = pa.ipc.open_stream(source)
        with pq.ParquetWriter(out, reader.schema) as writer:
            for batch in reader:
                writer.write_batch(batch)


def write_error(path: str, exc: OSError) -> InputError:
    return InputError(f"cannot write {path}: {exc.strerror or exc}")


def write_table(frame: pd.DataFrame, path: str, fmt: str | None = None) -> None:
    """Write a whole table; to a file atomically (`PATH.partial`, renamed when complete)."""
    fmt = table_format(path, fmt)
    schema = None
    if fmt == "parquet":
        import pyarrow as pa

        schema = pa.Schema.from_pandas(frame, preserve_index=False)
    elif fmt == "csv":
        schema = list(frame.columns)
    if path == "-":
        writer = ChunkWriter(sys.stdout.buffer, fmt, schema)
        _write(writer, frame)
        sys.stdout.buffer.flush()
        return
    target = Path(path)
    if not target.parent.exists():
        raise InputError(f"output folder does not exist: {target.parent}")
    with atomic_output(path) as fh:
        _write(ChunkWriter(fh, fmt, schema, name=path), frame)


@contextmanager
def atomic_output(path: str) -> Iterator:
    """A binary file handle on `PATH.partial`, renamed to PATH when the block completes; removed
    if it fails (an OSError becomes the one-line `write_error`)."""
    tmp = f"{path}.partial"
    try:
        with open(tmp, "wb") as fh:
            yield fh
        os.replace(tmp, path)
    except OSError as exc:
        raise write_error(path, exc) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _write(writer: ChunkWriter, frame: pd.DataFrame) -> None:
    if len(frame):
        writer.write(frame)
    writer.close()
