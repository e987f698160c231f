"""The C kernels' sources (`backends/csrc/`): package data read through the package, a build key that
changes with any byte of them, and stale builds removed while the current one (and builds for
other CPUs or flags) is kept."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from importlib import resources
from pathlib import Path

import pytest

from slmclassify.backends import fp32_kernels, int8_kernels, native

pytestmark = pytest.mark.isa  # all of it runs again under `make test`'s ISA caps (Makefile)

REPO = Path(__file__).resolve().parents[1]

FROM_ZIP = """
import sys, zipfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from slmclassify.backends import fp32_kernels, int8_kernels, native
assert native.__file__.startswith(sys.argv[1]), native.__file__
assert isinstance(native.csrc(), zipfile.Path), type(native.csrc())  # no folder on disk to fall back on
for library in (int8_kernels.LIBRARY, fp32_kernels.LIBRARY):
    print(library.source, sorted(library.sources()), library.digest())
lib, why = fp32_kernels.LIBRARY.build(Path(sys.argv[2]), native.compile_flags())
assert lib is not None, why
print("built", lib.vector_width())
"""


def _as_a_wheel_ships_it(zip_path: Path) -> None:
    """The package zipped as setuptools installs it: its Python files and pyproject.toml's package data."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    data = config["tool"]["setuptools"]["package-data"]
    src = REPO / "src"
    with zipfile.ZipFile(zip_path, "w") as zf:
        for path in sorted((src / "slmclassify").rglob("*.py")):
            zf.write(path, path.relative_to(src).as_posix())
        for package, patterns in data.items():
            folder = src / package.replace(".", "/")
            for pattern in patterns:
                for path in sorted(folder.glob(pattern)):
                    zf.write(path, path.relative_to(src).as_posix())


def test_the_c_sources_are_package_data_read_through_the_package(tmp_path):
    """Installed without the repository (here: zipped, so not even a folder to read), the kernels
    find their .c files and the header they include, and build."""
    zipped = tmp_path / "slmclassify.zip"
    _as_a_wheel_ships_it(zipped)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", FROM_ZIP, str(zipped), str(tmp_path / "cache")], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    for library, line in zip((int8_kernels.LIBRARY, fp32_kernels.LIBRARY), lines):
        assert line == f"{library.source} {sorted(library.sources())} {library.digest()}"
        assert set(library.sources()) == {library.source, "vexp.h"}
    assert lines[2] in ("built 8", "built 16")


def _copy_of_the_sources(tmp_path: Path, monkeypatch) -> Path:
    copy = tmp_path / "csrc"
    with resources.as_file(native.csrc()) as folder:
        shutil.copytree(folder, copy)
    monkeypatch.setattr(native, "csrc", lambda: copy)
    return copy


@pytest.mark.parametrize("changed", ["int8.c", "fp32_attention.c", "vexp.h"])
def test_the_key_changes_with_any_byte_of_a_source(tmp_path, monkeypatch, changed):
    """A library's digest covers its own .c file and every header; the other library's does not
    change with a .c file it does not compile."""
    before = {lib.source: lib.digest() for lib in (int8_kernels.LIBRARY, fp32_kernels.LIBRARY)}
    copy = _copy_of_the_sources(tmp_path, monkeypatch)
    assert {lib.source: lib.digest() for lib in (int8_kernels.LIBRARY, fp32_kernels.LIBRARY)} == before
    data = bytearray((copy / changed).read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of one byte
    (copy / changed).write_bytes(bytes(data))
    after = {lib.source: lib.digest() for lib in (int8_kernels.LIBRARY, fp32_kernels.LIBRARY)}
    for source in before:
        assert (after[source] != before[source]) == (changed in (source, "vexp.h"))
    assert int8_kernels.source_digest() == after["int8.c"]


def test_a_stale_build_is_removed_and_the_current_one_kept(tmp_path, monkeypatch):
    """Building after a source changed removes the build of the old sources (same CPU, compiler and
    flags) once no process has loaded it for `KEEP_UNUSED_S`, and its recorded SHA-256; builds for
    another setup, another library, or loaded lately stay."""
    cache = tmp_path / "cache"
    library = fp32_kernels.LIBRARY
    flags = native.compile_flags()
    copy = _copy_of_the_sources(tmp_path, monkeypatch)
    lib, why = library.build(cache, flags)
    assert lib is not None, why
    kernels = cache / "kernels"
    (old,) = kernels.glob("fp32-attention-*.so")
    setup = old.name.split("-")[2]
    long_ago = time.time() - native.KEEP_UNUSED_S - 3600

    def planted(name: str, mtime: float) -> Path:
        path = kernels / name
        path.write_bytes(b"not a library")
        native._recorded(path).write_text("0" * 64)
        os.utime(path, (mtime, mtime))
        return path

    other_cpu = planted(f"fp32-attention-{'1' * 16}-{'2' * 16}.so", long_ago)
    other_library = planted(f"int8-{setup}-{'3' * 16}.so", long_ago)
    lately = planted(f"fp32-attention-{setup}-{'4' * 16}.so", time.time())
    named_before_setups = planted(f"fp32-attention-{'5' * 16}.so", long_ago)
    os.utime(old, (long_ago, long_ago))
    library.build(cache, flags)  # intact: loaded, not built, so nothing is removed, and its use is recorded
    assert old.stat().st_mtime > long_ago + 3600 and named_before_setups.exists()
    os.utime(old, (long_ago, long_ago))

    with open(copy / "vexp.h", "a") as fh:
        fh.write("/* changed */\n")
    lib, why = library.build(cache, flags)
    assert lib is not None, why
    (current,) = (p for p in kernels.glob(f"fp32-attention-{setup}-*.so") if p not in (old, lately))
    assert native._intact(current)
    assert not old.exists() and not native._recorded(old).exists()
    assert not named_before_setups.exists() and not native._recorded(named_before_setups).exists()
    for kept in (other_cpu, other_library, lately):
        assert kept.exists() and native._recorded(kept).exists()
