"""Read a table a chunk of rows at a time: CSV through pyarrow's streaming reader, JSONL line by
line, Parquet by `iter_batches`; `-` reads stdin the same way (Parquet needs the whole stream).

Invariants: chunks hold exactly `chunk_rows` rows (the last one fewer), whatever the file's block
or row-group layout, so chunk boundaries depend only on row numbers; CSV cells stay strings
(`007` stays `007`, an empty cell stays ""); invalid UTF-8 is named by row, id and column (or
replaced with `errors='replace'`); a ragged CSV row is an error naming the row, never a shifted
table. Memory is bounded by the chunk, not by the file.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import io
import json
import math
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..errors import InputError
from .formats import BAD_BYTE, check_text_encoding, json_text, table_format
from .hashing import file_sha256

_HEAD = 1 << 16  # bytes looked at before reading: encoding check, empty file, CSV header
MAX_CSV_ROW = 1 << 26
"""The longest CSV row (64 MiB) read: pyarrow needs a whole row in one block, and a block is held in memory."""


class _RowTooBig(Exception):
    """A CSV row did not fit in pyarrow's block (the first pass raises the block size and reads again)."""


_SURROGATES = re.compile("[\ud800-\udfff]")


def _bad_text(value: str, errors: str) -> str:
    """Lone surrogates (JSON's "\\ud800") are invalid text: marked, or replaced with U+FFFD."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return _SURROGATES.sub("\ufffd" if errors == "replace" else BAD_BYTE, value)


class _Utf8Stream(io.RawIOBase):
    """A binary stream re-encoded as clean UTF-8: BOM dropped, invalid bytes marked or replaced."""

    def __init__(self, raw, errors: str, head: bytes = b""):
        self.raw, self.pending, self.head = raw, b"", head
        self.decoder = codecs.getincrementaldecoder("utf-8-sig")("replace" if errors == "replace" else "slmclassify-mark")
        self.consumed = 0
        self.sha256 = hashlib.sha256()  # of the raw bytes consumed so far (`--resume` re-checks them)
        self.stopped, self.ended, self.inflight = False, False, 0

    def readable(self) -> bool:
        return True

    def settle(self, timeout: float = 5.0) -> None:
        """Answer end-of-file from now on and wait until the reader has seen it. pyarrow's CSV reader
        reads ahead on a thread of its own, which goes on calling `readinto` after the error that
        ended our iteration (often raised by `open_csv` itself, before there is a reader to close);
        a process that exits with that thread inside Python aborts (`terminate called without an
        active exception`, exit 134) after printing the right error."""
        import time

        self.stopped = True
        deadline = time.monotonic() + timeout
        while (self.inflight or not self.ended) and time.monotonic() < deadline:
            time.sleep(0.002)  # releases the GIL, so the read-ahead thread can take its end-of-file

    def readinto(self, buffer) -> int:
        self.inflight += 1
        try:
            n = self._readinto(buffer)
        finally:
            self.inflight -= 1
        self.ended = self.ended or n == 0
        return n

    def _readinto(self, buffer) -> int:
        # The buffer is filled whole (short only at the end): pyarrow takes what one read returns as
        # its block, and a CSV row must fit in one block.
        out, filled = memoryview(buffer).cast("B"), 0
        while filled < len(out) and not self.stopped:
            if not self.pending:
                block = self.head or self.raw.read(1 << 18)
                self.head = b""
                self.consumed += len(block)
                self.sha256.update(block)
                self.pending = self.decoder.decode(block, final=not block).encode("utf-8")
                if not block and not self.pending:
                    break
            n = min(len(out) - filled, len(self.pending))
            out[filled:filled + n] = self.pending[:n]
            self.pending = self.pending[n:]
            filled += n
        return 0 if self.stopped else filled


@dataclass
class TableReader:
    """An open input table: its columns, and its rows chunk by chunk."""

    path: str
    fmt: str
    text_column: str
    id_column: str | None = None
    errors: str = "strict"
    fields: tuple[str, ...] = ()
    """Columns a multi-field template names (`Task.fields`); `compose` makes each row's item from them
    (then `text_column` is not read)."""
    compose: object = None
    columns: list[str] = field(default_factory=list)
    total_rows: int | None = None
    """Known up front for Parquet and JSONL files; None for CSV and stdin."""
    total_bytes: int | None = None
    _source: object = None
    _kinds: dict = field(default_factory=dict)
    _block_size: int = 1 << 18
    """pyarrow's CSV block: raised (up to `MAX_CSV_ROW`) when the first pass meets a longer row."""
    _whole_digest: dict | None = None
    """A Parquet file's `read_digest` (the whole file, hashed once)."""

    @property
    def name(self) -> str:
        return "<stdin>" if self.path == "-" else self.path

    @property
    def bytes_read(self) -> int:
        return getattr(self._source, "consumed", 0)

    def read_digest(self) -> dict:
        """How many bytes of the input file were consumed so far and their SHA-256, recorded with each
        chunk so that `--resume` can check that what was already read is still in the file. A Parquet
        file is read by row groups from anywhere in it: its digest covers the whole file."""
        if self.fmt == "parquet":
            if self._whole_digest is None:
                self._whole_digest = {"bytes": self.total_bytes, "sha256": file_sha256(self.path, self.total_bytes)}
            return self._whole_digest
        return {"bytes": self._source.consumed, "sha256": self._source.sha256.hexdigest()}

    def json_kinds(self) -> dict[str, set[str]]:
        """For JSONL: the Python types seen per column (the whole file; the first chunk for stdin)."""
        return self._kinds

    # ------------------------------------------------------------------ opening

    def open(self) -> TableReader:
        raw = sys.stdin.buffer if self.path == "-" else None
        if raw is None:
            if not os.path.isfile(self.path):
                raise InputError(f"input file not found: {self.path}")
            self.total_bytes = os.path.getsize(self.path)
        if self.fmt == "parquet":
            self._open_parquet(raw)
        else:
            raw = raw or open(self.path, "rb")  # noqa: SIM115 - closed by close()
            head = raw.read(_HEAD)
            check_text_encoding(head, self.name)
            self._source = _Utf8Stream(raw, self.errors, head)
            self._raw = raw
            if self.fmt == "csv":
                self._open_csv(head)
            else:
                self._open_jsonl(head)
        self._check_columns()
        return self

    def close(self) -> None:
        raw = getattr(self, "_raw", None)
        if raw is not None and raw is not sys.stdin.buffer:
            raw.close()

    def _check_unique_columns(self) -> None:
        seen: set = set()
        repeated = next((c for c in self.columns if c in seen or seen.add(c)), None)
        if repeated is not None:  # pyarrow and pandas cannot pick one of them (a KeyError deep inside)
            raise InputError(f"{self.name}: column {repeated!r} appears {self.columns.count(repeated)} times in the "
                             "header; give each column its own name")

    def _check_columns(self) -> None:
        self._check_unique_columns()
        missing = [f for f in self.fields if f not in self.columns]
        if missing:
            raise InputError(f"{self.name}: no column {missing[0]!r}, which the user template names as "
                             f"{{{missing[0]}}}; columns are: {', '.join(map(str, self.columns)) or '(none)'}")
        if not self.fields and self.text_column not in self.columns:
            cols = ", ".join(map(str, self.columns)) or "(none)"
            raise InputError("{name}: no column {column!r} (use {field}); columns are: {cols}",
                             names={"field": "text_column"}, name=self.name, column=self.text_column, cols=cols)
        if self.id_column is not None and self.id_column not in self.columns:
            raise InputError(f"{self.name}: no id column {self.id_column!r}; columns are: {', '.join(map(str, self.columns))}")

    def _open_parquet(self, raw) -> None:
        import pyarrow.parquet as pq

        try:
            source = io.BytesIO(raw.read()) if raw is not None else self.path
            self._parquet = pq.ParquetFile(source)
        except Exception as exc:  # pyarrow raises many types for a bad file
            raise InputError(f"{self.name}: not a readable Parquet file ({str(exc).splitlines()[0]})") from None
        self.schema = self._parquet.schema_arrow
        self.columns = list(self.schema.names)
        self.total_rows = self._parquet.metadata.num_rows

    def _open_csv(self, head: bytes) -> None:
        text = head.decode("utf-8", "replace").removeprefix("\ufeff")
        if not text.strip() and len(head) < _HEAD:
            raise InputError(f"{self.name}: the file is empty (expected a CSV header row)")
        first = next(csv.reader(io.StringIO(text.lstrip("\r\n"), newline="")), [])  # any line end: \n, \r\n, \r
        self.columns = first
        self._check_unique_columns()
        if self.path != "-":  # a quick first pass (pyarrow only): the row count, ragged rows, invalid UTF-8
            while True:
                try:
                    self.total_rows = self._check_csv()
                    break
                except _RowTooBig:  # a row longer than pyarrow's block: read the file again in bigger blocks
                    if self._block_size >= MAX_CSV_ROW:
                        raise InputError(f"{self.name}: a row is larger than {MAX_CSV_ROW >> 20} MiB, the largest "
                                         "CSV row read; give such texts as JSONL or Parquet") from None
                    self._block_size *= 4
                    self._reopen()
            self._reopen()

    def _reopen(self) -> None:
        self._raw.close()
        self._source = _Utf8Stream(open(self.path, "rb"), self.errors)  # noqa: SIM115
        self._raw = self._source.raw

    def _check_csv(self) -> int:
        """The row count; refuses invalid UTF-8 (and, in `_csv_tables`, ragged rows) anywhere."""
        import pyarrow.compute as pc

        count = 0
        for table in self._csv_tables(1 << 16):
            if self.errors != "replace":
                for column in table.column_names:
                    marked = pc.match_substring(table[column], BAD_BYTE)
                    if pc.any(marked).as_py():
                        row = count + pc.index(marked, True).as_py()
                        ident = f" (id {table[self.id_column][row - count].as_py()})" if self.id_column in table.column_names else ""
                        raise InputError("{name}: row {row}{ident}, column {column!r} is not valid UTF-8; fix the "
                                         "file or pass {errors} replace", names={"errors": "errors"}, name=self.name,
                                         row=row + 1, ident=ident, column=column)
            count += len(table)
        return count

    def _open_jsonl(self, head: bytes) -> None:
        if self.path == "-":  # one pass only: columns and types from the first chunk
            self._pending_records = []
            for line_no, record in self._records():
                self._pending_records.append((line_no, record))
                if len(self._pending_records) >= 1024:
                    break
            records = [r for _, r in self._pending_records]
        else:  # a quick first pass over the file: every column, their types, the row count, bad lines
            records = (r for _, r in self._records())
        columns: dict[str, None] = {}
        kinds: dict[str, set[str]] = {}
        count = 0
        for record in records:
            count += 1
            for key, value in record.items():
                columns.setdefault(key, None)
                kinds.setdefault(key, set()).add(_kind(value))
        self.columns, self._kinds = list(columns), kinds
        if self.path != "-":
            self.total_rows = count
            self._source = _Utf8Stream(open(self.path, "rb"), self.errors)  # noqa: SIM115
            self._raw.close()
            self._raw = self._source.raw

    # ------------------------------------------------------------------ chunks

    def chunks(self, chunk_rows: int, skip_rows: int = 0) -> Iterator[tuple[int, pd.DataFrame]]:
        """(first row number, frame of up to `chunk_rows` rows), in order, after `skip_rows` rows."""
        source = {"csv": self._csv_tables, "jsonl": self._jsonl_frames, "parquet": self._parquet_tables}[self.fmt]
        start = 0
        for piece in _rechunk(source(chunk_rows), chunk_rows):
            n = len(piece)
            if n and start + n > skip_rows:
                frame = self._to_frame(piece, start)
                if start < skip_rows:  # only when chunk sizes changed, which resume refuses
                    frame = frame.iloc[skip_rows - start :]
                yield max(start, skip_rows), frame
            start += n

    def _to_frame(self, piece, start: int) -> pd.DataFrame:
        frame = piece if isinstance(piece, pd.DataFrame) else _arrow_frame(piece)
        frame.index = pd.RangeIndex(start, start + len(frame))
        if self.errors != "replace" and self.fmt != "parquet":
            _check_utf8(frame, self.name, self.id_column)
        return frame

    def _csv_tables(self, chunk_rows: int):
        import pyarrow as pa
        import pyarrow.csv as pcsv

        bad: list = []

        def invalid(row):
            bad.append(row)
            return "error"

        try:
            reader = pcsv.open_csv(
                self._source,
                read_options=pcsv.ReadOptions(use_threads=False, block_size=self._block_size),
                parse_options=pcsv.ParseOptions(newlines_in_values=True, invalid_row_handler=invalid),
                convert_options=pcsv.ConvertOptions(
                    column_types={c: pa.string() for c in self.columns}, strings_can_be_null=False,
                    quoted_strings_can_be_null=False, null_values=[]),
            )
            for batch in reader:
                yield pa.Table.from_batches([batch])
        except pa.ArrowInvalid as exc:
            if "straddl" in str(exc):  # a row (with its quoted newlines) longer than the block
                if self.path != "-" and self._block_size < MAX_CSV_ROW:
                    raise _RowTooBig from None
                limit = f"{self._block_size >> 20} MiB" if self.path != "-" else "256 KiB when read from stdin"
                raise InputError(f"{self.name}: a row is larger than {limit}, the largest CSV row read; "
                                 "give such texts as JSONL or Parquet (or pass the file itself)") from None
            if bad:
                row = bad[0]
                detail = (f"row {row.number - 1} has {row.actual_columns} fields, the header has "
                          f"{row.expected_columns}: {row.text[:60]!r}; quote fields that contain commas")
            else:
                detail = str(exc).splitlines()[0]
            raise InputError(f"{self.name}: not a readable CSV file ({detail})") from None
        finally:  # an error, or the consumer stopped early: pyarrow may still be reading ahead
            if not self._source.ended:
                self._source.settle()

    def _records(self) -> Iterator[tuple[int, dict]]:
        for line_no, raw in enumerate(self._source_lines(), start=1):
            line = raw.decode("utf-8")
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{self.name}: line {line_no} is not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise InputError(f"{self.name}: line {line_no} is not a JSON object")
            yield line_no, {k: _bad_text(v, self.errors) if isinstance(v, str) else v for k, v in record.items()}

    def _source_lines(self):
        # One buffered reader per source: a second one would lose what the first had buffered.
        if getattr(self, "_lines_of", None) is not self._source:
            self._lines, self._lines_of = io.BufferedReader(self._source, buffer_size=1 << 20), self._source
        for line in self._lines:  # not `yield from`: closing this generator must not close the reader
            yield line

    def _jsonl_frames(self, chunk_rows: int):
        pending = getattr(self, "_pending_records", [])
        self._pending_records = []

        def all_records():
            yield from pending
            if pending:  # stdin: the first records were read while opening
                yield from ((n + pending[-1][0], r) for n, r in self._records())
            else:
                yield from self._records()

        rows: list[dict] = []
        for line_no, record in all_records():
            extra = [k for k in record if k not in self._kinds]
            if extra:
                raise InputError(f"{self.name}: line {line_no} has column {extra[0]!r}, not in the first lines "
                                 "read from stdin; pass the file itself instead of stdin")
            rows.append(record)
            if len(rows) == chunk_rows:
                yield self._records_frame(rows)
                rows = []
        yield self._records_frame(rows)

    def _records_frame(self, rows: list[dict]) -> pd.DataFrame:
        # object columns keep each JSON value as it was (7 stays 7, null stays None)
        return pd.DataFrame({c: pd.Series([r.get(c) for r in rows], dtype=object) for c in self.columns})

    def _parquet_tables(self, chunk_rows: int):
        import pyarrow as pa

        for batch in self._parquet.iter_batches(batch_size=chunk_rows):
            yield pa.Table.from_batches([batch])

    # ------------------------------------------------------------------ texts

    def texts(self, frame: pd.DataFrame) -> list[str]:
        """The text column of a chunk as strings (see `texts_of`); bytes are decoded as UTF-8. With
        `fields`, each row's item composed from those columns (all empty: an empty item)."""
        return item_texts(frame, self.text_column, self.fields, self.compose, name=self.name, errors=self.errors,
                          id_column=self.id_column)


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    return "json"


