"""Progress of a long run on stderr: a bar with rows/s and ETA on a terminal, otherwise one status
line every `every` seconds (for logs). The jobs take it as their `meter` (`jobs.classify.Meter`). The fraction done comes from rows when the input's row
count is known (Parquet, JSONL files), else from the bytes read (CSV files); stdin has no ETA."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total_rows: int | None, total_bytes: int | None, enabled: bool = True,
                 every: float = 15.0, done: int = 0, stream=None):
        self.stream = stream or sys.stderr
        self.total_rows, self.total_bytes = total_rows, total_bytes
        self.tty = enabled and self.stream.isatty()
        self.enabled, self.every = enabled, every
        self.rows, self.start_rows = done, done
        self.started = self.last = time.monotonic()
        self.bar = None
        if self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=total_rows, initial=done, unit="row", file=self.stream, dynamic_ncols=True,
                            leave=False, smoothing=0.1)

    def update(self, rows: int, bytes_read: int | None = None) -> None:
        """`rows` more rows are done; `bytes_read` of the input consumed so far."""
        self.rows += rows
        if self.bar is not None:
            self.bar.update(rows)
            if self.total_rows is None and self.total_bytes and bytes_read:
                self.bar.set_postfix_str(f"{100 * bytes_read / self.total_bytes:.0f}% of the file", refresh=False)
            return
        now = time.monotonic()
        if not self.enabled or now - self.last < self.every:
            return
        self.last = now
        rate = (self.rows - self.start_rows) / max(now - self.started, 1e-9)
        fraction = (self.rows / self.total_rows if self.total_rows
                    else bytes_read / self.total_bytes if self.total_bytes and bytes_read else None)
        line = f"progress: {self.rows} rows, {rate:.1f} rows/s"
        if fraction:
            eta = (now - self.started) * (1 - fraction) / max(fraction - self._start_fraction(), 1e-9)
            line += f", {100 * fraction:.1f}% done, ETA {_clock(eta)}"
        print(line, file=self.stream, flush=True)

    def _start_fraction(self) -> float:
        return self.start_rows / self.total_rows if self.total_rows else 0.0

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"
