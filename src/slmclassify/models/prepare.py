"""Model preparation, the one stage that turns a source into a model ready to score with:
read it (`loading.read_model`: its config checked before its weights), decide its precision, and
build its one fast-path engine. Every job, the service and the labelling session call
`load_model` once; a `Classifier` takes the decided model it gives (or a source, which it hands here).

`--precision auto` on a CPU is decided here and only here (`precision.decide_auto`), on the task the
model will score and a sample of the user's texts, before any engine is built: a decision cached
earlier builds the decided precision's engine alone.
"""

from __future__ import annotations

import os

import torch

from ..errors import TaskError
from .engines import with_precision
from .loading import LoadedModel, check_architecture, finish, quiet_transformers, read_model


def load_model(source: str | os.PathLike | LoadedModel | None = None, device: str | None = None,
               precision: str | None = None, *, task=None, sample=None, settings=None) -> LoadedModel:
    """The model of `source` with its precision decided and its engine built.

    `source`: None (the embedded model), a `.gguf` file, a local folder or a hub id (`loading.py`),
    or a LoadedModel, which is prepared already and returned as it is. `device` auto|cpu|cuda (auto:
    CUDA when available); `precision` auto|fp32|bf16|fp16|int8 (None: fp32 on a CPU, bf16 on CUDA;
    auto: bf16 on CUDA, and on a CPU a low precision only where it is faster here and agrees with
    fp32 on `task`, see `precision.py`). `task`, `sample` and `settings` are what `--precision auto`
    checks on a CPU: the task, the texts to score (None: article tickets) and the batching and item
    cap they are scored with; auto on a CPU without a task is refused. The Hugging Face model itself
    stays float32 on the device: it is the reference path.
    """
    if isinstance(source, LoadedModel):
        return source
    from ..backends.device import resolve_device
    from ..core.settings import check_precision

    device, precision = resolve_device(device), check_precision(precision)
    _check_decidable(device, precision, task)
    with quiet_transformers():
        model, tokenizer, name = read_model(source)
    if device.type != "cpu":
        model.to(device)
    return _decided(LoadedModel(model=model, tokenizer=tokenizer, name=name), device, precision, task, sample, settings)


def wrap_model(model: torch.nn.Module, tokenizer, name: str, device: str | None = None,
               precision: str | None = None, *, task=None, sample=None, settings=None) -> LoadedModel:
    """A LoadedModel around a model built in memory (e.g. random weights with a real model's
    shapes, as `examples/gpu_check/gpu_check.py` does), prepared as `load_model` prepares one it reads.
    A model whose weights are memory-mapped (transformers' default `from_pretrained`) keeps the
    file's pages resident next to the engine's arranged copies; `load_model` reads without a map."""
    from ..backends.device import resolve_device
    from ..core.settings import check_precision

    check_architecture(model.config.model_type, name)
    device, precision = resolve_device(device), check_precision(precision)
    _check_decidable(device, precision, task)
    model, tokenizer = finish(model.float().to(device), tokenizer)
    return _decided(LoadedModel(model=model, tokenizer=tokenizer, name=name), device, precision, task, sample, settings)


def _check_decidable(device: torch.device, precision: str | None, task) -> None:
    """Refuse `--precision auto` on a CPU without the task it is checked on, before any reading."""
    if precision == "auto" and device.type == "cpu" and task is None:
        raise TaskError("precision auto on a CPU is checked on the task the model will score: pass task= (and "
                        "sample=, the texts to classify) to load_model, or give Classifier the model's path "
                        "with EngineSettings(precision='auto')")


def _decided(bare: LoadedModel, device: torch.device, precision: str | None, task, sample, settings) -> LoadedModel:
    """`bare` (no engine yet) with its precision decided and the engine of that precision."""
    if precision == "auto" and device.type == "cpu":
        from .precision import decide_auto  # scores with core/scoring: not needed by every load

        return decide_auto(bare, device, task, sample, settings)
    if precision in (None, "auto"):
        precision = "bf16" if device.type == "cuda" else "fp32"
    return with_precision(bare, precision, device)
