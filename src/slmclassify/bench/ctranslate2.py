"""(i) rows of `slmclassify bench`: CTranslate2 on the same weights, with its best recipe for this job.

The model the bench runs (float32 Hugging Face weights; for a GGUF file, the de-quantised copy
`models/loading.py` made) is converted once with CTranslate2's `TransformersConverter` into the user
cache, keyed by a hash of its weights, config and tokenizer and by the CTranslate2 version, and
reused afterwards. One float32 conversion serves both precisions: int8 is CTranslate2's
load-time `compute_type="int8"` (its weights quantised per row when the generator loads).

Its recipe (what a CTranslate2 user would write for first-token scoring):
  - the shared prompt prefix is the `static_prompt` of `Generator.generate_batch`, whose keys and
    values CTranslate2 computes once and caches;
  - one generated step (`max_length=1`, `include_prompt_in_result=False`) with
    `return_logits_vocab=True`: the next-token distribution after the whole prompt, from which
    the label tokens' log-probs are read as the article's loop (a) reads them (log-softmax over
    the vocabulary at each label's first token);
  - items sorted by length, either one call per item or one call per batch (ragged tails of the
    longer prompts of a batch are decoded step by step, so per item can be the faster).

Under an instruction-set cap (`backends/isa.py`: `ONEDNN_MAX_CPU_ISA` / `ATEN_CPU_CAPABILITY` below
this CPU's level), CTranslate2's own kernels are capped alike (`CT2_FORCE_CPU_ISA`, which it reads
when it loads), unless the user set that variable: a capped bench compares both on the same CPU level.

Every item is fed exactly the token ids our encoder gives it (`EncodedItems`): the prefix ids as
the static prompt and its own ids after them; an item whose prompt does not start with the
prefix (a fallback) runs its whole prompt without a static prompt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .article import first_ids
from .on_batches import against_base

VERSION = "4.8.5"  # the pinned extra (`pip install 'slmclassify[ctranslate2]'`)
PRECISIONS = {"fp32": "float32", "int8": "int8"}  # our name -> CTranslate2 compute_type
# Batched mode's rows per call: the fewer the faster, and all slower than per item (CTranslate2
# decodes the longer prompts' tails token by token; figures in docs/performance.md).
BATCH_ROWS = 2


@dataclass
class PeerRow:
    """One (i) row: CTranslate2 in one precision, its faster mode."""

    precision: str
    name: str
    description: str
    vs_d: float
    """items/s over (d), timed interleaved with it on d's batches."""
    scores: np.ndarray
    """[n, L] first-token label log-probs."""
    modes: str
    """Both modes' ratios over (d), for the log."""


def cap_like_ours() -> str | None:
    """Set `CT2_FORCE_CPU_ISA` to the level this process's C kernels are built for under a cap
    (`isa.march`: x86-64-v3 is AVX2, v4 AVX512; see the module docstring), before CTranslate2 loads;
    returns the value in force (None: no cap, or not x86)."""
    from ..backends import isa

    level = {"x86-64-v2": "GENERIC", "x86-64-v3": "AVX2", "x86-64-v4": "AVX512"}.get(isa.march())
    if level is not None:
        os.environ.setdefault("CT2_FORCE_CPU_ISA", level)
    return os.environ.get("CT2_FORCE_CPU_ISA")


def skipped(device: torch.device) -> str | None:
    """Why the (i) rows are skipped here (one line), or None when they run."""
    if device.type != "cpu":
        return "CPU only: the bench compares it with ours on the CPU"
    cap_like_ours()
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return f"ctranslate2 is not installed: pip install 'slmclassify[ctranslate2]' (ctranslate2=={VERSION})"
    return None


def measure(loaded, task, clf, encoded, device: torch.device) -> list[PeerRow]:
    """fp32 and int8, per item and batched, all four timed interleaved with (d) (`clf`) on d's
    batches (`on_batches.against_base`); each precision's row is its faster mode."""
    forced = cap_like_ours()
    import ctranslate2

    from ..cache import cache_root

    isa = f", CT2_FORCE_CPU_ISA={forced}" if forced else ""
    folder = converted(loaded.model, loaded.tokenizer, cache_root())
    first = first_ids(loaded.tokenizer, task.labels).tolist()
    threads = torch.get_num_threads()  # as ours
    scorers = {p: CT2Scorer(folder, p, loaded.tokenizer, first, clf.prefix_ids, threads) for p in PRECISIONS}
    modes = ("per item", "batched")
    ratios, scores = against_base(clf, {f"{p} {mode}": getattr(scorer, mode.replace(" ", "_"))
                                        for p, scorer in scorers.items() for mode in modes}, encoded, device)
    rows = []
    for p, scorer in scorers.items():
        best = max(modes, key=lambda mode: ratios[f"{p} {mode}"])
        both = (f"per item {ratios[f'{p} per item']:.2f}x d, batched ({scorer.batch_rows} rows) "
                f"{ratios[f'{p} batched']:.2f}x d")
        rows.append(PeerRow(
            p, f"i ctranslate2 {p} {best}",
            f"ctranslate2 {ctranslate2.__version__} {PRECISIONS[p]}{isa}, static prompt cached, sorted, one step of "
            f"vocabulary logits; {both}, timed interleaved with d",
            ratios[f"{p} {best}"], scores[f"{p} {best}"], both))
    return rows