def _rechunk(pieces, chunk_rows: int):
    """Re-cut a stream of tables/frames into pieces of exactly `chunk_rows` rows (the last fewer)."""
    import pyarrow as pa

    buffer, buffered = [], 0
    for piece in pieces:
        if isinstance(piece, pd.DataFrame):  # JSONL frames already have the right size
            if len(piece) or buffered == 0:
                yield piece
            continue
        buffer.append(piece)
        buffered += len(piece)
        while buffered >= chunk_rows:
            table = pa.concat_tables(buffer)
            yield table.slice(0, chunk_rows)
            rest = table.slice(chunk_rows)
            buffer, buffered = ([rest] if len(rest) else []), len(rest)
    if buffer:
        yield pa.concat_tables(buffer)


def _check_utf8(frame: pd.DataFrame, name: str, id_column: str | None) -> None:
    for column in frame.columns:
        values = frame[column]
        if values.dtype != object and not pd.api.types.is_string_dtype(values):
            continue
        if values.dtype == object:
            marked = np.fromiter((isinstance(v, str) and BAD_BYTE in v for v in values), dtype=bool, count=len(values))
        else:
            marked = values.str.contains(BAD_BYTE, regex=False, na=False).to_numpy(dtype=bool)
        if marked.any():
            row = frame.index[marked][0]
            ident = f" (id {frame.at[row, id_column]})" if id_column else ""
            raise InputError("{name}: row {row}{ident}, column {column!r} is not valid UTF-8; fix the file or pass "
                             "{errors} replace", names={"errors": "errors"}, name=name, row=row + 1, ident=ident,
                             column=column)


