"""Giving freed host memory back to the system.

glibc's malloc keeps the pages of freed blocks in its heap for later allocations. Arranging the
weights frees each layer's source tensors while it allocates the arranged ones, and what the heap
could not reuse stayed resident: the peak of loading plus arranging reached 1.37-1.50x the float32
weights of a 94 MiB model, run to run (`tests/test_memory.py`), 14 MiB of it such pages.
`malloc_trim(0)` returns them (it also gives back free pages inside the heap, not only at its top).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _trim():
    """glibc's `malloc_trim`, or None where the C library has none (musl, macOS, Windows)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    """Return the pages of freed heap blocks to the system (a no-op without glibc)."""
    trim = _trim()
    if trim is not None:
        trim(0)
