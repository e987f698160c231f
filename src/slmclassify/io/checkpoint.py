"""The on-disk state of a resumable run: `OUTPUT.partial` and its progress record `OUTPUT.progress.json`.

While a run is in progress:

    OUTPUT.partial          finished chunks, appended whole (CSV/JSONL rows; for Parquet an Arrow
                            IPC stream that becomes the Parquet file at the end)
    OUTPUT.progress.json    what the partial holds: rows done, its valid byte length, and the
                            fingerprints of the input, task, model and settings that made it

The record is written (atomically, after the partial is fsynced) only after a chunk is complete,
so after a crash or a power cut the partial may hold *more* bytes than the record says (a chunk
being written) but never fewer: resuming truncates it to the recorded length and goes on.

What `--resume` trusts, it checks first: the partial must hold at least the recorded bytes, and
those bytes must have the SHA-256 recorded with the last chunk (a running hash of everything the
partial holds, kept by the sink as it appends: one byte changed anywhere is caught); they must hold
exactly the recorded number of rows (counted in them: a row count edited in the record would
write rows twice or skip them); the record must be the one written (`record_sha256`, a hash of
every other field: an edited counter, pool or byte count is caught); and the input must still start
with the bytes already read (their count and SHA-256 are recorded with each chunk; Parquet: the
whole file). A partial cut short, changed or replaced, a record edited, or an input edited where it
was read, is refused: writing past it would keep the changed rows, leave a hole of NUL bytes, or
put rows of the old input next to the new.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from .hashing import file_sha256

VERSION = 1
_HEAD_BYTES = 1 << 20
_TAIL_BYTES = 1 << 16


def input_fingerprint(path: str) -> dict:
    """Size, modification time and a hash of the first MiB of the input."""
    stat = os.stat(path)
    with open(path, "rb") as fh:
        head = hashlib.sha256(fh.read(_HEAD_BYTES)).hexdigest()[:16]
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "head_sha256": head}


def tail_digest(fd: int, length: int) -> str:
    """SHA-256 of the last 64 KiB of the first `length` bytes of the open file `fd` (what records of
    earlier versions hold instead of `partial_sha256`)."""
    start = max(0, length - _TAIL_BYTES)
    data = os.pread(fd, length - start, start)
    return hashlib.sha256(data).hexdigest()


def extend_digest(digest, fd: int, start: int, end: int):
    """`digest` (a hashlib object) updated with bytes start .. end of the open file `fd`; returns it."""
    while start < end:
        data = os.pread(fd, min(_HEAD_BYTES, end - start), start)
        if not data:
            raise OSError(f"the file ended at byte {start}, {end} expected")
        digest.update(data)
        start += len(data)
    return digest


def digest(value) -> str:
    """A short stable hash of a JSON-able value (or of its repr)."""
    text = json.dumps(value, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def sealed(record: dict) -> dict:
    """`record` with `record_sha256`, the hash of every other field (`Checkpoint.damage` checks it)."""
    fields = {k: v for k, v in record.items() if k not in ("record_sha256", "version")}
    return {**fields, "record_sha256": digest(fields)}


def rows_held(path: str, length: int, fmt: str) -> int:
    """The data rows in the first `length` bytes of a partial output of format `fmt`: CSV records after
    the header (quoted cells may hold newlines), JSONL lines, or the rows of an Arrow IPC stream's
    batches (Parquet's partial). Read in pieces: a partial of any size."""
    if length == 0:
        return 0
    with open(path, "rb") as fh:
        if fmt == "jsonl":
            lines, left = 0, length
            while left:
                data = fh.read(min(_HEAD_BYTES, left))
                if not data:
                    break
                lines, left = lines + data.count(b"\n"), left - len(data)
            return lines
        if fmt == "csv":
            import csv

            text = io.TextIOWrapper(io.BufferedReader(_Prefix(fh, length)), encoding="utf-8", newline="",
                                    errors="replace")
            return max(0, sum(1 for _ in csv.reader(text)) - 1)
        import pyarrow as pa

        reader = pa.ipc.open_stream(pa.BufferReader(fh.read(length)))
        return sum(batch.num_rows for batch in reader)


class _Prefix(io.RawIOBase):
    """The first `length` bytes of a binary file as a raw stream (for `rows_held`)."""

    def __init__(self, fh, length: int):
        super().__init__()
        self.fh, self.left = fh, length

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self.fh.readinto(memoryview(buffer)[: min(len(buffer), self.left)]) or 0
        self.left -= n
        return n


@dataclass(frozen=True)
class Checkpoint:
    """Paths of a run's partial output and progress record."""

    output: str

    @property
    def partial(self) -> str:
        return f"{self.output}.partial"

    @property
    def record(self) -> str:
        return f"{self.output}.progress.json"

    def exists(self) -> bool:
        return os.path.exists(self.partial) or os.path.exists(self.record)

    def load(self) -> dict | None:
        """The saved record, or None when there is none (or it is unreadable: nothing was completed)."""
        try:
            record = json.loads(Path(self.record).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) and record.get("version") == VERSION else None

    def unusable_record(self) -> str | None:
        """Why a partial that holds bytes has no usable progress record (deleted, unreadable, of
        another version), or None when the partial is empty or absent and nothing was done."""
        if os.path.exists(self.record):
            return f"its progress record {self.record} is unreadable or of another slmclassify version"
        try:
            if os.path.getsize(self.partial) == 0:
                return None
        except OSError:
            return None
        return (f"its progress record {self.record} is missing, so nothing says which of the rows in "
                f"{self.partial} are complete")

    def save(self, record: dict) -> None:
        """Replace the record atomically and durably (the partial must already be fsynced)."""
        tmp = f"{self.record}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump({"version": VERSION, **record}, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.record)
        except OSError:
            if os.path.exists(tmp):  # the previous record stays whole and in force
                os.unlink(tmp)
            raise
        _fsync_dir(self.record)

    def damage(self, saved: dict, fmt: str) -> str | None:
        """Why the partial cannot be continued as its record says (cut short, changed, holding another
        number of rows, the record edited), or None. `fmt`: the output's format."""
        if not isinstance(saved.get("input_read"), dict):
            return "its progress record was written by an older slmclassify and does not say which input bytes were read"
        if "record_sha256" in saved and sealed(saved)["record_sha256"] != saved["record_sha256"]:
            return (f"its progress record {self.record} was edited (its fields no longer have the hash written "
                    "with them)")
        try:
            fd = os.open(self.partial, os.O_RDONLY)
        except OSError as exc:
            return f"{self.partial} cannot be read ({exc.strerror})"
        try:
            size, length = os.fstat(fd).st_size, saved["partial_bytes"]
            if size < length:
                return (f"{self.partial} is shorter than its progress record says ({size} bytes, the record "
                        f"says {length}): it was cut or replaced")
            if "partial_sha256" in saved:
                if saved["partial_sha256"] != extend_digest(hashlib.sha256(), fd, 0, length).hexdigest():
                    return (f"{self.partial} does not hold the bytes its progress record saw (its SHA-256 "
                            "differs): it was changed or replaced")
            elif saved.get("partial_tail_sha256") != tail_digest(fd, length):
                return f"{self.partial} does not end with the bytes its progress record saw: it was changed or replaced"
        finally:
            os.close(fd)
        try:
            held = rows_held(self.partial, length, fmt)
        except (OSError, ValueError) as exc:  # pyarrow's errors are ValueErrors (ArrowInvalid)
            return f"the rows of {self.partial} cannot be counted ({exc})"
        if held != saved.get("rows_done"):
            return (f"its progress record says {saved.get('rows_done')} rows are done, but {self.partial} holds "
                    f"{held}: the record was changed")
        return None

    def discard(self) -> None:
        for path in (self.partial, self.record, f"{self.record}.tmp"):
            if os.path.exists(path):
                os.unlink(path)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def changed(saved: dict, current: dict) -> str | None:
    """What differs between a saved run and this one, in words; None when it can continue."""
    names = {"input": "the input file", "task": "the task", "model": "the model", "settings": "the settings",
             "head": "the head or --scorer"}
    for key, what in names.items():
        if key not in current or saved.get(key) == current[key]:
            continue
        if key == "input" and isinstance(saved.get(key), dict):
            diffs = [f"{k} {saved[key].get(k)} → {v}" for k, v in current[key].items() if saved[key].get(k) != v]
            return f"{what} changed ({', '.join(diffs)})"
        before, now = saved.get(f"{key}_shown"), current.get(f"{key}_shown")
        if isinstance(before, dict) and isinstance(now, dict):  # every field that differs, old → new
            diffs = [f"{k} {_short(before.get(k))} → {_short(v)}" for k, v in now.items() if before.get(k) != v]
            return f"{what} changed ({', '.join(diffs) or 'see the options'})"
        return f"{what} changed"
    return None


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def input_read_changed(saved: dict, input_path: str) -> str | None:
    """Why the input no longer starts with the bytes already read (as the record saw them), or None."""
    read = saved["input_read"]
    if file_sha256(input_path, read["bytes"]) != read["sha256"]:
        rows = saved.get("rows_done")
        if read["bytes"] >= os.path.getsize(input_path):
            return (f"the input file changed; the interrupted run had read all of it ({read['bytes']:,} bytes: the "
                    f"reader reads ahead of the {rows} rows done), so it cannot tell whether those rows changed")
        return (f"the input file changed in its first {read['bytes']:,} bytes, which the interrupted run had read "
                f"(the {rows} rows done and the rows the reader had read ahead of them)")
    return None


def refuse_damaged(checkpoint: Checkpoint, reason: str) -> InputError:
    return InputError("cannot resume {output}: {reason}; its rows cannot be trusted, pass {restart} to start over",
                      names={"restart": "restart"}, output=checkpoint.output, reason=reason)


def refuse_resume(checkpoint: Checkpoint, reason: str) -> InputError:
    return InputError("cannot resume {output}: {reason} since {partial} was started; run with the same input and "
                      "options, or pass {restart} to start over", names={"restart": "restart"},
                      output=checkpoint.output, reason=reason, partial=checkpoint.partial)
