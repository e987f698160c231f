"""Keep a GGUF file's pages out of the process while transformers de-quantises it.

transformers reads the file through `gguf.GGUFReader`, a read-only memory map, and de-quantises
every tensor into float32 before it frees the map: each page it read stayed resident until then,
so the conversion peaked at the float32 weights *plus the whole file* (a Qwen2.5-0.5B-shaped F16
GGUF: +2978 MiB for 1885 MiB of weights, 944 MiB of them file pages). Here the pages behind each
tensor are handed back (madvise MADV_DONTNEED) once transformers has copied it, which is when it
asks for the next one. The map is shared and read-only, so nothing is lost: a page read again
comes back from the file. The float32 values are untouched (the same bytes are read).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import sys

_MADV_DONTNEED = 4  # Linux


@contextlib.contextmanager
def released_gguf_pages():
    """While active, `gguf.dequantize` releases the pages of the tensor it was given before
    (transformers' `np.copy` of a float32 tensor reads the map after `dequantize` returns)."""
    import gguf

    if not sys.platform.startswith("linux"):
        yield
        return
    original = gguf.dequantize
    previous = []

    def dequantize(data, qtype):
        if previous:
            _release(previous.pop())
        previous.append(data)
        return original(data, qtype)

    gguf.dequantize = dequantize
    try:
        yield
    finally:
        gguf.dequantize = original
        previous.clear()


def _release(data) -> None:
    """Drop this process's pages wholly inside `data` (a read-only view of a file map)."""
    if data.flags.writeable or data.nbytes == 0:
        return  # not a read-only map: its pages may hold the only copy of something
    page = mmap.PAGESIZE
    start = -(-data.ctypes.data // page) * page
    end = (data.ctypes.data + data.nbytes) // page * page
    if end > start:
        ctypes.CDLL(None, use_errno=True).madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start),
                                                   _MADV_DONTNEED)
