"""`--precision auto` on a CPU: a low precision only where it is faster here AND agrees with fp32.

Candidates are the low precisions this CPU runs natively (`backends.cpu_native`: bf16/fp16 need
AVX512-BF16/FP16 or AMX, int8 any x86 CPU) whose GEMM rate on the model's shapes, measured at
load (`backends.choice`), beats the float32 kernel by `MIN_SPEEDUP`. The fastest candidate is then
checked on a sample of `AGREEMENT_ITEMS` texts scored with the Classifier's own task: it is picked
only if ≥ `MIN_AGREEMENT` of its predictions equal the float32 fast path's (which is itself exact
against the reference). Otherwise the next candidate, and float32 when none passes.

The decision is made by the preparation stage only (`prepare.load_model(..., task=, sample=)`, which
`Classifier(task, model=path, precision_sample=texts)` calls), before any engine is built. The
sample is the user's data (passed by every command that has an input): its first `AGREEMENT_ITEMS`
distinct non-empty texts, topped up with article tickets when it has fewer; only the article tickets
when there is no data (`serve`, the library without a sample). A low precision can agree on one kind
of text and not on another (bf16 agreed on 200/200 article tickets and on 97.3% of the demo's
tickets), so the decision is cached per machine, model, task and sample (a hash of its texts and the
item-token cap): a new file is checked again, the same file is not.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from ..backends.choice import cached_entry, machine_key, model_key, speedup, store_entry
from ..backends.device import cpu_native
from ..backends.names import PRECISIONS
from ..cache import cache_root
from ..core.encode import valid_unicode
from ..core.scoring import Scorer
from ..core.settings import EngineSettings
from .engines import with_precision

LOW_PRECISIONS = ("int8", "bf16", "fp16")
MIN_SPEEDUP = 1.2
MIN_AGREEMENT = 0.995
"""Share of the sample that must agree. The aim is ≥ 99% agreement on the user's data; 200 items
cannot show 99% reliably (binomial: a precision that really agrees on 97.3% passes a 99% gate, ≤ 2
of 200 differing, 9% of the time), so the sample must
show 99.5% (≤ 1 of 200 differing): a precision agreeing on 97.3% then passes 2.7% of the time, on
98% 8.9%, while one agreeing on 99.9% still passes 98% of the time."""
AGREEMENT_ITEMS = 200
CHECK_VERSION = 6
"""Part of a cached decision's key with `MIN_AGREEMENT`: bump it when a low-precision kernel changes,
so that decisions made with other kernels or another gate are made again instead of reused (what
each bump was for: docs/performance.md)."""
SAMPLE_SCAN_ROWS = 10_000
"""Rows of the input looked at for the sample at most: the read-ahead stays bounded on an input of
endless repeats (then article tickets top the sample up)."""


@dataclass(frozen=True)
class Sample:
    """The texts `--precision auto` checks, and where they came from."""

    texts: tuple[str, ...]
    from_input: int
    """The first `from_input` texts are the user's; the rest are article tickets."""

    def describe(self) -> str:
        article = len(self.texts) - self.from_input
        if not self.from_input:
            return f"{article} article tickets"
        if not article:
            return f"{self.from_input} items of your input"
        return (f"{self.from_input} items of your input + {article} article tickets (your input has fewer "
                f"than {AGREEMENT_ITEMS} distinct non-empty texts)")

    def digest(self, max_text_tokens: int | None) -> str:
        """What the check scores: the texts and the cap they are cut at."""
        text = json.dumps([list(self.texts), max_text_tokens], ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def input_sample(texts: Iterable, n: int = AGREEMENT_ITEMS) -> list[str]:
    """The first `n` distinct non-empty texts among the first `SAMPLE_SCAN_ROWS` of `texts`.

    Reads an iterator only as far as it needs (the streaming job reads ahead through it).
    """
    seen: dict[str, None] = {}
    for row, text in enumerate(texts):
        if isinstance(text, str) and text.strip() and valid_unicode(text):  # else the row gets its own error
            seen.setdefault(text, None)
            if len(seen) == n:
                break
        if row + 1 >= SAMPLE_SCAN_ROWS:
            break
    return list(seen)


def verification_sample(texts: Iterable | None) -> Sample:
    """`AGREEMENT_ITEMS` texts to check: the input's (`input_sample`), topped up with article tickets."""
    from ..core.article_tickets import article_tickets

    own = input_sample(texts) if texts is not None else []
    missing = AGREEMENT_ITEMS - len(own)
    if missing <= 0:
        return Sample(tuple(own), len(own))
    taken = set(own)
    article = [t for t in input_sample(article_tickets(), n=AGREEMENT_ITEMS + len(own)) if t not in taken][:missing]
    return Sample(tuple(own + article), len(own))


@dataclass(frozen=True)
class Agreement:
    """How a low precision's label scores compare with float32's on the same items."""

    n: int
    agree: int
    """Items with the same predicted label."""
    max_prob_diff: float
    """Largest |Δ probability| of any label (softmax over the labels' scores)."""

    @property
    def share(self) -> float:
        return self.agree / self.n if self.n else 1.0

    @property
    def ok(self) -> bool:
        return self.share >= MIN_AGREEMENT


def agreement(low: np.ndarray, fp32: np.ndarray) -> Agreement:
    """Compare [n, L] label scores (rows of NaN, the empty items, are skipped)."""
    keep = ~np.isnan(fp32).any(axis=1)
    low, fp32 = low[keep], fp32[keep]
    if not len(fp32):
        return Agreement(0, 0, 0.0)
    same = low.argmax(axis=1) == fp32.argmax(axis=1)
    diff = np.abs(_softmax(low) - _softmax(fp32)).max()
    return Agreement(n=len(fp32), agree=int(same.sum()), max_prob_diff=float(diff))


def _softmax(scores: np.ndarray) -> np.ndarray:
    z = np.exp(scores - scores.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def candidates(measured: dict, device) -> list[str]:
    """Native low precisions faster than float32 here, fastest first."""
    fast = [p for p in LOW_PRECISIONS if cpu_native(p) and speedup(measured, p, device) >= MIN_SPEEDUP]
    return sorted(fast, key=lambda p: -speedup(measured, p, device))


def decide_auto(bare, device, task, texts: Iterable | None = None, settings=None, log=None):
    """`--precision auto` on a CPU for `bare` (a LoadedModel without an engine) on `task` and `texts`
    (the user's data; None: article tickets, see `verification_sample`), scored with `settings`'
    batching and item cap: the LoadedModel of the precision decided, `auto_decision` set.

    A decision cached for the same machine, model, task and sample builds that precision's engine
    alone; otherwise float32's and each candidate's, until one agrees (`_decide`)."""
    settings = settings or EngineSettings()
    config = bare.model.config
    sample = verification_sample(texts)
    task_hash = hashlib.sha256(repr(task).encode()).hexdigest()[:12]
    key = (f"auto|{machine_key(device)}|{model_key(config)}|task {task_hash}"
           f"|sample {sample.digest(settings.max_text_tokens)}|check {CHECK_VERSION} gate {MIN_AGREEMENT}")
    decided = cached_entry(cache_root(), key, {"precision": str})
    if decided is not None and decided["precision"] in PRECISIONS[1:]:  # else foreign or edited: decided again
        return with_precision(bare, decided["precision"], device, auto_decision={**decided, "cached": True})
    fp32 = with_precision(bare, "fp32", device)
    decided, chosen = _decide(fp32, Scorer.build(task, fp32.tokenizer, config, settings), list(sample.texts), log)
    decided["sample"] = sample.describe()
    store_entry(cache_root(), key, decided)
    if decided["precision"] != chosen.backend.precision:
        chosen = with_precision(fp32, decided["precision"])
    return replace(chosen, auto_decision={**decided, "cached": False})


def auto_line(loaded) -> str | None:
    """The line every command prints for a model loaded with `--precision auto` once decided; None otherwise."""
    return None if loaded.auto_decision is None else f"precision auto: {describe(loaded.auto_decision)}"


def describe(decision: dict) -> str:
    """`--precision auto`'s decision in words: the precision, the sample and each agreement checked."""
    checks = "; ".join(f"{p} {t['agree']}/{t['n']} agree with fp32 (max |Δ probability| {t['max_prob_diff']:.1e})"
                       for p, t in decision["tried"].items())
    sample = decision.get("sample", "article tickets")
    line = (f"{decision['precision']}, checked on {sample}: {checks}" if checks
            else f"{decision['precision']} (no low precision runs faster than float32 here)")
    return line + ("; decided earlier on the same sample (cached)" if decision.get("cached") else "")


def _decide(loaded, scorer: Scorer, texts: list[str], log) -> tuple[dict, object]:
    """(the decision, the LoadedModel of the precision chosen) from scoring `texts` in float32 and
    in each faster candidate, fastest first, until one agrees."""
    device = loaded.backend.device
    tried = {}
    order = candidates(loaded.gemm_rates, device)
    if not order:
        return {"precision": "fp32", "tried": tried}, loaded
    encoded = scorer.encode(texts)
    reference = scorer.score(encoded, loaded.engine, scorer.prefill(loaded.engine)).scores
    for precision in order:
        low = with_precision(loaded, precision)
        result = agreement(scorer.score(encoded, low.engine, scorer.prefill(low.engine)).scores, reference)
        tried[precision] = {"agree": result.agree, "n": result.n, "max_prob_diff": result.max_prob_diff,
                            "gemm_speedup": round(speedup(loaded.gemm_rates, precision, device), 2)}
        if log:
            log(f"precision auto: {precision} agrees with fp32 on {result.agree}/{result.n}, "
                f"max |Δ probability| {result.max_prob_diff:.1e}")
        if result.ok:
            return {"precision": precision, "tried": tried}, low
    return {"precision": "fp32", "tried": tried}, loaded
