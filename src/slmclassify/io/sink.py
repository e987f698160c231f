"""Where a classify run's chunks go: stdout directly, or `OUTPUT.partial` with a progress record
(`checkpoint`) after each chunk, renamed to OUTPUT when complete.

A chunk is appended whole and fsynced before its record is saved, and the record in force is only
ever one that was saved; a write that fails (a full disk) leaves the finished chunks and their
record for `--resume`. `state` is the job's run state: its `rows` and `to_json()`.
"""

from __future__ import annotations

import hashlib
import os

from ..errors import InputError
from ..interrupts import Interrupted
from .checkpoint import extend_digest, sealed
from .writers import ChunkWriter, ipc_to_parquet, write_error


class WriteFailed(Exception):
    """Writing a chunk or its record failed (an OSError such as a full disk)."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


class Sink:
    """Where chunks go: stdout directly, or OUTPUT.partial with a progress record after each chunk."""

    def __init__(self, output, checkpoint, fmt, writer, fh, record, digest=None, hashed: int = 0):
        self.output, self.checkpoint, self.fmt, self.writer, self.fh, self.record = (
            output, checkpoint, fmt, writer, fh, record)
        # the running SHA-256 of the partial's first `hashed` bytes (recorded with each chunk)
        self.digest, self.hashed = digest if digest is not None else hashlib.sha256(), hashed

    def write(self, frame, state, input_read: dict | None) -> None:
        """Append one chunk and record it; an OSError (ENOSPC, EIO, a closed pipe) becomes `WriteFailed`."""
        try:
            self.writer.write(frame)
            self.chunk_done(state, input_read)
        except OSError as exc:
            raise WriteFailed(exc) from None

    @property
    def kept(self) -> bool:
        """The partial output holds finished chunks that --resume can continue from."""
        return self.checkpoint is not None and bool(self.record.get("rows_done") and self.record.get("resumable"))

    def write_failed(self, error: OSError) -> InputError:
        message = str(write_error(self.output, error))
        if self.kept:
            message += (f"; the {self.record['rows_done']} rows done are kept in {self.checkpoint.partial}: "
                        "free some space and run the same command with --resume")
        return InputError(message)

    def chunk_done(self, state, input_read: dict) -> None:
        self.fh.flush()
        if self.checkpoint is None:
            return
        os.fsync(self.fh.fileno())
        length = self.fh.tell()
        extend_digest(self.digest, self.fh.fileno(), self.hashed, length)
        self.hashed = length
        record = {**self.record, "rows_done": state.rows, "partial_bytes": length, "state": state.to_json(),
                  "partial_sha256": self.digest.hexdigest(), "input_read": input_read}
        record.pop("partial_tail_sha256", None)
        record = sealed(record)
        self.checkpoint.save(record)
        self.record = record  # only once saved: what a failed save leaves is the previous record

    def finish(self) -> None:
        try:
            self.writer.close()
            self.fh.flush()
            if self.checkpoint is None:
                return
            os.fsync(self.fh.fileno())
            self.fh.close()
            if self.fmt == "parquet":
                tmp = f"{self.checkpoint.partial}.parquet"
                try:
                    ipc_to_parquet(self.checkpoint.partial, tmp)
                    os.replace(tmp, self.output)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
            else:
                os.replace(self.checkpoint.partial, self.output)
        except OSError as exc:
            raise self.write_failed(exc) from None
        self.checkpoint.discard()

    def interrupted(self, state, signum) -> Interrupted:
        code = 128 + int(signum)
        if self.checkpoint is None and state.rows:
            return Interrupted(f"interrupted; the output on stdout is incomplete ({state.rows} rows)", code)
        if not self.kept:
            self.abandon()
            return Interrupted("interrupted; no output written", code)
        self.fh.close()
        return Interrupted(f"interrupted; {self.record['rows_done']} rows done are kept in "
                           f"{self.checkpoint.partial}; run the same command with --resume to continue", code)

    def abandon(self) -> None:
        """After a crash: keep a resumable partial that holds finished chunks, else remove it."""
        if self.checkpoint is None:
            return
        if not self.fh.closed:
            try:
                self.fh.close()
            except OSError:  # its buffer could not be flushed (a full disk): resuming cuts the partial anyway
                pass
        if not self.kept:
            self.checkpoint.discard()


def open_sink(output, checkpoint, fmt, schema, saved, resumable: bool, identity: dict, errors: str) -> Sink:
    import sys

    if checkpoint is None:
        fh = sys.stdout.buffer
        return Sink(output, None, fmt, ChunkWriter(fh, fmt, schema, name=output, errors=errors), fh, {})
    ipc = fmt == "parquet"
    digest, hashed = hashlib.sha256(), 0
    try:
        if saved is not None:
            fh = open(checkpoint.partial, "r+b")  # noqa: SIM115 - closed by the sink
            fh.truncate(saved["partial_bytes"])  # drop a chunk that was being written
            fh.seek(saved["partial_bytes"])
            hashed = saved["partial_bytes"]  # checked against the record before (Checkpoint.damage)
            extend_digest(digest, fh.fileno(), 0, hashed)
            record = dict(saved)
        else:
            fh = open(checkpoint.partial, "w+b")  # noqa: SIM115 - readable: what it holds is hashed
            record = dict(identity)
    except OSError as exc:
        raise write_error(output, exc) from None
    record["resumable"] = resumable
    record.pop("version", None)
    writer = ChunkWriter(fh, fmt, schema, header=saved is None, ipc=ipc, name=output, errors=errors)
    return Sink(output, checkpoint, fmt, writer, fh, record, digest, hashed)
