"""Small C libraries compiled at first use (`int8_kernels.py`, `fp32_kernels.py`).

The C sources are package data: `csrc/<library>.c` and the headers they share (`csrc/vexp.h`),
read through `importlib.resources` (so an installed wheel, even a zipped one, has them). Each
library is compiled with the system's C compiler (`cc`, else `gcc`; `SLMCLASSIFY_CC` names
another, an empty value disables them) with -O3 -march=native -fopenmp (-march=x86-64-v3 or v4
under an instruction-set cap, `isa.march`) into the user cache folder's `kernels/`, one file per
build setup (compiler, flags and CPU: a home folder may be shared between machines, and
-march=native code may use instructions another CPU lacks) and sources (the bytes of the `.c`
file and every header), and loaded through ctypes. Building a library removes the builds of
other sources of the same library and setup that no process has loaded for `KEEP_UNUSED_S`.
OpenMP resolves to the libgomp that PyTorch has already loaded (same soname), so no second
thread pool appears; each call uses PyTorch's thread count. Where nothing builds, `Library.load`
returns None and `Library.unavailable` says why: the callers then run their torch paths.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from importlib import resources
from pathlib import Path

import torch

from . import isa


def csrc():
    """The folder of the C sources (package data; a `Traversable`, which a test may replace by a `Path`)."""
    return resources.files(__package__).joinpath("csrc")


def compile_flags() -> list[str]:
    """The compiler flags: -march follows the instruction-set cap (`isa.march`)."""
    return ["-O3", f"-march={isa.march()}", "-fopenmp", "-shared", "-fPIC"]


COMPILER_ENV = "SLMCLASSIFY_CC"
"""Names the C compiler (default: cc, else gcc); an empty value disables every C library."""

P, I, F, C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
"""ctypes argument types of the C functions: pointer, int64, float, int."""


class Library:
    """One C library: `csrc/<source>` (with the shared headers) compiled and loaded at first use per
    cache folder (and flags), kept for the process."""

    def __init__(self, source: str, stem: str, bind) -> None:
        self.source, self.stem, self.bind = source, stem, bind
        self._built: dict = {}

    def sources(self) -> dict[str, bytes]:
        """The files compiled, by name: the library's `.c` file and every header in `csrc/`."""
        folder = csrc()
        headers = sorted((f for f in folder.iterdir() if f.name.endswith(".h")), key=lambda f: f.name)
        return {self.source: folder.joinpath(self.source).read_bytes(), **{f.name: f.read_bytes() for f in headers}}

    def digest(self) -> str:
        """SHA-256 (hex) of `sources()`, names and bytes: changes with any byte of any of them."""
        return _digest(self.sources())

    def load(self, cache_dir: Path | None = None, flags: tuple[str, ...] | None = None):
        """The library (ctypes, signatures declared by `bind`), or None where it cannot be built.
        `flags` (tests): compile with these instead of `compile_flags()` (e.g. AVX2 only)."""
        key = (str(cache_dir), flags)
        if key not in self._built:
            self._built[key] = self.build(cache_dir, compile_flags() if flags is None else list(flags))
        return self._built[key][0]

    def unavailable(self, cache_dir: Path | None = None, flags: tuple[str, ...] | None = None) -> str | None:
        """Why the library cannot be built here (None when it can)."""
        self.load(cache_dir, flags)
        return self._built[(str(cache_dir), flags)][1]

    def build(self, cache_dir: Path | None, flags: list[str]):
        """(library, None) or (None, why not): the sources compiled with `flags` into
        `cache_dir`/kernels/`stem`-<setup>-<sources>.so (default folder: the user cache; <setup>:
        digest of compiler, flags and CPU, <sources>: of `sources()`) and loaded, not kept (`load`
        keeps it); `bind(lib)` declares its functions' signatures.

        A compiled library is trusted only as built: what it was built from and its SHA-256 are written
        beside it (`<name>.so.json`, `_intact`) and checked before it is loaded, and `bind` must find
        every symbol; a library that fails either (truncated, bytes changed, another library or build
        copied over it) is built again instead of being loaded (loading one crashed the process: a bus
        error, an illegal instruction, a segmentation fault). A cache that cannot be written builds it
        in this process's scratch folder (`cache.scratch_root`): the same kernel, never a fallback."""
        if os.environ.get(COMPILER_ENV) == "":
            return None, f"disabled ({COMPILER_ENV} is empty)"
        cc = compiler()
        if cc is None:
            return None, f"no C compiler found (install gcc, or name one in {COMPILER_ENV})"
        from ..cache import cache_root, scratch_root, write_root

        root = Path(cache_root() if cache_dir is None else cache_dir)
        sources = self.sources()
        # -march=native: a library built on another CPU (a home folder shared between machines) may use
        # instructions this one lacks, so the CPU is part of the name
        setup = hashlib.sha256((" ".join(flags) + cc + cpu_identity()).encode()).hexdigest()
        name = f"{self.stem}-{setup[:16]}-{_digest(sources)[:16]}.so"
        target = root / "kernels" / name
        record = {"setup": setup, "sources": _digest(sources)}
        for attempt in (0, 1):
            if attempt or not _intact(target):  # built here, or where the cache cannot be written, in the scratch folder
                target = write_root(root) / "kernels" / name
                if attempt or not _intact(target):
                    why = _compile(cc, flags, sources, self.source, self.stem, target, record)
                    if isinstance(why, OSError):  # e.g. a full disk: built for this process alone
                        target = scratch_root(root, why.strerror or str(why)) / "kernels" / name
                        why = _compile(cc, flags, sources, self.source, self.stem, target, record)
                    if why:
                        return None, str(why)
                    _remove_stale(target.parent, self.stem, setup[:16], target)
            with contextlib.suppress(OSError):
                os.utime(target)  # its mtime says when it was last loaded (`_remove_stale`)
            try:
                lib = ctypes.CDLL(str(target))
                self.bind(lib)
            except (OSError, AttributeError) as exc:
                if attempt:
                    return None, f"loading {target} failed: {exc}"
                continue  # e.g. another library copied over it with its record: built again once
            return lib, None
        return None, f"loading {target} failed"