def _arrow_frame(table) -> pd.DataFrame:
    """An Arrow table as a frame whose list and struct cells are Python values: pandas turns a
    list<int64> with a null into floats with NaN (`[1.0, NaN, 3.0]`), which the model would have read
    and the output written; the cell is `[1, None, 3]`, JSON text `[1, null, 3]`. Integer columns
    keep integers with their nulls (pandas' nullable integer types): as floats, `int64 [1, null,
    2**53 + 1]` became `1.0`, NaN and `9007199254740992.0`, another number."""
    import pyarrow as pa

    frame = table.to_pandas(types_mapper=_nullable_integers().get)
    for i, field in enumerate(table.schema):
        if pa.types.is_nested(field.type):
            frame.isetitem(i, pd.Series(table.column(i).to_pylist(), index=frame.index, dtype=object))
    return frame


def _nullable_integers() -> dict:
    """Arrow's integer types → pandas' nullable integer types (`_arrow_frame`)."""
    import pyarrow as pa

    return {pa.int8(): pd.Int8Dtype(), pa.int16(): pd.Int16Dtype(), pa.int32(): pd.Int32Dtype(),
            pa.int64(): pd.Int64Dtype(), pa.uint8(): pd.UInt8Dtype(), pa.uint16(): pd.UInt16Dtype(),
            pa.uint32(): pd.UInt32Dtype(), pa.uint64(): pd.UInt64Dtype()}


