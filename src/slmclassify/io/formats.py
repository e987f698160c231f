"""Table formats by extension, and the checks that run before any work (output path, encoding)."""

from __future__ import annotations

import codecs
import json
import os
from pathlib import Path

from ..errors import InputError

FORMATS = ("csv", "jsonl", "parquet")
_EXTENSIONS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}
# Invalid UTF-8 bytes are decoded to this noncharacter first, so the row that held them can be
# named after parsing (surrogates would not survive pandas' or pyarrow's string handling).
BAD_BYTE = "\U0010fffe"
codecs.register_error("slmclassify-mark", lambda exc: (BAD_BYTE, exc.end))


def table_format(path: str, explicit: str | None = None) -> str:
    """The format of `path` from its extension (or `explicit`, needed for `-`)."""
    if explicit:
        return explicit
    if path == "-":
        return "csv"
    suffix = Path(path).suffix.lower()
    found = _EXTENSIONS.get(suffix)
    if found is None:
        raise InputError("{path}: unknown format {suffix!r}; use .csv, .jsonl or .parquet (or {fmt})",
                         names={"fmt": "fmt"}, path=path, suffix=suffix or "(no extension)")
    return found


def check_output(path: str, fmt: str | None = None) -> str:
    """Check that `path` can be written (format, folder, permissions) before any work; returns its format."""
    if path != "-" and Path(path).is_dir():
        raise InputError(f"output {path} is a folder; give a file name, e.g. {Path(path) / 'labelled.csv'}")
    fmt = table_format(path, fmt)
    if path == "-":
        return fmt
    target = Path(path)
    parent = target.parent
    if not parent.exists():
        # A file where a folder is expected ("out.csv/x.csv") is named as such.
        blocker = next((p for p in [parent, *parent.parents] if p.exists()), None)
        if blocker is not None and not blocker.is_dir():
            raise InputError(f"cannot write {path}: {blocker} is a file, not a folder")
        raise InputError(f"output folder does not exist: {parent}")
    if not parent.is_dir():
        raise InputError(f"cannot write {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"cannot write {path}: no permission to create files in {parent}")
    if target.exists() and not os.access(target, os.W_OK):
        raise InputError(f"cannot write {path}: the existing file is read-only")
    return fmt


def check_not_input(input_path: str, output_path: str) -> None:
    """Refuse an output (or its partial, progress record or lock) that is the input file itself,
    however it is spelled (`./data/../data/x.csv`, a symlink, a hard link): the input is never
    overwritten."""
    if "-" in (input_path, output_path):
        return
    for path in (output_path, f"{output_path}.partial", f"{output_path}.progress.json", f"{output_path}.lock"):
        if _same_path(path, input_path):
            what = "" if path == output_path else f" ({path}, where the run keeps its state)"
            raise InputError(f"the output {output_path} is the input file {input_path}{what}; write to another "
                             "file (the input is never overwritten)")


def check_writes(reads: dict, writes: dict) -> None:
    """Refuse, before any work, an output that is one of the files the command reads, however it is
    spelled (`..`, a symlink, a hard link): {what: path} of each side, e.g. {"the input": "in.csv",
    "--task": "t.toml"} and {"-o": "in.csv"}. None, "" and "-" (stdin/stdout) are skipped. One guard
    for every command: a head written over the labelled file, a JSON summary over the input, an
    export over the label store were all replaced without a word."""
    for out_name, out in writes.items():
        if not out or str(out) == "-":
            continue
        for in_name, src in reads.items():
            if not src or str(src) == "-":
                continue
            if _same_path(str(out), str(src)):
                raise InputError(f"{out_name} {out} is {in_name} {src}; write to another file (a command never "
                                 "writes over a file it reads)")


def _same_path(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)
    except OSError:
        return False


def check_text_encoding(head: bytes, name: str) -> None:
    """Refuse UTF-16/32 text files up front: their columns would come out as garbled names."""
    boms = {codecs.BOM_UTF32_LE: "UTF-32", codecs.BOM_UTF32_BE: "UTF-32", codecs.BOM_UTF16_LE: "UTF-16",
            codecs.BOM_UTF16_BE: "UTF-16"}
    found = next((enc for bom, enc in boms.items() if head.startswith(bom)), None)
    nuls = head[:4096].count(b"\x00")
    # Text in UTF-16/32 without a BOM has NUL bytes in most characters (Latin ones); a few NULs in
    # UTF-8 text (a stray byte in one cell) are not an encoding, and are kept as they are.
    if found is None and nuls * 8 >= len(head[:4096]) > 0:
        found = "UTF-16" if nuls * 4 < len(head[:4096]) * 3 else "UTF-32"
    if found is not None:
        raise InputError(f"{name}: the file is not UTF-8 (it looks like {found}); save it as UTF-8 and try again")


def json_text(value) -> str:
    """A list or object cell (a Parquet list or struct, a JSON array) as its JSON text: what the model
    scores when it is the text, and what a CSV output holds (not numpy's `['a' 'b']`)."""
    return json.dumps(_plain(value), ensure_ascii=False, default=str)


def _plain(value):
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):  # numpy arrays and scalars
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return value
