"""Ctrl-C and SIGTERM end a run the same way: a KeyboardInterrupt at the next bytecode, which the
classify job turns into `Interrupted` (finished chunks kept) and the CLI into one line. Light on
purpose (no torch): the CLI installs the handler before anything heavy is imported."""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager

from .errors import SlmClassifyError

NOTHING_WRITTEN = "slmclassify: interrupted; no output written"
"""The CLI's last line when Ctrl-C or SIGTERM come before any output was written."""


class Interrupted(SlmClassifyError):
    """Ctrl-C or SIGTERM during a run; the message says what was kept. `exit_code` is 130 or 143."""

    def __init__(self, message: str, exit_code: int = 130):
        super().__init__(message)
        self.exit_code = exit_code


def terminate_as_interrupt(signum, frame):
    """SIGTERM handler: raise KeyboardInterrupt (remembering the signal) instead of dying mid-write."""
    terminate_as_interrupt.received = True
    exc = KeyboardInterrupt()
    exc.signal = signum
    raise exc


terminate_as_interrupt.received = False


def handle_sigterm():
    """Install the SIGTERM handler; returns the previous one."""
    return signal.signal(signal.SIGTERM, terminate_as_interrupt)


def exit_at_once(signum, frame):
    """While torch starts: one line and exit. A KeyboardInterrupt raised while torch's C++ start-up
    is calling into Python cannot unwind through it (pybind11 aborts the process, exit -6)."""
    os.write(2, f"{NOTHING_WRITTEN}\n".encode())
    os._exit(143 if signum == signal.SIGTERM else 130)


@contextmanager
def exit_at_once_while_starting():
    """Ctrl-C and SIGTERM exit at once inside the block (nothing has been written yet), then the
    handlers before it are back."""
    previous = {sig: signal.signal(sig, exit_at_once) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
