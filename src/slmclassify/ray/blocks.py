"""How an input the driver read is cut into blocks for the actors: length bucketing across actors.

An actor sorts and batches by length within each block it gets (`sharing.score_block`), so a
block of rows of every length is padded like a small random sample: the article's 600 tickets in
blocks of 150 rows in input order were run with 14.6% of the processed tokens padding, against
5.5% for the single process, which sorts the whole input (2026-11-30, Intel Xeon, 2 cores).

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
    order = longest_first(table, text_column)
    if order is None:
        return cut_blocks(table, block_rows), None
    sent = table.take(order)
    work = _work(_as_text(sent, text_column))
    pieces = max(math.ceil(table.num_rows / block_rows), min(actors * BLOCKS_PER_ACTOR, table.num_rows))
    return _equal_work(sent, work, block_rows, pieces), order


def longest_first(table, text_column: str) -> np.ndarray | None:
    """The row order: longest text first, identical texts together (then stable: input order);
    missing and empty texts last. None when there is no such column or it is not text-like."""
    import pyarrow as pa
    import pyarrow.compute as pc

    texts = _as_text(table, text_column)
    if texts is None:
        return None
    keys = pa.table({"length": pc.fill_null(pc.utf8_length(texts), 0), "text": texts})
    return pc.sort_indices(keys, sort_keys=[("length", "descending"), ("text", "ascending")]).to_numpy()


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


def _as_text(table, text_column: str):
    import pyarrow as pa
    import pyarrow.compute as pc

    if text_column not in table.column_names:
        return None
    texts = table.column(text_column)
    if pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type):
        return texts
    try:
        return pc.cast(texts, pa.string())  # JSONL may type a column as numbers
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None  # e.g. nested values: left in input order, and the classifier reports them


def _work(texts) -> np.ndarray:
    """Each sorted row's expected work: its length plus ROW_CHARS, and none for a repeat of the row
    before it (identical texts are run once, `sharing.py`)."""
    import pyarrow.compute as pc

    values = texts.to_pylist()
    lengths = pc.fill_null(pc.utf8_length(texts), 0).to_numpy(zero_copy_only=False).astype(np.float64)
    repeat = np.array([i > 0 and values[i] == values[i - 1] for i in range(len(values))], dtype=bool)
    return np.where(repeat, 0.0, lengths + ROW_CHARS)


def _equal_work(table, work: np.ndarray, block_rows: int, pieces: int) -> list:
    """`table` cut in its order into about `pieces` blocks of equal summed `work`, each of at most
    `block_rows` rows (so there may be more blocks)."""
    if table.num_rows == 0:
        return [table]
    target = float(work.sum()) / pieces
    blocks, start, done = [], 0, 0.0
    for end in range(1, table.num_rows + 1):
        done += work[end - 1]
        if end - start == block_rows or done >= target * (len(blocks) + 1) or end == table.num_rows:
            blocks.append(table.slice(start, end - start))
            start = end
    return blocks
