"""Ctrl-C and SIGTERM end a run the same way: a KeyboardInterrupt at the next bytecode, which the
classify job turns into `Interrupted` (finished chunks kept) and the CLI into one line. Light on
purpose (no torch): the CLI installs the handler before anything heavy is imported."""

from __future__ import annotations

import signal

from .errors import SlmClassifyError


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
