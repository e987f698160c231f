"""What the threads of a labelling session share: one lock, the signal that the answers or the
pool changed, the ready flag, the closing flag, and the first failure of a background thread.

A failure in a background thread is kept here and raised by the session's next call (`raise_error`),
so that it reaches the page instead of being lost in the thread; it also sets `ready`, so that a
caller waiting for the first slice stops waiting.
"""

from __future__ import annotations

import threading

from ..errors import InputError, SlmClassifyError


class Sync:
    """See the module docstring; `lock` is reentrant (a public call may make another)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.ready = threading.Event()
        self.closing = False
        self.version = 0  # bumped by every change of the answers or of the scored pool: the refitter's cue
        self.error: BaseException | None = None

    def bump(self) -> None:
        """Say that the answers or the pool changed (lock held)."""
        self.version += 1
        self.changed.notify_all()

    def close(self) -> None:
        """Ask the threads to stop: the scorer after its current batch, the refitter after its fit."""
        with self.lock:
            self.closing = True
            self.changed.notify_all()

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def thread(self, loop, name: str) -> threading.Thread:
        """A daemon thread (not started) running `loop`, whose failure is kept for `raise_error`."""
        def run():
            try:
                loop()
            except BaseException as exc:  # shown to the page's next call, not lost in a thread
                self.error = exc if isinstance(exc, SlmClassifyError) else InputError(
                    f"labelling stopped: {type(exc).__name__}: {exc}")
                self.ready.set()
        return threading.Thread(target=run, name=name, daemon=True)