def check(holds: bool, what: str) -> None:
    """The contract of a C kernel call, checked before the call touches memory through ctypes (a real
    error, not an `assert`: it must hold under `python -O` too)."""
    if not holds:
        raise ValueError(f"C kernel call with {what}: a bug in slmclassify, please report it")


def compiler() -> str | None:
    """The C compiler to use (COMPILER_ENV, else cc, else gcc), or None."""
    named = os.environ.get(COMPILER_ENV)
    if named is not None:
        return shutil.which(named) if named else None
    return shutil.which("cc") or shutil.which("gcc")


def _digest(sources: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name, data in sorted(sources.items()):
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


KEEP_UNUSED_S = 24 * 3600.0
"""A build of other sources is removed once unloaded this long: a process may be loading it right
now, and another installation sharing the cache folder (an older version) may still use it."""


def _remove_stale(folder: Path, stem: str, setup: str, target: Path) -> None:
    """Remove `stem`'s builds of other sources with the same setup (and those named before the setup
    was part of the name, `stem`-<16 hex>.so), with their recorded SHA-256, unless loaded within
    `KEEP_UNUSED_S`. Builds for other CPUs, compilers or flags are kept: they are not stale."""
    same = re.compile(rf"{re.escape(stem)}-(?:{setup}-)?[0-9a-f]{{16}}\.so")
    cutoff = time.time() - KEEP_UNUSED_S
    for so in folder.glob(f"{stem}-*.so"):
        if so == target or not same.fullmatch(so.name):
            continue
        with contextlib.suppress(OSError):  # another process may have removed it already
            if so.stat().st_mtime < cutoff:
                so.unlink()
                _recorded(so).unlink(missing_ok=True)
                so.with_name(so.name + ".sha256").unlink(missing_ok=True)  # what older versions recorded


def _compile(cc: str, flags: list[str], sources: dict[str, bytes], main: str, stem: str, target: Path,
             record: dict) -> str | OSError | None:
    """Compile `sources[main]` (its headers beside it) into `target` and record beside it what it was
    built from (`record`: setup and sources digests) with its SHA-256 and this version; why not (the
    compiler's words), the `OSError` of a folder that cannot be written, or None."""
    from ..cache import tool_version

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            for name, data in sources.items():  # #include "x.h" finds the headers next to the source
                (Path(tmp) / name).write_bytes(data)
            src = Path(tmp) / main
            built = Path(tmp) / f"{stem}.so"
            done = subprocess.run([cc, *flags, "-o", str(built), str(src)], capture_output=True, text=True,
                                  timeout=120)
            if done.returncode != 0:
                if "No space left" in done.stderr:
                    return OSError(28, "no space left on device")
                return f"{cc} failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
            recorded = Path(tmp) / "record"
            recorded.write_text(json.dumps({**record, "sha256": _sha256(built), "version": tool_version()}))
            os.replace(built, target)  # atomic: another process may be compiling the same file
            os.replace(recorded, _recorded(target))
    except subprocess.SubprocessError as exc:
        return f"compiling with {cc} failed: {exc}"
    except OSError as exc:
        return exc
    return None


def _recorded(target: Path) -> Path:
    """What a build records beside it: {"setup", "sources", "sha256", "version"} (JSON)."""
    return target.with_name(target.name + ".json")


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _intact(target: Path) -> bool:
    """Whether the compiled library is byte for byte what was built here under this name: its record
    names the setup and sources its file name says (a build swapped in from another name is not),
    this version, and its SHA-256."""
    from ..cache import tool_version

    try:
        record = json.loads(_recorded(target).read_text())
        stem = target.name.rsplit("-", 2)[0]
        return (target.name == f"{stem}-{record['setup'][:16]}-{record['sources'][:16]}.so"
                and record["version"] == tool_version() and record["sha256"] == _sha256(target))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def cpu_identity() -> str:
    """This CPU's model name and flags (/proc/cpuinfo), or the platform's name where there is none."""
    try:
        with open("/proc/cpuinfo") as fh:
            lines = [line for line in fh if line.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


def ptr(t: torch.Tensor | None):
    """A tensor's data as a C pointer (None for None)."""
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def threads() -> int:
    """Threads of a C pass: PyTorch's thread count."""
    return torch.get_num_threads()
