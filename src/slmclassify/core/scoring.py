"""A task's prompts, label trie and batching for one tokenizer: texts → `EncodedItems` → label scores.

`Scorer` holds what scoring a task needs besides the model's weights — the prompt renderer, the
label trie, the shared prefix ids, the batching settings — and never changes after it is built.
`Scorer.score` runs encoded items through a given engine and prefix cache and returns its scores
and what it did (`Scored`): it keeps no state, so the same items scored twice with the same engine
get the same bits, and scoring with another engine (the float32 one for calibration, a candidate
precision for `--precision auto`) is an argument, not a swap.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from .batching import Batch, collate, plan_batches
from .config_check import context_limit
from .encode import EncodedItems, PromptSplit, choose_prefix, encode_items
from .labels import LabelTrie, build_trie, end_of_turn_id, label_sequences, resolve_mode
from .questions import scored_names
from .prompts import PromptRenderer
from .results import RunStats
from .settings import EngineSettings
from .taps import Taps, echoed
from .task import Task


@dataclass(frozen=True)
class Scored:
    """What one fast-path pass over encoded items gave, in item order."""

    scores: np.ndarray
    """[n, L] float64 raw label scores (NaN rows for empty items); [n, 2L] branch scores of a multi-label task."""
    states: np.ndarray | None
    """[n, len(taps) * hidden] float32 hidden states at the taps (`core/taps.py`; NaN rows for
    empty items) when scored with taps; None without."""
    stats: RunStats
    """What the pass did (batches, tokens, seconds)."""


@dataclass(frozen=True)
class Scorer:
    """Encodes texts for one task and tokenizer, and scores encoded items with an engine."""

    task: Task | None
    """None for a scorer of prompts rendered elsewhere (`for_prompts`)."""
    tokenizer: object
    settings: EngineSettings
    renderer: PromptRenderer | None
    label_tokens: list
    """Each label's token ids as they follow the prompt (before the mode truncates or terminates them)."""
    trie: LabelTrie
    mode_reason: str
    prefix_ids: list[int]
    """The shared start of every prompt, run once per engine (empty with `prefix_cache` off)."""
    pool_from: int
    """Tokens of that shared start whether cached or not: a mean-pooled tap starts after them."""
    split: PromptSplit | None
    max_prompt_tokens: int
    """Longest prompt the engine is exact for (the model's context less the longest label)."""
    hidden_size: int

    @classmethod
    def build(cls, task: Task, tokenizer, config, settings: EngineSettings) -> Scorer:
        """The scorer of `task` for a model with this tokenizer and config (`config_check` limits);
        a schedule left to the measurement (`AUTO`) and not measured takes the built-in defaults."""
        settings = settings.with_defaults()
        renderer = PromptRenderer(tokenizer, task)
        # every question's branches (`questions.py`), in the mode its readout asks for
        names = scored_names(task)
        label_tokens = label_sequences(tokenizer, renderer.after, names)
        mode, sequences, mode_reason = resolve_mode(names, label_tokens, task.scoring_mode,
                                                    end_of_turn_id(tokenizer))
        mode_reason = task.mode_reason(mode_reason)
        trie = build_trie(names, sequences, mode)
        shared = choose_prefix(tokenizer, renderer.before)
        prefix_ids = shared if settings.prefix_cache else []
        # The engine is exact up to this length (the model's context, or less: see config_check).
        max_prompt_tokens = context_limit(config) - max(len(s) for s in trie.sequences)
        return cls(task=task, tokenizer=tokenizer, settings=settings, renderer=renderer, label_tokens=label_tokens,
                   trie=trie, mode_reason=mode_reason, prefix_ids=prefix_ids, pool_from=len(shared),
                   split=PromptSplit(tokenizer, renderer), max_prompt_tokens=max_prompt_tokens,
                   hidden_size=config.hidden_size)

    @classmethod
    def for_prompts(cls, tokenizer, config, settings: EngineSettings, trie: LabelTrie,
                    prefix_ids: list[int]) -> Scorer:
        """A scorer of items already tokenized elsewhere (a chat request's conversation,
        `core/conversation.py`) against `trie`, continuing `prefix_ids`: `score` only, no `encode`."""
        return cls(task=None, tokenizer=tokenizer, settings=settings.with_defaults(), renderer=None,
                   label_tokens=list(trie.sequences), trie=trie, mode_reason="choices scored whole",
                   prefix_ids=list(prefix_ids), pool_from=len(prefix_ids), split=None,
                   max_prompt_tokens=context_limit(config) - max(len(s) for s in trie.sequences),
                   hidden_size=config.hidden_size)

    def prefill(self, engine):
        """The prefix cache of `engine` for this scorer's prefix (None without a prefix)."""
        return engine.prefill(self.prefix_ids) if self.prefix_ids else None

    def encode(self, texts: Iterable[str], score_empty: bool = False, echo: bool = False) -> EncodedItems:
        """Render and tokenize texts (no model work), cut at `settings.max_text_tokens`.
        `score_empty`: the content-free calibration inputs, "" included, scored and never cut.
        `echo`: each text written twice, one newline between (`core/taps.py`); the cap counts each
        copy, so a text within it is whole in both."""
        cap = None if score_empty else self.settings.max_text_tokens
        texts = [echoed(t) for t in texts] if echo else list(texts)
        cap = cap if cap is None or not echo else 2 * cap + 1
        return encode_items(self.tokenizer, self.renderer, texts, self.prefix_ids, self.max_prompt_tokens,
                            cap, score_empty=score_empty, split=self.split)

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
        pad = self.tokenizer.pad_token_id
        for cached, rows in self.plan(encoded):
            yield collate([encoded.suffix(i) for i in rows], rows, pad, cached)

    def score(self, encoded: EncodedItems, engine, prefix, progress: Callable[[int], None] | None = None,
              taps: Taps = Taps()) -> Scored:
        """Label scores of every item through `engine` with its `prefix` cache (`prefill(engine)`).

        `taps` (`core/taps.py`): the hidden states a head reads, from the same pass. `progress(n)` is called as each batch's n items get their scores (consecutive batches
        share an output-layer call, so a few at a time)."""
        start = time.perf_counter()
        scores = np.full((len(encoded), len(self.trie.labels)), np.nan, dtype=np.float64)
        states = np.full((len(encoded), len(taps) * self.hidden_size), np.nan, np.float32) if taps else None
        stats = RunStats(items=len(encoded), prefix_tokens=len(self.prefix_ids), fallbacks=encoded.fallbacks)
        # The read states of consecutive batches go through the output layer together, as many as
        # one call takes: its weights (the whole vocabulary) are read once for all of them.
        pending, pending_rows, rows_per_call = [], 0, engine.output_rows(self.trie)

        def flush():
            done = engine.label_scores(torch.cat([read for _, read in pending]), self.trie).double().numpy()
            offset = 0
            for batch, _ in pending:  # done: [rows of the pending batches, L]
                scores[batch.rows] = done[offset : offset + len(batch.rows)]
                offset += len(batch.rows)
                if progress is not None:
                    progress(len(batch.rows))
            pending.clear()

        for batch in self.batches(encoded):
            read, batch_states = engine.read_states(batch, prefix, self.trie, taps, self.pool_from)  # [B, 1+T, hidden]
            if taps:
                states[batch.rows] = batch_states.flatten(1).numpy()
            if pending and pending_rows + len(batch.rows) > rows_per_call:
                flush()
                pending_rows = 0
            pending.append((batch, read))
            pending_rows += len(batch.rows)
            stats.batches += 1
            stats.real_tokens += batch.real_tokens
            stats.processed_tokens += batch.padded_tokens
            if batch.cached:
                stats.prefix_reused += len(self.prefix_ids) * len(batch.rows)
        if pending:
            flush()
        stats.scored = len(encoded.scored)
        stats.seconds = time.perf_counter() - start
        return Scored(scores=scores, states=states, stats=stats)
