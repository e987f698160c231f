"""The fast path: the model's decoder layers over a batch of items that continue a prefix
whose keys and values were computed once, plus the label-trie nodes, in one forward pass.

A batch arrives left-padded ([B, S], `core/batching.py`); its real tokens are packed, one row after
another, each row's label-trie nodes after its item tokens. Projections, MLP and norms (~90% of
the arithmetic) run on the packed tokens only. Attention runs in a padded layout of width
W = S + T in which every row is right-padded, and in two parts merged by their log-sum-exps:

    padded row:  [ s s s s n1 n2 . . ]           s = item token, n = trie node, . = pad
    positions:     P .. P+3 | P+4+depth-1
    part 1, all queries of the batch at once:    every prefix key  [ p p p p ]  (P tokens, cached)
    part 2, per row:  query s_i sees the row's item keys up to itself (causal)
                      query n_t sees every item key of the row, its trie ancestors and itself
                      query .   sees what is causal (finite; its output is never read)

Four modules, one job each:
- `arrange.py`, once at load: the Hugging Face model's weights arranged for the packed forward
  and shared with its modules (held once: the reference path computes with the same tensors).
- `layout.py`, once per batch: where its tokens sit, packed and padded, their positions, the
  attention masks, the short convolution's predecessors.
- `attention.py`, per attention layer: one function per layout (the packed rows, or the padded
  layout with the prefix merged in or inline).
- `forward.py`: the `Engine`, which runs the prefix once (`prefill`), then every batch's decoder
  layers (`read_states`) and the output layer at the read positions only (`label_scores`).

`arrange.py` and `layout.py` know nothing of each other; `forward.py` calls them and `attention.py`.
"""

from .forward import Engine, PrefixCache

__all__ = ["Engine", "PrefixCache"]
