"""How an input the driver read is cut into blocks for the actors: length bucketing across actors.

An actor sorts and batches by length within each block it gets (`sharing.score_block`), so a
block of rows of every length is padded like a small random sample, far more than the single
process, which sorts the whole input (figures in docs/ray.md, *Spreading the work*).

When the driver has the whole input (`reading.reads_on_driver`: one file of at most 32 MiB),
`spread` orders the rows longest text first (characters: the driver has no tokenizer, and token
counts follow them; identical texts next to each other) and cuts them into blocks of about equal
work, at least `BLOCKS_PER_ACTOR` per actor and at most `block_rows` rows each. Equal rows per
block would not do: the 150 longest tickets were half of the work, and the actor that got them
ran 51 s while the other ran the 450 others in 30 s. Small blocks of one length each keep the
padding low and let the actors end together: the longest blocks go first, and the last, short
ones fill the gaps. The rows come back in that order; `restore` puts them where they were, so
every input row is written once, in order.
"""

from __future__ import annotations

import math

import numpy as np

BLOCKS_PER_ACTOR = 4
"""Blocks per actor at least (when there are rows enough): an actor that starts or runs late
leaves the others at most about one block's work to wait for."""
ROW_CHARS = 64
"""Work of one row besides its text, in characters of text (the rest of the rendered prompt)."""


def spread(table, text_column: str, block_rows: int, actors: int) -> tuple[list, np.ndarray | None]:
    """(blocks to send, in order; the permutation they follow, or None when they follow the input).

    Blocks of about equal work, longest texts first, each of at most `block_rows` rows; without the
    text column (the classifier then names the problem) blocks of `block_rows` rows in input order.
    """
    keys = _sort_keys(table, text_column)
    if keys is None:
        return cut_blocks(table, block_rows), None
    order = _longest_first(keys)
    pieces = max(math.ceil(table.num_rows / block_rows), min(actors * BLOCKS_PER_ACTOR, table.num_rows))
    return _equal_work(table.take(order), _work(keys, order), block_rows, pieces), order


def restore(table, order: np.ndarray):
    """`table`'s rows, which came in `order`, back in input order."""
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return table.take(inverse)


def cut_blocks(table, block_rows: int) -> list:
    """`table` as Tables of `block_rows` rows (the last one shorter), in its row order."""
    if table.num_rows == 0:
        return [table]
    return [table.slice(start, block_rows) for start in range(0, table.num_rows, block_rows)]


def _sort_keys(table, text_column: str):
    """pyarrow Table {length (characters, 0 for missing), text} of the rows, or None when there is
    no such column or it is not text-like."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if text_column not in table.column_names:
        return None
    texts = table.column(text_column)
    if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
        try:
            texts = pc.cast(texts, pa.string())  # JSONL may type a column as numbers
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None  # e.g. nested values: left in input order, and the classifier reports them
    return pa.table({"length": pc.fill_null(pc.utf8_length(texts), 0), "text": texts})


def _longest_first(keys) -> np.ndarray:
    """The row order: longest text first, identical texts together (then stable: input order);
    missing and empty texts last."""
    import pyarrow.compute as pc

    return pc.sort_indices(keys, sort_keys=[("length", "descending"), ("text", "ascending")]).to_numpy()


def _work(keys, order: np.ndarray) -> np.ndarray:
    """Each row's expected work in `order`: its length plus ROW_CHARS; none for a repeat of the row
    before it (identical texts are next to each other there, and run once: `sharing.py`) nor for a
    missing or empty text (not run)."""
    import pyarrow.compute as pc

    texts = keys.column("text").take(order)
    repeat = np.zeros(len(order), dtype=bool)
    if len(order) > 1:
        same = pc.equal(texts.slice(1), texts.slice(0, len(order) - 1))
        repeat[1:] = pc.fill_null(same, False).to_numpy(zero_copy_only=False)
    lengths = keys.column("length").to_numpy().astype(np.float64)[order]
    return np.where(repeat | (lengths == 0), 0.0, lengths + ROW_CHARS)


def _equal_work(table, work: np.ndarray, block_rows: int, pieces: int) -> list:
    """`table` cut in its order into about `pieces` blocks of equal summed `work` (block k ends at the
    first row where the running total reaches k + 1 targets), each of at most `block_rows` rows (so
    there may be more blocks)."""
    n = table.num_rows
    if n == 0:
        return [table]
    total = np.cumsum(work)
    target = float(total[-1]) / pieces
    blocks, start = [], 0
    while start < n:
        reach = int(np.searchsorted(total, target * (len(blocks) + 1))) + 1
        end = min(start + block_rows, max(reach, start + 1), n)
        blocks.append(table.slice(start, end - start))
        start = end
    return blocks
