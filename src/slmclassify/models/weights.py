"""Read a causal LM's safetensors weights into the process's own memory, once.

transformers' default memory-maps the safetensors file and makes every parameter a view of the
map: each page read (all of them, once the engine re-arranges the weights) stays in the process's
resident memory for as long as any view lives, next to the engine's arranged copies, so loading
peaked at about twice the weights. Here every tensor is read with pread(2) (safetensors' `pread`
backend) into memory of its own and handed to `from_pretrained` as its state dict: no file page
counts toward the process, and a tensor the engine re-arranges is freed as soon as its arranged
copy exists (`core/engine.py`), so the transient is one layer, not the model.

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

    handles = [safe_open(f, framework="pt", device="cpu", backend="pread") for f in files]
    state = {key: handle.get_slice(key) for handle in handles for key in handle.keys()}  # read when loaded
    model_class = AutoModelForCausalLM._model_mapping[type(config)]  # Auto* deep-copies its kwargs
    if getattr(config, "tie_word_embeddings", False):
        for target, source in (getattr(model_class, "_tied_weights_keys", None) or {}).items():
            if target in state and source not in state:
                state[source] = state.pop(target)
    with _sequential_loading():
        model = model_class.from_pretrained(None, config=config, state_dict=state, dtype=torch.float32)
    del state, handles
    return model


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
