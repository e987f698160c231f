"""The public entry point: `Classifier(task).classify(texts)` → one `Result` per text, in order.

Data flow: load → render prompts → tokenize → schedule batches → forward with the prefix cache
→ score → results. The prefix is computed once per Classifier and reused by every batch.

Streaming: `classify_iter` reads its texts a *window* of rows at a time (`EngineSettings.window`),
sorts and batches by length within the window, scores identical items of a window once, and
yields results in input order; it holds one window of items, never the whole input. Window
boundaries are fixed by row number (rows k·W … (k+1)·W − 1), so every item sees the same batch
composition in every run over the same input: that is what makes resumed runs byte-identical.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from .core.calibration import CONTENT_FREE
from .core.encode import EncodedItems, valid_unicode
from .core import questions
from .core.labels import LabelTrie, describe_labels
from .core.reference import reference_scores
from .core.results import Result, RunStats
from .core.scoring import Scored, Scorer
from .core.settings import (  # noqa: F401  (re-exported: `from slmclassify.classifier import EngineSettings`)
    DEFAULT_MAX_ROWS,
    DEFAULT_MAX_TEXT_TOKENS,
    DEFAULT_TOKEN_BUDGET,
    DEFAULT_WINDOW,
    EngineSettings,
)
from .core.taps import Taps
from .core.task import Task
from .errors import InputError, TaskError
from .models.loading import LoadedModel
from .models.prepare import load_model
from .models.schedule import scheduled


@dataclass(frozen=True)
class ScoredItems:
    """Items scored by `Classifier.score_items` (one window of `classify_windows`): their raw scores,
    results and what scoring them did, in input order."""

    encoded: EncodedItems
    scores: np.ndarray
    """[n, L] raw label scores (NaN rows for empty items)."""
    results: list[Result]
    stats: RunStats
    """What these items cost: `items`, `scored`, `reused` (duplicates), batches, tokens, seconds."""
    states: np.ndarray | None = None
    """[n, len(taps) * hidden] float32 hidden states at the taps (`core/taps.py`; NaN rows for empty
    items), when scored with taps (a head's features, `head/`)."""
    start: int = 0
    """Input row index of the first item (a window's place in the input)."""


ResultsStep = Callable[["Classifier", np.ndarray, "np.ndarray | None", list[str]], list[Result]]
"""(classifier, raw scores [n, L] (NaN rows for empty items), hidden states at the taps or None,
status) → one Result per item, in order: how a scored window becomes results, made once per window
(`zero_shot_results`, the default; a head's: `head.apply.head_results`)."""

UniqueRun = Callable[[EncodedItems, list[int], list[bytes]], Scored]
"""(encoded, unique, keys) → the `Scored` of items `unique` (`EncodedItems.distinct`), whose
`stats.scored` counts the items run through the model; another way to get them than scoring them
all here (the Ray actors take items other actors ran from a shared board, `ray/sharing.py`)."""


def item_text(text, index: int, task: Task | None = None, where: str = "texts") -> str:
    """An item text as the engine takes it: None → "" (status empty); anything else must be a str,
    or for a task whose template names fields (`Task.fields`) a mapping of them, composed here.
    Errors name the item as `where[index]`."""
    if text is None:
        return ""
    if task is not None and task.multi_field:
        if not isinstance(text, Mapping):
            raise InputError(f"{where}[{index}] is a {type(text).__name__}; this task's template names the fields "
                             f"{', '.join(task.fields)}: pass a dict of them for each item")
        missing = [name for name in task.fields if name not in text]
        if missing:
            raise InputError(f"{where}[{index}] has no field {missing[0]!r}; the template names "
                             f"{', '.join(task.fields)}")
        bad = next((name for name in task.fields if text[name] is not None and not isinstance(text[name], str)), None)
        if bad is not None:
            raise InputError(f"{where}[{index}], field {bad!r} is a {type(text[bad]).__name__}, not a str")
        text = task.compose(text)
    if not isinstance(text, str):
        raise InputError(f"{where}[{index}] is a {type(text).__name__}, not a str (None counts as empty)")
    if not valid_unicode(text):
        raise InputError(f"{where}[{index}] is not valid Unicode (it holds a lone surrogate)")
    return text


class Classifier:
    """Classifies texts for one task with one model.

    Nothing in it changes after construction: scoring returns what it did (`Scored`, `ScoredItems`)
    instead of keeping it, and a variant (other batching settings, another label trie) is a new
    Classifier (`variant`) sharing the model, engine and prefix cache."""

    def __init__(
        self,
        task: Task,
        model: str | LoadedModel | None = None,
        settings: EngineSettings | None = None,
        precision_sample: Iterable[str | None] | None = None,
    ):
        """`model`: a prepared model (`load_model`), used as it is, or a source to prepare here with
        `settings`' device and precision. `precision_sample`: texts of the data to classify, for
        `--precision auto`'s check when the model is prepared here (its first 200 distinct non-empty
        texts, see `precision.verification_sample`; an iterator is consumed that far, so not the one
        to classify); None: article tickets."""
        self.task = task
        settings = settings or EngineSettings()
        self.loaded = load_model(model, settings.device, settings.precision, task=task,
                                 sample=precision_sample, settings=settings)
        settings, self.schedule = scheduled(settings, self.loaded)
        """The measured schedule this classifier's `AUTO` settings took (`models/schedule.py`), or None."""
        self.scorer = Scorer.build(task, self.loaded.tokenizer, self.loaded.model.config, settings)
        self.prefix = self.scorer.prefill(self.engine)
        """The engine's keys and values of the shared prefix (None without one)."""
        self.calibration = questions.Calibration(task, content_free_prior(self) if task.calibrate else None)
        """How raw scores are read: calibrated (`calibration.calibrated`), then results (`calibration.results`)."""

    # What the scorer holds, read-only here: a variant is a new Classifier (`variant`).
    settings = property(lambda self: self.scorer.settings)
    renderer = property(lambda self: self.scorer.renderer)
    label_tokens = property(lambda self: self.scorer.label_tokens,
                            doc="Each label's token ids as they follow the prompt (before the mode cuts them).")
    trie = property(lambda self: self.scorer.trie)
    mode_reason = property(lambda self: self.scorer.mode_reason)
    prefix_ids = property(lambda self: self.scorer.prefix_ids)
    split = property(lambda self: self.scorer.split)
    max_prompt_tokens = property(lambda self: self.scorer.max_prompt_tokens)
    engine = property(lambda self: self.loaded.engine, doc="The model's fast-path engine.")
    bias = property(lambda self: self.calibration.bias, doc="The content-free prior subtracted (None: not calibrated).")

    @property
    def mode(self) -> str:
        return self.trie.mode

    def variant(self, settings: EngineSettings | None = None, trie: LabelTrie | None = None) -> Classifier:
        """This classifier with other batching, window or item cap (`settings`; `AUTO` fields keep this
        classifier's values), or scoring the task's labels with another label trie (`trie`: same
        labels, in order, e.g. first tokens of labels that share them, `evaluate --compare-modes`;
        calibrated again). Same model, engine and prefix cache: the device, precision and prefix cache
        are the model's and the prefix's, so they cannot change here."""
        variant = self
        if settings is not None:
            fixed = ("device", "precision", "prefix_cache")
            changed = [f for f in fixed if getattr(settings, f) != getattr(self.settings, f)]
            if changed:
                raise TaskError(f"variant changes batching, window and item cap only, not {', '.join(changed)}: "
                                "build a new Classifier for those")
            settings = dataclasses.replace(settings, **{name: getattr(self.settings, name)
                                                        for name in settings.measured})
            schedule = self.schedule if all(getattr(settings, k) == getattr(self.settings, k)
                                            for k in ("token_budget", "max_rows")) else None
            variant = variant._variant(scorer=dataclasses.replace(variant.scorer, settings=settings), schedule=schedule)
        if trie is not None:
            variant = variant._variant(scorer=dataclasses.replace(variant.scorer, trie=trie))
            if self.task.calibrate:
                variant.calibration = questions.Calibration(self.task, content_free_prior(variant))
        return variant

    def _variant(self, **changes) -> Classifier:
        variant = object.__new__(Classifier)
        variant.__dict__.update(self.__dict__, **changes)
        return variant

    def encode(self, texts: Iterable[str], taps: Taps = Taps()) -> EncodedItems:
        """Render and tokenize texts (no model work), as a pass reading `taps` reads them (echoed
        with `taps.echo`, `core/taps.py`)."""
        return self.scorer.encode(texts, echo=taps.echo)

    def classify(self, texts: Iterable[str | None], progress: Callable[[int], None] | None = None) -> list[Result]:
        """One Result per text, in input order. `progress(n)` is called as n more items finish."""
        return list(self.classify_iter(texts, progress))

    def classify_iter(self, texts: Iterable[str | None],
                      progress: Callable[[int], None] | None = None) -> Iterator[Result]:
        """Yield one Result per text, in input order, holding one window of texts at a time.

        `texts` may be any iterable (a generator over a huge file); None counts as an empty text.
        A run's figures are the sum of its windows' stats (`classify_windows`).
        """
        for window in self.classify_windows(texts, progress):
            yield from window.results

    def classify_windows(self, texts: Iterable[str | None],
                         progress: Callable[[int], None] | None = None) -> Iterator[ScoredItems]:
        """The streaming core: one `ScoredItems` per `settings.window` texts, in input order, each with
        its own stats (add them up for the run's: `RunStats.add`)."""
        if isinstance(texts, (str, bytes)):
            raise InputError("classify() takes an iterable of texts, got a single "
                             f"{type(texts).__name__}; pass a list: classify([text])")
        iterator, start = iter(texts), 0
        while chunk := list(itertools.islice(iterator, self.settings.window)):
            yield self.score_items([item_text(t, start + k, self.task) for k, t in enumerate(chunk)], progress,
                                   start=start)
            start += len(chunk)

    def score_items(self, items: list[str] | EncodedItems, progress: Callable[[int], None] | None = None,
                    taps: Taps = Taps(), *, dedupe: bool = True, run: UniqueRun | None = None,
                    results: ResultsStep | None = None, start: int = 0) -> ScoredItems:
        """The one scoring step: encode → score identical items once → scatter → results.

        `items`: texts (encoded here as `taps` read them, the time counted) or items already encoded. `dedupe`: identical
        items (same token ids) are scored once and share the scores; off, every scored item is run
        (the batches of `score(encoded)`, so the same bits). `run`: how the distinct items get their
        scores (default: `score` them here). With `taps`, the hidden states of those layers too.
        `results`: how the scores become results (default: the zero-shot label scores'). `start`: the
        input row of the first item (a window's place in the input, `ScoredItems.start`).
        """
        began = time.perf_counter()
        encoded = items if isinstance(items, EncodedItems) else self.encode(items, taps)
        scored = encoded.scored
        if not dedupe and run is None:  # every scored item, in place: `score` leaves empty ones NaN
            part, source = self.score(encoded, progress, taps), scored
        else:
            unique, source, keys = (encoded.distinct() if dedupe
                                    else ([int(i) for i in scored], np.arange(len(scored)), []))
            part = run(encoded, unique, keys) if run is not None else self.score(encoded.subset(unique), progress, taps)
        scores = np.full((len(encoded), len(self.trie.labels)), np.nan, dtype=np.float64)
        scores[scored] = part.scores[source]  # [u, L] → [n, L]
        states = None
        if part.states is not None:
            states = np.full((len(encoded), part.states.shape[1]), np.nan, dtype=np.float32)
            states[scored] = part.states[source]
        reused = len(scored) - part.stats.scored
        if progress is not None and reused:
            progress(reused)
        stats = dataclasses.replace(part.stats, items=len(encoded), scored=len(scored), reused=reused,
                                    fallbacks=encoded.fallbacks, prefix_tokens=len(self.prefix_ids),
                                    seconds=time.perf_counter() - began)
        make = results or zero_shot_results
        return ScoredItems(encoded=encoded, scores=scores, results=make(self, scores, states, encoded.status),
                           stats=stats, states=states, start=start)

    def score(self, encoded: EncodedItems, progress: Callable[[int], None] | None = None,
              taps: Taps = Taps()) -> Scored:
        """Label scores of every item through the fast path, and what the pass did (`Scored`).

        With `taps` (`core/taps.py`), also the [n, len(taps) * hidden] float32 hidden states
        there (NaN rows for empty items) from the same pass.
        """
        return self.scorer.score(encoded, self.engine, self.prefix, progress, taps)

    def reference(self, encoded: EncodedItems, indices: Iterable[int]) -> np.ndarray:
        """[k, L] label scores of the given items through the per-item reference path."""
        full = encoded.ids
        rows = [
            reference_scores(self.loaded.model, full[i], self.trie).double().cpu().numpy()
            for i in indices
        ]
        return np.stack(rows) if rows else np.zeros((0, len(self.trie.labels)))

    def __repr__(self) -> str:
        what = self.task.shaped(lambda t: f"labels={list(t.labels)}",
                                lambda t: f"questions={[q.name for q in t.questions]}")
        return f"Classifier(model={self.loaded.name!r}, {what}, mode={self.mode!r})"


def zero_shot_results(classifier: Classifier, scores: np.ndarray, states: np.ndarray | None,
                      status: list[str]) -> list[Result]:
    """The default `ResultsStep`: results from the label scores alone (`Calibration.results`)."""
    return classifier.calibration.results(scores, status)


def content_free_prior(classifier: Classifier) -> np.ndarray:
    """[C] log prior of each label on content-free inputs (a few passes over the cached prefix), as
    `classifier`'s trie scores them.

    Measured in float32 in every precision (`Engine.exact`, same weights): the content-free
    prompts are nearly all template tokens, which move more in int8 than real items do, and the
    prior shifts every item's margins (figures: docs/performance.md)."""
    scorer = classifier.scorer
    encoded = scorer.encode(list(CONTENT_FREE), score_empty=True)
    exact = classifier.engine.exact()
    prefix = classifier.prefix if exact is classifier.engine else scorer.prefill(exact)
    return questions.prior(classifier.task, scorer.score(encoded, exact, prefix).scores)


def label_token_lines(classifier: Classifier) -> list[str]:
    """Each scored label (a multi-label task's yes/no branches) and its tokens after the chat template,
    with the warnings about misleading first tokens where they apply (`Task.first_tokens_matter`)."""
    return describe_labels(classifier.loaded.tokenizer, classifier.trie.labels, classifier.label_tokens,
                           warn=classifier.task.first_tokens_matter)


def engine_line(classifier: Classifier) -> str:
    """Device, precision, GEMM kernel, the measurement behind the choice and what it costs in memory,
    and the batch schedule and where it came from, for summaries."""
    from .backends.choice import provisional_reason
    from .models.precision import auto_line
    from .models.schedule import describe

    loaded = classifier.loaded
    line = loaded.backend.describe() if loaded.backend is not None else "cpu fp32"
    rates = loaded.gemm_rates or {}
    if rates.get("rates"):
        measured = ", ".join(f"{k} {v:.0f}" for k, v in rates["rates"].items())
        when = "cached" if rates.get("cached") else "measured now"
        if rates.get("provisional"):
            when += f", provisional: {provisional_reason(rates)}; measured again at a later start"
        line += f"; GEMM GFLOP/s on the model's shapes: {measured} ({when})"
    if loaded.engine is not None and (extra := loaded.engine.weight_copy_bytes()):
        line += f"; memory: the kernel's own copy of the linear weights, +{extra / 2**20:.0f} MiB"
    if auto := auto_line(loaded):
        line += f"; {auto}"
    if loaded.engine is not None:
        why = loaded.engine.batch_variance()
        line += ("; batch-invariant (an item's scores are the same bits in any batch)" if why is None
                 else f"; not batch-invariant: {why}")
    return line + f"; schedule: {describe(classifier.settings, classifier.schedule)}"


__all__ = ["Classifier", "EngineSettings", "Result", "ResultsStep", "ScoredItems", "content_free_prior", "engine_line",
           "label_token_lines", "zero_shot_results"]