def weights_key(model: torch.nn.Module, tokenizer) -> str:
    """A hash of the weights, config and vocabulary: the conversion cache's key."""
    digest = hashlib.sha256()
    digest.update(model.config.to_json_string(use_diff=False).encode())
    digest.update(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().contiguous().cpu().numpy())  # hashed in place, not copied
    return digest.hexdigest()[:20]


def converted(model: torch.nn.Module, tokenizer, cache: Path) -> Path:
    """The CTranslate2 (float32) folder of this model under `cache`, converted on first use.

    Written atomically under a lock: a second process waits, and never reads a half-written folder."""
    import ctranslate2
    from filelock import FileLock

    from ..models.loading import quiet_transformers, save_hf_folder

    target = cache / f"ctranslate2-{weights_key(model, tokenizer)}-{ctranslate2.__version__}"
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{target}.lock"):
        if (target / "model.bin").is_file():
            return target
        work = Path(tempfile.mkdtemp(prefix=".ct2-", dir=target.parent))
        try:
            source = work / "hf"
            source.mkdir()
            save_hf_folder(model, tokenizer, source)
            with quiet_transformers():  # the converter loads the folder with transformers
                ctranslate2.converters.TransformersConverter(str(source)).convert(
                    str(work / "ct2"), quantization="float32")
            _fill_bos(work / "ct2" / "config.json", tokenizer)
            os.replace(work / "ct2", target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def _fill_bos(config_path: Path, tokenizer) -> None:
    """CTranslate2 refuses to load a model whose bos_token is null (a tokenizer without BOS, as
    Qwen2's): name the EOS token instead. No prompt here starts from it: every item passes its ids."""
    config = json.loads(config_path.read_text())
    if config.get("bos_token") is None:
        config["bos_token"] = tokenizer.eos_token
        config_path.write_text(json.dumps(config, indent=2))


class CT2Scorer:
    """First-token label log-probs from a CTranslate2 generator, per item or in batches."""

    def __init__(self, folder: Path, precision: str, tokenizer, first_ids: list[int], prefix_ids: list[int],
                 threads: int, batch_rows: int = BATCH_ROWS):
        import ctranslate2

        self.generator = ctranslate2.Generator(str(folder), device="cpu", compute_type=PRECISIONS[precision],
                                               intra_threads=threads, inter_threads=1)
        self.tokens = tokenizer.convert_ids_to_tokens  # CTranslate2 takes token strings
        self.first = np.asarray(first_ids)
        self.static = self.tokens(prefix_ids) or None
        self.batch_rows = batch_rows

    def per_item(self, items) -> np.ndarray:
        """[n, L] scores of `items` (non-empty `EncodedItems`), one call per item, shortest first."""
        out = np.zeros((len(items), len(self.first)))
        for i in _by_length(items, range(len(items))):
            out[i] = self._run(items, [i])[0]
        return out

    def batched(self, items) -> np.ndarray:
        """[n, L] scores of `items`, `batch_rows` items of neighbouring lengths per call (those
        continuing the prefix and the fallbacks, which have no static prompt, apart)."""
        out = np.zeros((len(items), len(self.first)))
        for cached in (True, False):
            group = _by_length(items, [i for i in range(len(items)) if bool(items.cached[i]) == cached])
            for k in range(0, len(group), self.batch_rows):
                rows = group[k : k + self.batch_rows]
                out[rows] = self._run(items, rows)
        return out

    def _run(self, items, rows: list[int]) -> np.ndarray:
        """[b, L] label log-probs after the prompts of `rows` (all cached or all fallbacks)."""
        results = self.generator.generate_batch(
            [self.tokens(items.suffix(i)) for i in rows],  # the ids after the prefix, or the whole prompt
            static_prompt=self.static if items.cached[rows[0]] else None,
            max_length=1, include_prompt_in_result=False, return_logits_vocab=True,
        )
        # r.logits[0]: [t, V] raw logits of the decoding loop's steps: an item longer than the
        # batch's shortest has its tail forced through it step by step; the last is the generated one.
        logits = np.stack([np.asarray(r.logits[0], dtype=np.float64)[-1] for r in results])  # [b, V]
        top = logits.max(axis=1, keepdims=True)
        log_z = np.log(np.exp(logits - top).sum(axis=1, keepdims=True)) + top  # as (a): log-softmax
        return logits[:, self.first] - log_z


def _by_length(items, rows) -> list[int]:
    """`rows`, shortest prompt first."""
    return sorted(rows, key=lambda i: len(items.own(i)))
