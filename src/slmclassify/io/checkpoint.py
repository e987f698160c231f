"""The on-disk state of a resumable run: `OUTPUT.partial` and its progress record `OUTPUT.progress.json`.

While a run is in progress:

    OUTPUT.partial          finished chunks, appended whole (CSV/JSONL rows; for Parquet an Arrow
                            IPC stream that becomes the Parquet file at the end)
    OUTPUT.progress.json    what the partial holds: rows done, its valid byte length, and the
                            fingerprints of the input, task, model and settings that made it

The record is written (atomically, after the partial is fsynced) only after a chunk is complete,
so after a crash or a power cut the partial may hold *more* bytes than the record says (a chunk
being written) but never fewer: resuming truncates it to the recorded length and goes on.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

VERSION = 1
_HEAD_BYTES = 1 << 20


def input_fingerprint(path: str) -> dict:
    """Size, modification time and a hash of the first MiB of the input."""
    stat = os.stat(path)
    with open(path, "rb") as fh:
        head = hashlib.sha256(fh.read(_HEAD_BYTES)).hexdigest()[:16]
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "head_sha256": head}


def digest(value) -> str:
    """A short stable hash of a JSON-able value (or of its repr)."""
    text = json.dumps(value, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


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

    def save(self, record: dict) -> None:
        """Replace the record atomically and durably (the partial must already be fsynced)."""
        tmp = f"{self.record}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"version": VERSION, **record}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.record)
        _fsync_dir(self.record)

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
        if key == "settings" and isinstance(saved.get("settings_shown"), dict):
            shown = current.get("settings_shown", {})
            diffs = [f"{k} {saved['settings_shown'].get(k)!r} → {v!r}" for k, v in shown.items()
                     if saved["settings_shown"].get(k) != v]
            return f"{what} changed ({', '.join(diffs) or 'see the options'})"
        return f"{what} changed"
    return None


def refuse_resume(checkpoint: Checkpoint, reason: str) -> InputError:
    return InputError(f"cannot resume {checkpoint.output}: {reason} since {checkpoint.partial} was started; "
                      "run with the same input and options, or pass --restart to start over")
