"""How a job tells its caller about its progress: a meter the caller makes (the CLI's
`cli.progress.Progress`), counted on as the rows are written. Imports nothing heavy: the `--ray`
driver uses it without torch."""

from __future__ import annotations

from typing import Callable, Protocol


class Meter(Protocol):
    """What a job tells about its progress (the CLI's `cli.progress.Progress`)."""

    def update(self, rows: int, bytes_read: int | None = None) -> None:
        """`rows` more rows are done; `bytes_read` of the input consumed so far."""

    def close(self) -> None:
        """The run ended (done or not)."""


MeterFactory = Callable[[int | None, int | None, int], Meter]
"""Called once the input is open with (its rows or None, its bytes or None, rows done before)."""


class _NoMeter:
    def update(self, rows: int, bytes_read: int | None = None) -> None:
        pass

    def close(self) -> None:
        pass


def no_meter(total_rows: int | None, total_bytes: int | None, done: int) -> Meter:
    """A meter that says nothing (the default)."""
    return _NoMeter()
