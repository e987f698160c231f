"""One writer per output: `OUTPUT.lock`, held (an exclusive `flock`) for the whole of a classify run.

Two runs writing the same `OUTPUT.partial` and progress record interleave their chunks: the file
that one of them renames into place has the right size and holes of NUL bytes. The second run
must refuse before it loads the model, naming the first, so the lock file holds the owner's pid.

The kernel drops a `flock` when its process dies (even by SIGKILL), so a lock file left behind
never blocks a later run. The file is removed on release; a run that opened it just before the
removal finds, once it holds the lock, that its file is no longer the one at the path, and
retries on the new one, so two runs can never both hold "the" lock.
"""

from __future__ import annotations

import fcntl
import os

from ..errors import InputError


class OutputLock:
    """The exclusive lock of one output path (`OUTPUT.lock`); `acquire` refuses at once when taken."""

    def __init__(self, output: str):
        self.output = output
        self.path = f"{output}.lock"
        self.fd: int | None = None

    def acquire(self) -> OutputLock:
        for _ in range(100):  # each retry means another run removed the file in between
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise InputError(f"cannot write {self.output}: cannot create {self.path} ({exc.strerror})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _read_pid(fd)
                os.close(fd)
                who = f"pid {owner}" if owner else "another process"
                raise InputError(f"{self.output} is being written by another slmclassify run ({who}, lock "
                                 f"{self.path}); wait for it to finish or write to another file") from None
            if _same_file(fd, self.path):
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                self.fd = fd
                return self
            os.close(fd)
        raise InputError(f"cannot lock {self.path}: other runs keep replacing it")

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            if _same_file(self.fd, self.path):
                os.unlink(self.path)  # while still held: nobody can lock this file in between
        except OSError:
            pass
        os.close(self.fd)  # closing drops the flock
        self.fd = None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _same_file(fd: int, path: str) -> bool:
    try:
        held, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)
