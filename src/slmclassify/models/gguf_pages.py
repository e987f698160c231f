"""Keep a GGUF conversion's peak near one float32 copy of the weights, and read its metadata once.

transformers de-quantises a GGUF file (`load_gguf_checkpoint`) tensor by tensor through a
read-only memory map (`gguf.GGUFReader`): `gguf.dequantize(data)`, then `np.copy` of the result,
kept as a torch tensor. Three things sat on top of the float32 weights at the peak; while
`converting_gguf()` is active each goes:

- **The file's pages.** Each page read stayed resident until the map was freed, after the last
  tensor. A float32 tensor's map is now copied in 16 MiB slices, each slice's pages handed back
  (madvise MADV_DONTNEED) once copied; a quantised tensor's pages go when the next one is asked for.
  The map is shared and read-only, so nothing is lost: a page read again comes back from the file.
- **A second copy of the largest tensor.** `np.copy` of an array that `dequantize` had just made
  (every quantised or float16 tensor) copied it again: a large embedding was held twice. Such a
  fresh array, which nothing else refers to, is now passed on as is.
- **The reader's parsed metadata** (one small array object per token and merge), held until the
  last tensor: it is freed once the tensors are read, when transformers has taken the config and
  tokenizer from it.

`tests/test_memory.py` pins the peak on a small file; the figures on real files are in the results
log (docs/results.md, "figures moved from docstrings"). The float32 values are untouched (the
converted folder is byte-identical): the same bytes, copied once.

**The metadata, parsed once.** `gguf.GGUFReader` parses every field of the file when it is made,
one small numpy view per token and merge of the vocabulary, which takes seconds for a real
vocabulary. A conversion made four: the architecture check (`loading._gguf_architecture`), the
tokenizer, the config and the tensors (transformers calls `load_gguf_checkpoint` once for each). While
`converting_gguf()` is active a reader of the same file is made once and shared, until its tensors
are read, when its fields are freed as above. Likewise the map from the file's tensor names to the
model's (`gguf.get_tensor_name_map`), which transformers built again for every module of the model
(hundreds of times), is built once per architecture and depth.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import sys
import weakref

import numpy as np

_MADV_DONTNEED = 4  # Linux
_SLICE = 16 << 20  # bytes of a float32 map copied before their pages are handed back


@contextlib.contextmanager
def converting_gguf():
    """While active, a GGUF file's metadata is parsed once and its tensor-name map built once, and
    (on Linux) transformers' GGUF loading keeps one copy of each tensor: the module docstring."""
    import gguf
    from gguf.gguf_reader import GGUFReader

    readers: dict = {}  # (file, mode) -> the reader the loads share until its tensors are read

    class SharedReader(GGUFReader):
        def __new__(cls, path, mode="r"):
            made = readers.get(_reader_key(path, mode))
            return super().__new__(cls) if made is None else made

        def __init__(self, path, mode="r"):
            key = _reader_key(path, mode)
            if readers.get(key) is not self:
                super().__init__(path, mode)
                readers[key] = self

    def tensors_read():  # the tensors are being read: the metadata has been (transformers' order)
        for reader in readers.values():
            reader.fields.clear()  # in place: transformers holds the same dict
        readers.clear()

    name_map, maps = gguf.get_tensor_name_map, {}

    def tensor_name_map(arch, n_blocks):  # read-only, asked for again by every module of the model
        if (arch, n_blocks) not in maps:
            maps[arch, n_blocks] = name_map(arch, n_blocks)
        return maps[arch, n_blocks]

    gguf.GGUFReader, gguf.get_tensor_name_map = SharedReader, tensor_name_map
    try:
        with _one_copy_of_each_tensor(tensors_read):
            yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = GGUFReader, name_map
        readers.clear()
        maps.clear()


def _reader_key(path, mode) -> tuple[str, str]:
    return os.path.realpath(path), mode


@contextlib.contextmanager
def _one_copy_of_each_tensor(tensors_read):
    """The tensors' pages and copies (the module docstring); `tensors_read()` is called before each
    tensor is de-quantised. Elsewhere than Linux only that."""
    import gguf
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    original, numpy = gguf.dequantize, gguf_utils.np
    on_linux = sys.platform.startswith("linux")
    previous, fresh = [], {}

    def dequantize(data, qtype):
        tensors_read()
        if not on_linux:
            return original(data, qtype)
        if previous:
            _release(previous.pop())
        previous.append(data)
        fresh.clear()
        out = original(data, qtype)
        if out.flags.owndata:
            fresh[id(out)] = weakref.ref(out)  # made here: nothing else refers to it
        return out

    def copy(a, *args, **kwargs):
        made = fresh.pop(id(a), None)
        if not args and not kwargs and made is not None and made() is a:
            return a  # what dequantize (or transformers' processing of it) just made: no second copy
        if not args and not kwargs and isinstance(a, np.ndarray) and not a.flags.writeable and a.flags.c_contiguous:
            return _copy_releasing(a)
        return np.copy(a, *args, **kwargs)

    gguf.dequantize = dequantize
    if on_linux:
        gguf_utils.np = _NumpyWith(copy)
    try:
        yield
    finally:
        gguf.dequantize, gguf_utils.np = original, numpy
        previous.clear()
        fresh.clear()


class _NumpyWith:
    """numpy, with another `copy` (what transformers' GGUF module calls as `np`)."""

    def __init__(self, copy):
        self.copy = copy

    def __getattr__(self, name):
        return getattr(np, name)


def _copy_releasing(a: np.ndarray) -> np.ndarray:
    """A copy of the read-only `a`, slice by slice, each slice's pages handed back once copied."""
    out = np.empty_like(a)
    src, dst = a.reshape(-1), out.reshape(-1)
    step = max(1, _SLICE // max(1, a.itemsize))
    for start in range(0, src.size, step):
        dst[start : start + step] = src[start : start + step]
        _release(src[start : start + step])
    return out


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
