"""Read a causal LM's safetensors weights into the process's own memory, once.

transformers' default memory-maps the safetensors file and makes every parameter a view of the
map: each page read (all of them, once the engine re-arranges the weights) stays in the process's
resident memory for as long as any view lives, next to the engine's arranged copies, so loading
peaked at about twice the weights. Here every tensor is read from the file straight into a tensor
of its own when transformers asks for it (`_FileTensor`, handed to `from_pretrained` as the state
dict): no file page counts toward the process, and a tensor the engine re-arranges is freed as
soon as its arranged copy exists (`core/engine/arrange.py`), so the transient is one layer, not the model.
safetensors' own `pread` backend read each tensor into a buffer and copied it, so the largest
tensor (a large vocabulary's embedding) was held twice for a moment, and that moment was the
load's peak (figures: docs/results.md, "figures moved from docstrings"). safetensors still reads
and checks each file's header.

A checkpoint of tied embeddings may store the shared matrix under the output layer's name (our
GGUF conversions do); it is renamed to the input embedding's, which transformers loads and then
ties, instead of allocating (and initialising) an embedding-sized placeholder first.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import torch

_SINGLE = "model.safetensors"
_INDEX = "model.safetensors.index.json"
_SEQUENTIAL = "HF_DEACTIVATE_ASYNC_LOAD"


def safetensors_files(where: str, local_only: bool) -> list[str]:
    """The safetensors files of a local folder or hub id (downloaded if needed); [] when there are none."""
    from transformers.utils.hub import cached_file

    def find(name: str) -> str | None:
        return cached_file(where, name, local_files_only=local_only, _raise_exceptions_for_missing_entries=False,
                           _raise_exceptions_for_connection_errors=False)

    single = find(_SINGLE)
    if single:
        return [single]
    index = find(_INDEX)
    if not index:
        return []
    shards = sorted(set(json.loads(Path(index).read_text())["weight_map"].values()))
    files = [find(shard) for shard in shards]
    return files if all(files) else []


def from_safetensors(config, files: list[str]) -> torch.nn.Module:
    """The `*ForCausalLM` of `config` in float32 with the weights of `files`, read without a memory map."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    handles = [safe_open(f, framework="pt", device="cpu", backend="pread") for f in files]  # checks the header
    state = {}
    for file, handle in zip(files, handles):
        entries = _header(file)
        for key in handle.keys():  # read when loaded
            state[key] = _FileTensor.of(file, entries[key]) or handle.get_slice(key)
    model_class = AutoModelForCausalLM._model_mapping[type(config)]  # Auto* deep-copies its kwargs
    if getattr(config, "tie_word_embeddings", False):
        for target, source in (getattr(model_class, "_tied_weights_keys", None) or {}).items():
            if target in state and source not in state:
                state[source] = state.pop(target)
    with _sequential_loading():
        model, info = model_class.from_pretrained(None, config=config, state_dict=state, dtype=torch.float32,
                                                  output_loading_info=True, ignore_mismatched_sizes=True)
    del state, handles
    check_complete(info, str(Path(files[0]).parent))
    return model


def check_complete(info: dict, source: str) -> None:
    """Refuse a model whose files lack weights its architecture needs, or hold one of another shape
    (`info`: transformers' `output_loading_info`, read with `ignore_mismatched_sizes`): transformers
    would fill them with random values, and the reference path computes with the same ones, so
    nothing else would notice."""
    from ..errors import ModelLoadError

    mismatched = list(info.get("mismatched_keys") or ())
    if mismatched:  # transformers' (name, shape in the files, shape the architecture needs)
        name, found, needed = mismatched[0]
        more = f" (and {len(mismatched) - 1} more)" if len(mismatched) > 1 else ""
        raise ModelLoadError(f"cannot load model {source!r}: its weight {name} has shape {list(found)} but its "
                             f"configuration needs {list(needed)}{more}: the files and their configuration (or a "
                             "GGUF file's metadata, e.g. a head_dim it does not record) disagree")
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ModelLoadError(f"cannot load model {source!r}: its files lack {len(missing)} weight(s) its architecture "
                             f"needs ({shown}); the files are incomplete: copy or download them again")


@contextlib.contextmanager
def _sequential_loading():
    """Materialise the tensors on this thread (transformers' switch, restored afterwards).

    transformers reads them in a pool of 4 threads by default, and glibc serves each thread from
    an arena of its own: the memory of the tensors the engine frees while arranging then stays
    in those arenas, unusable by this thread's allocations, and the engine's copies came on top
    (+400 MB, 80% of the weights, on SmolLM2-135M). Read on this thread, the freed memory is
    reused layer after layer.
    """
    previous = os.environ.get(_SEQUENTIAL)
    os.environ[_SEQUENTIAL] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ[_SEQUENTIAL]
        else:
            os.environ[_SEQUENTIAL] = previous


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def _header(file: str) -> dict:
    """{name: entry} of a safetensors file's header, with each entry's absolute byte offsets."""
    with open(file, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    for entry in header.values():
        begin, end = entry["data_offsets"]
        entry["span"] = (8 + size + begin, end - begin)
    return header


class _FileTensor:
    """One tensor of a safetensors file, read into a tensor of its own on `[...]`, which is how
    transformers materialises a state dict's lazy entries (as it does safetensors' slices)."""

    def __init__(self, file: str, offset: int, nbytes: int, shape: tuple[int, ...], dtype: torch.dtype, name: str):
        self.file, self.offset, self.nbytes, self.shape, self.dtype, self.name = file, offset, nbytes, shape, dtype, name

    @classmethod
    def of(cls, file: str, entry: dict) -> _FileTensor | None:
        """The entry's lazy tensor; None for a dtype read here is not (safetensors' slice reads it)."""
        dtype = _DTYPES.get(entry["dtype"])
        if dtype is None:
            return None
        offset, nbytes = entry["span"]
        return cls(file, offset, nbytes, tuple(entry["shape"]), dtype, entry["dtype"])

    def get_shape(self) -> list[int]:
        return list(self.shape)

    def get_dtype(self) -> str:
        return self.name

    def __getitem__(self, key) -> torch.Tensor:
        if key is not Ellipsis:
            raise TypeError("a whole tensor only ([...])")
        from safetensors import SafetensorError

        out = torch.empty(self.shape, dtype=self.dtype)
        view = memoryview(out.reshape(-1).view(torch.uint8).numpy()) if out.numel() else memoryview(b"")
        if view.nbytes != self.nbytes:
            raise SafetensorError(f"a tensor's size in {self.file} disagrees with its shape")
        with open(self.file, "rb", buffering=0) as f:
            f.seek(self.offset)
            done = 0
            while done < self.nbytes:
                got = f.readinto(view[done:])
                if not got:
                    raise SafetensorError(f"{self.file} ends inside a tensor: it is truncated")
                done += got
        return out
