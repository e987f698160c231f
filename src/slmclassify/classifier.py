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

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from .models.activation_ranges import ranges_for
from .core.batching import Batch, collate, plan_batches
from .core.calibration import CONTENT_FREE, adjust, prior_from_scores
from .core.config_check import context_limit
from .core.encode import EncodedItems, PromptSplit, choose_prefix, encode_items, valid_unicode
from .core.engine import Engine
from .errors import InputError, TaskError
from .core.labels import build_trie, end_of_turn_id, label_sequences, resolve_mode
from .models.loading import LoadedModel, load_model
from .core.prompts import PromptRenderer
from .core.reference import reference_scores
from .core.results import Result, RunStats, make_results
from .core.settings import (  # noqa: F401  (re-exported: `from slmclassify.classifier import EngineSettings`)
    DEFAULT_MAX_ROWS,
    DEFAULT_MAX_TEXT_TOKENS,
    DEFAULT_TOKEN_BUDGET,
    DEFAULT_WINDOW,
    EngineSettings,
)
from .core.task import Task


@dataclass(frozen=True)
class ScoredWindow:
    """One window of `classify_windows`: its items, raw scores and results, in input order."""

    start: int
    """Input row index of the window's first item."""
    encoded: EncodedItems
    scores: np.ndarray
    """[n, L] raw label scores (NaN rows for empty items)."""
    results: list[Result]
    states: np.ndarray | None = None
    """[n, len(taps) * hidden] float32 hidden states at each item's last token (NaN rows for empty
    items), when `score_window` was given taps (a head's features, `head/`)."""


def _clean(text, index: int) -> str:
    """An item text as the engine takes it: None → "" (status empty); anything else must be a str."""
    if text is None:
        return ""
    if not isinstance(text, str):
        raise InputError(f"texts[{index}] is a {type(text).__name__}, not a str (None counts as empty)")
    if not valid_unicode(text):
        raise InputError(f"texts[{index}] is not valid Unicode (it holds a lone surrogate)")
    return text