def _as_text(value, errors: str) -> str | None:
    """One cell as item text; None for a value that is not UTF-8 text (bytes under strict)."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(value).decode("utf-8", "replace") if errors == "replace" else None
    if isinstance(value, (np.ndarray, list, tuple, dict)):  # a list as the text: scored as its JSON text
        return json_text(value)
    return str(value)


def texts_of(frame: pd.DataFrame, text_column: str, *, name: str = "input", errors: str = "strict",
             id_column: str | None = None) -> list[str]:
    """The text column as strings: missing values become empty texts, numbers their digits,
    lists and objects their JSON text, binary cells are decoded as UTF-8."""
    texts = []
    for row, value in zip(frame.index, frame[text_column]):
        text = _as_text(value, errors)
        if text is None or (BAD_BYTE in text and errors != "replace"):
            ident = f" (id {frame.at[row, id_column]})" if id_column else ""
            raise InputError("{name}: row {row}{ident}, column {column!r} is not valid UTF-8; fix the file or pass "
                             "{errors} replace", names={"errors": "errors"}, name=name, row=row + 1, ident=ident,
                             column=text_column)
        texts.append(text)
    return texts


def item_texts(frame: pd.DataFrame, text_column: str, fields: tuple[str, ...] = (), compose=None, *,
               name: str = "input", errors: str = "strict", id_column: str | None = None) -> list[str]:
    """Each row's item: its text column (`texts_of`), or with `fields` (`Task.fields` of a multi-field
    template) composed from those columns by `compose` (`Task.compose`; all empty: an empty item)."""
    if not fields:
        return texts_of(frame, text_column, name=name, errors=errors, id_column=id_column)
    columns = {f: texts_of(frame, f, name=name, errors=errors, id_column=id_column) for f in fields}
    return [compose({f: columns[f][k] for f in fields}) for k in range(len(frame))]


def open_table(path: str, text_column: str, fmt: str | None = None, errors: str = "strict",
               id_column: str | None = None, fields: tuple[str, ...] = (), compose=None) -> TableReader:
    """Open `path` for chunked reading; checks the file, its encoding and its columns (`fields` and
    `compose`: items of several columns, see `TableReader`)."""
    check_input_kind(path)
    return TableReader(path, table_format(path, fmt), text_column, id_column, errors, tuple(fields), compose).open()


def check_input_kind(path: str) -> None:
    """A folder or a FIFO is named as such (not as a file not found, or by its missing extension)."""
    if path == "-" or not os.path.exists(path):
        return
    if os.path.isdir(path):
        raise InputError(f"input {path} is a folder, not a file; give a .csv, .jsonl or .parquet file "
                         "(folders of files are read by --ray)")
    if not os.path.isfile(path):
        raise InputError(f"input {path} is not a regular file (a pipe or a device), and a file is read twice "
                         f"(a check, then the rows); pipe it to stdin instead: slmclassify classify - --format csv "
                         f"... < {path}")


def read_table(path: str, text_column: str, fmt: str | None = None, errors: str = "strict",
               id_column: str | None = None, fields: tuple[str, ...] = ()) -> pd.DataFrame:
    """The whole table at once (for small files: evaluate, verify, bench); same rules as the chunks
    (`fields`: the columns a multi-field template names must exist, and are checked instead of `text_column`)."""
    reader = open_table(path, text_column, fmt, errors, id_column, fields)
    try:
        frames = [frame for _, frame in reader.chunks(1 << 16)]
    finally:
        reader.close()
    if not frames:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in reader.columns})
    frame = pd.concat(frames) if len(frames) > 1 else frames[0]
    if errors != "replace":
        for column in fields or (text_column,):
            texts_of(frame, column, name=reader.name, id_column=id_column)
    return frame.reset_index(drop=True)
