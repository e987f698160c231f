"""Tokenize items once: full prompt ids, status (ok / empty / truncated) and the prefix check.

The fast path must feed the model exactly the tokens of the per-item path. So every item's
*full* prompt is tokenized, and the shared prefix is used only when the item's ids really start
with the prefix ids; otherwise the item falls back to its full prompt (counted as a fallback).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import TaskError
from .prompts import PromptRenderer

OK, EMPTY, TRUNCATED = "ok", "empty", "truncated"


@dataclass
class EncodedItems:
    """Token ids and status of every input item, in input order."""

    ids: list[list[int]]
    """Full prompt ids per item ([] for empty items)."""
    status: list[str]
    """ok, empty or truncated, per item."""
    prefix_ids: list[int]
    """The shared prefix (possibly empty)."""
    cached: np.ndarray
    """[n] bool: the item's prompt starts with `prefix_ids`, so only its suffix is run."""

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def scored(self) -> np.ndarray:
        """Indices of the items that are scored (not empty)."""
        return np.array([i for i, s in enumerate(self.status) if s != EMPTY], dtype=np.int64)

    def subset(self, indices: list[int]) -> EncodedItems:
        """The given items, in the given order (no re-tokenisation)."""
        return EncodedItems(
            ids=[self.ids[i] for i in indices], status=[self.status[i] for i in indices],
            prefix_ids=self.prefix_ids, cached=self.cached[list(indices)],
        )

    def suffix(self, i: int) -> list[int]:
        """The ids the engine runs for item i: after the prefix, or the whole prompt."""
        return self.ids[i][len(self.prefix_ids) :] if self.cached[i] else self.ids[i]

    @property
    def fallbacks(self) -> int:
        """Scored items whose prompt does not start with the prefix tokens."""
        return int(sum(1 for i in self.scored if not self.cached[i])) if self.prefix_ids else 0


def choose_prefix(tokenizer, head: str) -> list[int]:
    """Prefix ids from the shared head text, cut one token early.

    The head's last token may merge with an item's first characters (e.g. a trailing space and
    a word), so it is left to the suffix; `encode_items` still checks every item.
    """
    ids = tokenizer(head, add_special_tokens=False)["input_ids"]
    return ids[:-1]


def encode_items(
    tokenizer,
    renderer: PromptRenderer,
    texts: list[str],
    prefix_ids: list[int],
    max_prompt_tokens: int,
    max_text_tokens: int | None = None,
    score_empty: bool = False,
) -> EncodedItems:
    """Render and tokenize every item; truncate over-long texts so the template stays whole.

    Empty texts get status `empty` and are not scored, unless `score_empty` (content-free
    calibration inputs include "").
    """
    status = [EMPTY if not text.strip() and not score_empty else OK for text in texts]
    live = [i for i, s in enumerate(status) if s == OK]
    ids: list[list[int]] = [[] for _ in texts]
    prompts = [renderer.render(texts[i]) for i in live]
    encoded = tokenizer(prompts, add_special_tokens=False)["input_ids"] if prompts else []
    overhead = len(tokenizer(renderer.head + renderer.tail, add_special_tokens=False)["input_ids"])
    for i, item_ids in zip(live, encoded):
        too_long = len(item_ids) > max_prompt_tokens
        # The overhead estimate can be off by a merge or two at the boundaries; checked exactly below.
        if too_long or (max_text_tokens is not None and len(item_ids) - overhead > max_text_tokens - 2):
            item_ids, truncated = _truncate(tokenizer, renderer, texts[i], max_prompt_tokens, max_text_tokens)
            if truncated:
                status[i] = TRUNCATED
        ids[i] = item_ids
    n_prefix = len(prefix_ids)
    cached = np.array([s != EMPTY and n_prefix > 0 and ids[i][:n_prefix] == prefix_ids for i, s in enumerate(status)])
    return EncodedItems(ids=ids, status=status, prefix_ids=list(prefix_ids), cached=cached)


def _truncate(tokenizer, renderer, text, max_prompt_tokens, max_text_tokens):
    """Cut the item text (not the template) until the prompt fits. Returns (ids, truncated?)."""
    text_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    keep = len(text_ids) if max_text_tokens is None else min(len(text_ids), max_text_tokens)
    while True:
        cut = tokenizer.decode(text_ids[:keep]) if keep < len(text_ids) else text
        ids = tokenizer(renderer.render(cut), add_special_tokens=False)["input_ids"]
        if len(ids) <= max_prompt_tokens or keep == 0:
            if len(ids) > max_prompt_tokens:
                raise TaskError(
                    f"the prompt without the item text is {len(ids)} tokens, over the {max_prompt_tokens} the "
                    "model's context leaves for it: shorten the instruction, label descriptions or examples, "
                    "or use a model with a longer context")
            return ids, keep < len(text_ids)
        keep = max(0, keep - max(1, len(ids) - max_prompt_tokens))
