"""Read and write the user's tables (CSV, JSONL, Parquet; `-` for stdin/stdout).

Every input column is kept as read (CSV cells stay strings, so ids keep leading zeros);
output is written to a temporary file and renamed, so an interrupted run never leaves a
complete-looking file behind.
"""

from __future__ import annotations

import codecs
import io
import json
import os
import sys
import tempfile
from pathlib import Path

import pandas as pd

from .errors import InputError

FORMATS = ("csv", "jsonl", "parquet")
# Invalid UTF-8 bytes are decoded to this noncharacter first, so the row that held them can be
# named after parsing (surrogates would not survive pandas' or pyarrow's string handling).
_BAD_BYTE = "\U0010fffe"
codecs.register_error("slmclassify-mark", lambda exc: (_BAD_BYTE, exc.end))


def table_format(path: str, explicit: str | None = None) -> str:
    """The format of `path` from its extension (or `explicit`, needed for `-`)."""
    if explicit:
        return explicit
    if path == "-":
        return "csv"
    suffix = Path(path).suffix.lower()
    found = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}.get(suffix)
    if found is None:
        raise InputError(f"{path}: unknown format {suffix or '(no extension)'!r}; use .csv, .jsonl or .parquet (or --format)")
    return found


def read_table(path: str, text_column: str, fmt: str | None = None, errors: str = "strict",
               id_column: str | None = None) -> pd.DataFrame:
    """Read a table and check its text column. `errors='replace'` replaces invalid UTF-8."""
    fmt = table_format(path, fmt)
    name = "<stdin>" if path == "-" else path
    if path != "-" and not os.path.isfile(path):
        raise InputError(f"input file not found: {path}")
    raw = sys.stdin.buffer.read() if path == "-" else None
    if fmt == "parquet":
        try:
            frame = pd.read_parquet(io.BytesIO(raw) if raw is not None else path)
        except Exception as exc:  # pyarrow raises many types for a bad file
            raise InputError(f"{name}: not a readable Parquet file ({str(exc).splitlines()[0]})") from None
    else:
        if raw is None:
            raw = Path(path).read_bytes()
        text = raw.decode("utf-8", errors="replace" if errors == "replace" else "slmclassify-mark")
        text = text.removeprefix("\ufeff")
        frame = _parse_text(text, fmt, name)
    if text_column not in frame.columns:
        cols = ", ".join(map(str, frame.columns)) or "(none)"
        raise InputError(f"{name}: no column {text_column!r} (use --text-column); columns are: {cols}")
    if id_column is not None and id_column not in frame.columns:
        raise InputError(f"{name}: no id column {id_column!r}; columns are: {', '.join(map(str, frame.columns))}")
    if errors != "replace":
        _check_utf8(frame, name, id_column)
    return frame


def _parse_text(text: str, fmt: str, name: str) -> pd.DataFrame:
    if fmt == "csv":
        if not text.strip():
            raise InputError(f"{name}: the file is empty (expected a CSV header row)")
        try:
            return pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
        except (pd.errors.ParserError, ValueError) as exc:
            raise InputError(f"{name}: not a readable CSV file ({str(exc).splitlines()[0]})") from None
    records = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{name}: line {line_no} is not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise InputError(f"{name}: line {line_no} is not a JSON object")
        records.append(record)
    return pd.DataFrame.from_records(records)


def _check_utf8(frame: pd.DataFrame, name: str, id_column: str | None) -> None:
    for column in frame.columns:
        values = frame[column]
        if values.dtype != object and not pd.api.types.is_string_dtype(values):
            continue
        for row, value in enumerate(values):
            if isinstance(value, str) and _BAD_BYTE in value:
                ident = f" (id {frame[id_column].iloc[row]})" if id_column else ""
                raise InputError(
                    f"{name}: row {row + 1}{ident}, column {column!r} is not valid UTF-8; "
                    "fix the file or pass --errors replace"
                )


def texts_of(frame: pd.DataFrame, text_column: str) -> list[str]:
    """The text column as strings; missing values become empty texts."""
    return ["" if pd.isna(value) else str(value) for value in frame[text_column]]


def write_table(frame: pd.DataFrame, path: str, fmt: str | None = None) -> None:
    """Write atomically: a temporary file beside the target, renamed when complete."""
    fmt = table_format(path, fmt)
    if path == "-":
        buffer = io.BytesIO()
        _write(frame, buffer, fmt)
        sys.stdout.buffer.write(buffer.getvalue())
        sys.stdout.buffer.flush()
        return
    target = Path(path)
    if not target.parent.exists():
        raise InputError(f"output folder does not exist: {target.parent}")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            _write(frame, fh, fmt)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _write(frame: pd.DataFrame, fh, fmt: str) -> None:
    if fmt == "csv":
        fh.write(frame.to_csv(index=False).encode("utf-8"))
    elif fmt == "jsonl":
        fh.write(frame.to_json(orient="records", lines=True, force_ascii=False, double_precision=15).encode("utf-8"))
    else:
        frame.to_parquet(fh, index=False)
