"""The public entry point: `Classifier(task).classify(texts)` → one `Result` per text, in order.

Data flow: load → render prompts → tokenize → schedule batches → forward with the prefix cache
→ score → results. The prefix is computed once per Classifier and reused by every batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from .batching import collate, plan_batches
from .calibration import CONTENT_FREE, adjust, prior_from_scores
from .encode import EncodedItems, choose_prefix, encode_items
from .engine import Engine
from .errors import TaskError
from .labels import build_trie, end_of_turn_id, label_sequences, resolve_mode
from .loading import LoadedModel, load_model
from .prompts import PromptRenderer
from .reference import reference_scores
from .results import Result, RunStats, make_results
from .task import Task

DEFAULT_TOKEN_BUDGET = 2048
DEFAULT_MAX_ROWS = 128


@dataclass(frozen=True)
class EngineSettings:
    """How the fast path schedules work. The defaults are the fastest measured on a 2-core CPU."""

    token_budget: int | None = DEFAULT_TOKEN_BUDGET
    """Max rows × padded length per batch; None means fixed batches of `max_rows`."""
    max_rows: int = DEFAULT_MAX_ROWS
    """Max rows per batch."""
    prefix_cache: bool = True
    """Run the shared prefix once and reuse its keys/values (off only for ablations)."""
    sort: bool = True
    """Sort items by length before batching (off only for ablations)."""
    max_text_tokens: int | None = None
    """Truncate item texts to this many tokens (status `truncated`)."""

    def __post_init__(self) -> None:
        if self.token_budget is not None and self.token_budget < 1:
            raise TaskError(f"--token-budget must be positive, got {self.token_budget}")
        if self.max_rows < 1:
            raise TaskError(f"--max-rows must be positive, got {self.max_rows}")
        if self.max_text_tokens is not None and self.max_text_tokens < 1:
            raise TaskError(f"--max-tokens must be positive, got {self.max_text_tokens}")


class Classifier:
    """Classifies texts for one task with one model."""

    def __init__(
        self,
        task: Task,
        model: str | LoadedModel | None = None,
        settings: EngineSettings | None = None,
    ):
        self.task = task
        self.settings = settings or EngineSettings()
        self.loaded = model if isinstance(model, LoadedModel) else load_model(model)
        tokenizer = self.loaded.tokenizer
        self.renderer = PromptRenderer(tokenizer, task)
        self.label_tokens = label_sequences(tokenizer, self.renderer.tail, task.labels)
        """Each label's token ids as they follow the prompt (before the mode truncates or terminates them)."""
        mode, sequences, self.mode_reason = resolve_mode(
            task.labels, self.label_tokens, task.mode, end_of_turn_id(tokenizer)
        )
        self.trie = build_trie(task.labels, sequences, mode)
        if self.loaded.engine is None:  # re-arranging the weights once per model, not per classifier
            self.loaded.engine = Engine(self.loaded.model)
        self.engine = self.loaded.engine
        self.prefix_ids = choose_prefix(tokenizer, self.renderer.head) if self.settings.prefix_cache else []
        self.prefix = self.engine.prefill(self.prefix_ids) if self.prefix_ids else None
        context = getattr(self.loaded.model.config, "max_position_embeddings", 2048)
        self.max_prompt_tokens = context - max(len(s) for s in self.trie.sequences)
        self.stats = RunStats()
        self.bias = self.content_free_prior() if task.calibrate else None

    def content_free_prior(self) -> np.ndarray:
        """[L] log prior of each label on content-free inputs (a few passes over the cached prefix)."""
        encoded = encode_items(
            self.loaded.tokenizer, self.renderer, list(CONTENT_FREE), self.prefix_ids,
            self.max_prompt_tokens, score_empty=True,
        )
        stats = self.stats
        prior = prior_from_scores(self.score(encoded))
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
            self.max_prompt_tokens, self.settings.max_text_tokens,
        )

    def classify(self, texts: Iterable[str], progress: Callable[[int], None] | None = None) -> list[Result]:
        """One Result per text, in input order. `progress(n)` is called as n more items finish."""
        encoded = self.encode(texts)
        scores = self.score(encoded, progress)
        return make_results(self.task.labels, scores, self.calibrated(scores), encoded.status,
                            self.task.min_confidence)

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
        scored = encoded.scored
        for cached in (True, False):
            group = scored[encoded.cached[scored] == cached] if len(scored) else scored
            if not len(group):
                continue
            suffixes = [encoded.suffix(i) for i in group]
            plan = plan_batches(
                np.array([len(s) for s in suffixes]), self.settings.token_budget,
                self.settings.max_rows, sort=self.settings.sort,
            )
            for positions in plan:
                batch = collate([suffixes[p] for p in positions], group[positions],
                                self.loaded.tokenizer.pad_token_id, cached)
                batch_scores = self.engine.score(batch, self.prefix, self.trie, taps=taps)  # [B, L]
                if taps:
                    batch_scores, batch_states = batch_scores
                    states[batch.rows] = batch_states.flatten(1).numpy()
                scores[batch.rows] = batch_scores.double().numpy()
                stats.batches += 1
                stats.real_tokens += batch.real_tokens
                stats.processed_tokens += batch.padded_tokens
                if cached:
                    stats.prefix_reused += len(self.prefix_ids) * len(positions)
                if progress is not None:
                    progress(len(positions))
        stats.scored = len(scored)
        stats.seconds = time.perf_counter() - start
        self.stats = stats
        return (scores, states) if taps else scores

    def reference(self, encoded: EncodedItems, indices: Iterable[int]) -> np.ndarray:
        """[k, L] label scores of the given items through the per-item reference path."""
        rows = [
            reference_scores(self.loaded.model, encoded.ids[i], self.trie).double().numpy()
            for i in indices
        ]
        return np.stack(rows) if rows else np.zeros((0, len(self.task.labels)))

    def __repr__(self) -> str:
        return f"Classifier(model={self.loaded.name!r}, labels={list(self.task.labels)}, mode={self.mode!r})"


__all__ = ["Classifier", "EngineSettings", "Result"]