class Classifier:
    """Classifies texts for one task with one model."""

    def __init__(
        self,
        task: Task,
        model: str | LoadedModel | None = None,
        settings: EngineSettings | None = None,
        precision_sample: Iterable[str | None] | None = None,
    ):
        """`precision_sample`: texts of the data to classify, for `--precision auto`'s check (its first
        200 distinct non-empty texts, see `precision.verification_sample`; an iterator is consumed that
        far, so not the one to classify); None: article tickets. Only the first Classifier of a model
        loaded with precision auto on a CPU makes that check."""
        self.task = task
        self.settings = settings or EngineSettings()
        self.loaded = (model if isinstance(model, LoadedModel)
                       else load_model(model, self.settings.device, self.settings.precision))
        tokenizer = self.loaded.tokenizer
        self.renderer = PromptRenderer(tokenizer, task)
        self.label_tokens = label_sequences(tokenizer, self.renderer.tail, task.labels)
        """Each label's token ids as they follow the prompt (before the mode truncates or terminates them)."""
        mode, sequences, self.mode_reason = resolve_mode(
            task.labels, self.label_tokens, task.mode, end_of_turn_id(tokenizer)
        )
        self.trie = build_trie(task.labels, sequences, mode)
        if self.loaded.engine is None:  # re-arranging the weights once per model, not per classifier
            self.loaded.engine = Engine(self.loaded.model, self.loaded.backend, ranges=ranges_for(tokenizer))
        self.engine = self.loaded.engine
        self.prefix_ids = choose_prefix(tokenizer, self.renderer.head) if self.settings.prefix_cache else []
        self.prefix = self.engine.prefill(self.prefix_ids) if self.prefix_ids else None
        self.split = PromptSplit(tokenizer, self.renderer)
        # The engine is exact up to this length (the model's context, or less: see config_check).
        context = context_limit(self.loaded.model.config)
        self.max_prompt_tokens = context - max(len(s) for s in self.trie.sequences)
        self.stats = RunStats()
        if self.loaded.auto_precision:  # --precision auto on a CPU: decided once per model
            from .models.precision import settle_auto

            settle_auto(self, precision_sample)
        self.bias = self.content_free_prior() if task.calibrate else None

    def content_free_prior(self) -> np.ndarray:
        """[L] log prior of each label on content-free inputs (a few passes over the cached prefix).

        Measured in float32 in every precision (`Engine.exact`, same weights): the content-free
        prompts are nearly all template tokens, which move more in int8 than real items do, and the
        prior shifts every item's margins (on 200 intent items, int8 scores agreed with fp32 on 197
        raw and 171 calibrated with int8's own prior; 180 with fp32's, at fp32's accuracy)."""
        encoded = encode_items(
            self.loaded.tokenizer, self.renderer, list(CONTENT_FREE), self.prefix_ids,
            self.max_prompt_tokens, score_empty=True, split=self.split,
        )
        stats, engine, prefix = self.stats, self.engine, self.prefix
        exact = engine.exact()
        if exact is not engine:
            self.engine = exact
            self.prefix = exact.prefill(self.prefix_ids) if self.prefix_ids else None
        try:
            prior = prior_from_scores(self.score(encoded))
        finally:
            self.engine, self.prefix = engine, prefix
            self.stats = stats  # calibration passes are not part of a run's figures
        return prior

    def calibrated(self, scores: np.ndarray) -> np.ndarray:
        """Scores with the task's calibration applied (prior removed, temperature)."""
        return adjust(scores, self.bias, self.task.temperature)

    @property
    def mode(self) -> str:
        return self.trie.mode

    def encode(self, texts: Iterable[str]) -> EncodedItems:
        """Render and tokenize texts (no model work)."""
        return encode_items(
            self.loaded.tokenizer, self.renderer, list(texts), self.prefix_ids,
            self.max_prompt_tokens, self.settings.max_text_tokens, split=self.split,
        )

    def classify(self, texts: Iterable[str | None], progress: Callable[[int], None] | None = None) -> list[Result]:
        """One Result per text, in input order. `progress(n)` is called as n more items finish."""
        return list(self.classify_iter(texts, progress))

    def classify_iter(self, texts: Iterable[str | None],
                      progress: Callable[[int], None] | None = None) -> Iterator[Result]:
        """Yield one Result per text, in input order, holding one window of texts at a time.

        `texts` may be any iterable (a generator over a huge file); None counts as an empty text.
        `self.stats` covers every window done so far.
        """
        for window in self.classify_windows(texts, progress):
            yield from window.results

    def classify_windows(self, texts: Iterable[str | None],
                         progress: Callable[[int], None] | None = None) -> Iterator[ScoredWindow]:
        """The streaming core: one `ScoredWindow` per `settings.window` texts, in input order."""
        if isinstance(texts, (str, bytes)):
            raise InputError("classify() takes an iterable of texts, got a single "
                             f"{type(texts).__name__}; pass a list: classify([text])")
        total = RunStats(prefix_tokens=len(self.prefix_ids))
        self.stats = total
        iterator, start = iter(texts), 0
        while chunk := list(itertools.islice(iterator, self.settings.window)):
            window = self.score_window([_clean(t, start + k) for k, t in enumerate(chunk)], start, progress)
            total.add(self.stats)
            self.stats = total
            start += len(chunk)
            yield window

    def score_window(self, texts: list[str], start: int = 0, progress: Callable[[int], None] | None = None,
                     taps: tuple[int, ...] = ()) -> ScoredWindow:
        """Encode and score one window; identical items (same token ids) are scored once.

        With `taps`, the window also carries the hidden states of those layers (see `score`).
        """
        began = time.perf_counter()
        encoded = self.encode(texts)
        scored = encoded.scored
        unique, source, _ = encoded.distinct()
        unique_scores = self.score(encoded.subset(unique), progress, taps=taps)  # [u, L]
        states = None
        if taps:
            unique_scores, unique_states = unique_scores
            states = np.full((len(encoded), unique_states.shape[1]), np.nan, dtype=np.float32)
            states[scored] = unique_states[source]
        scores = np.full((len(encoded), len(self.task.labels)), np.nan, dtype=np.float64)
        scores[scored] = unique_scores[source]
        reused = len(scored) - len(unique)
        if progress is not None and reused:
            progress(reused)
        stats = self.stats
        stats.items, stats.scored, stats.reused = len(encoded), len(scored), reused
        stats.fallbacks = encoded.fallbacks
        stats.seconds = time.perf_counter() - began
        results = make_results(self.task.labels, scores, self.calibrated(scores), encoded.status,
                               self.task.min_confidence)
        return ScoredWindow(start=start, encoded=encoded, scores=scores, results=results, states=states)

    def score(self, encoded: EncodedItems, progress: Callable[[int], None] | None = None,
              taps: tuple[int, ...] = ()):
        """[n, L] label scores (NaN rows for empty items), through the fast path.

        With `taps` (layer numbers, see `Engine.score`), returns (scores, [n, len(taps) * hidden]
        float32 hidden states at each item's last token, NaN rows for empty items) from the same pass.
        """
        start = time.perf_counter()
        n_labels = len(self.task.labels)
        scores = np.full((len(encoded), n_labels), np.nan, dtype=np.float64)
        states = np.full((len(encoded), len(taps) * self.loaded.model.config.hidden_size), np.nan, np.float32)
        stats = RunStats(items=len(encoded), prefix_tokens=len(self.prefix_ids), fallbacks=encoded.fallbacks)
        for batch in self.batches(encoded):
            batch_scores = self.engine.score(batch, self.prefix, self.trie, taps=taps)  # [B, L]
            if taps:
                batch_scores, batch_states = batch_scores
                states[batch.rows] = batch_states.flatten(1).numpy()
            scores[batch.rows] = batch_scores.double().numpy()
            stats.batches += 1
            stats.real_tokens += batch.real_tokens
            stats.processed_tokens += batch.padded_tokens
            if batch.cached:
                stats.prefix_reused += len(self.prefix_ids) * len(batch.rows)
            if progress is not None:
                progress(len(batch.rows))
        stats.scored = len(encoded.scored)
        stats.seconds = time.perf_counter() - start
        self.stats = stats
        return (scores, states) if taps else scores

    def plan(self, encoded: EncodedItems) -> list[tuple[bool, np.ndarray]]:
        """The engine batches `score` runs, in order: (cached, [b] item indices) each. The items
        that continue the cached prefix and those that do not (`fallbacks`) are batched apart, each
        group by `plan_batches` on the lengths the engine runs."""
        scored = encoded.scored
        batches = []
        for cached in (True, False):
            group = scored[encoded.cached[scored] == cached] if len(scored) else scored
            if not len(group):
                continue
            lengths = np.array([len(encoded.own(i)) for i in group])
            plan = plan_batches(lengths, self.settings.token_budget, self.settings.max_rows, sort=self.settings.sort)
            batches += [(cached, group[positions]) for positions in plan]
        return batches

    def batches(self, encoded: EncodedItems) -> Iterator[Batch]:
        """The batches of `plan`, left-padded, as the engine runs them."""
        pad = self.loaded.tokenizer.pad_token_id
        for cached, rows in self.plan(encoded):
            yield collate([encoded.suffix(i) for i in rows], rows, pad, cached)

    def reference(self, encoded: EncodedItems, indices: Iterable[int]) -> np.ndarray:
        """[k, L] label scores of the given items through the per-item reference path."""
        full = encoded.ids
        rows = [
            reference_scores(self.loaded.model, full[i], self.trie).double().cpu().numpy()
            for i in indices
        ]
        return np.stack(rows) if rows else np.zeros((0, len(self.task.labels)))

    def __repr__(self) -> str:
        return f"Classifier(model={self.loaded.name!r}, labels={list(self.task.labels)}, mode={self.mode!r})"


__all__ = ["Classifier", "EngineSettings", "Result", "ScoredWindow"]
