"""Where slmclassify keeps what it computes once per machine: converted GGUF models, compiled C
kernels, GEMM and precision choices, activation ranges, CTranslate2 conversions.

The cache is an optimisation, never a requirement. Every entry records where it came from (the
GGUF's SHA-256, the kernel's sources, the measurement's key) and the version that wrote it, and a
reader uses it only when that matches: anything else is a miss. A cache that cannot be written (a
read-only folder, the root a regular file, a full disk) costs one warning (`CacheWarning`): what the
run would have kept goes to a temporary folder of this process, removed when it exits
(`scratch_root`), so the run computes with the same kernels and gives the same bits as a warm one.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path


class CacheWarning(UserWarning):
    """The cache could not be read or written as it should: the run goes on without it (one line)."""


def cache_root() -> Path:
    """The user cache folder: `$XDG_CACHE_HOME/slmclassify` (default `~/.cache/slmclassify`) on Linux."""
    from platformdirs import user_cache_path

    return user_cache_path("slmclassify", appauthor=False)


@functools.cache
def tool_version() -> str:
    """The installed slmclassify's version, recorded in every cache entry."""
    import importlib.metadata

    try:
        return importlib.metadata.version("slmclassify")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


_SCRATCH: dict[str, Path] = {}
_WARNED: set[str] = set()


def warn(message: str) -> None:
    """One `CacheWarning` per message and process (a long-lived service builds many classifiers)."""
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, CacheWarning, stacklevel=2)


def writable(folder: Path) -> bool:
    """Whether files can be created in `folder` (made if missing); a full disk is found by the write."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
        return True
    except OSError:
        return False


def scratch_root(root: Path, why: str) -> Path:
    """This process's stand-in for the cache `root` it cannot write (`why`, e.g. "read-only file
    system"): a temporary folder removed at exit, made (and warned about) once per root."""
    key = str(root)
    if key not in _SCRATCH:
        folder = Path(tempfile.mkdtemp(prefix="slmclassify-cache-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _SCRATCH[key] = folder
        warn(f"cannot write the cache {root} ({why}): this run keeps what it computes in {folder}, removed "
             f"when it exits (set XDG_CACHE_HOME to a writable folder to keep it)")
    return _SCRATCH[key]


def scratch_root_of(root: Path) -> Path | None:
    """The scratch folder standing in for `root` in this process, if one was made."""
    return _SCRATCH.get(str(root))


def write_root(root: Path | None = None) -> Path:
    """Where this process writes cache entries: `root` (default `cache_root()`) when files can be
    created there, else its scratch folder (`scratch_root`)."""
    root = cache_root() if root is None else Path(root)
    if str(root) in _SCRATCH or not writable(root):
        return scratch_root(root, _why_unwritable(root))
    return root


def move_aside(entry: Path, why: str) -> None:
    """Move a cache entry that is not what its name says out of the way (`<cache>/moved-aside/`),
    so it is never used and can be looked at; where that fails it is removed. Warns once."""
    target = entry.parent / "moved-aside" / f"{entry.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    try:
        target.parent.mkdir(exist_ok=True)
        os.replace(entry, target)
        where = f"moved to {target}"
    except OSError:
        with contextlib.suppress(OSError):
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        where = "removed"
    warn(f"the cache entry {entry} {why}: not used, {where}, built again")


def _why_unwritable(root: Path) -> str:
    """In words, why files cannot be created under `root`."""
    for folder in (root, *root.parents):
        if folder.exists():
            if not folder.is_dir():
                return f"{folder} is a file, not a folder"
            try:
                fd, probe = tempfile.mkstemp(dir=folder, prefix=".probe-")
            except OSError as exc:
                return exc.strerror or str(exc)
            os.close(fd)
            os.unlink(probe)
            return "cannot create files in it"
    return "no parent folder exists"
