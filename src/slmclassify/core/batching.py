"""Length-bucketed batch scheduling and collation.

Items are sorted by suffix length (longest first, so a memory error shows on the first batch),
cut into batches by a token budget (rows × padded length ≤ budget, at most `max_rows` rows),
and left-padded:

    row 0:  t t t t t t      ← longest row sets the width S
    row 1:  . . t t t t      ← pads on the left keep every row's last real token at index S-1
    row 2:  . . . t t t

Each batch carries the original indices of its rows; results are written back by those.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Batch:
    """One forward pass worth of items."""

    rows: np.ndarray
    """[B] original index of each row's item."""
    input_ids: torch.Tensor
    """[B, S] suffix token ids, left-padded."""
    lengths: torch.Tensor
    """[B] real (non-pad) tokens per row."""
    cached: bool
    """The rows continue the shared prefix (True) or are whole prompts (False)."""

    @property
    def real_tokens(self) -> int:
        return int(self.lengths.sum())

    @property
    def padded_tokens(self) -> int:
        return int(self.input_ids.numel())


def plan_batches(
    lengths: np.ndarray,
    token_budget: int | None,
    max_rows: int,
    sort: bool = True,
) -> list[np.ndarray]:
    """Split positions 0..n-1 of `lengths` into batches.

    With `token_budget`, a batch grows while rows × its longest length stays within the budget
    (a single item longer than the budget still gets a batch of its own). Without it, batches
    have exactly `max_rows` rows (the article's fixed batches). `sort=False` keeps input order.
    """
    lengths = np.asarray(lengths)
    order = np.argsort(-lengths, kind="stable") if sort else np.arange(len(lengths))
    batches, start = [], 0
    while start < len(order):
        rows = max_rows
        if token_budget is not None:
            width = int(lengths[order[start]])
            end = start + 1
            while end < len(order) and end - start < max_rows:
                width = max(width, int(lengths[order[end]]))
                if (end - start + 1) * width > token_budget:
                    break
                end += 1
            rows = end - start
        batches.append(order[start : start + rows])
        start += rows
    return batches


def collate(sequences: list[list[int]], rows: np.ndarray, pad_id: int, cached: bool) -> Batch:
    """Left-pad `sequences` into one batch."""
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    width = int(lengths.max())
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    for r, seq in enumerate(sequences):
        ids[r, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
    return Batch(rows=np.asarray(rows), input_ids=ids, lengths=lengths, cached=cached)
