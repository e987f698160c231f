"""Where a batch's tokens sit for the forward (`forward.py`), built once per batch, not per layer:
packed, and in the attention's padded [B, W] layout drawn in the package's docstring, with its
positions and masks.

Each row is right-padded in that layout: its item tokens at columns 0 .. len-1, its trie nodes
next, so that without trie nodes plain causal attention is exact for every real query and no mask
is built; with nodes an additive mask lets a node query see its row's item tokens, its trie
ancestors and itself, never a later column (trie parents precede their children). Rows at least
`_INLINE_PREFIX_RATIO` times as wide as the prefix, and every row where a sliding window reaches
into the prefix, take the prefix's keys inline, in C columns in front of their own; a sliding
window some query reaches past gets masks of its own.

LFM2's convolution layers (a gated depthwise causal convolution of kernel K over the sequence)
read each token's K - 1 predecessors (`_conv_prev`): the row's earlier item tokens, the
prefix's last K - 1 inputs (cached in place of keys), or, for a trie node, its ancestors: the same
predecessors the reference sees in its one unpadded sequence.

Every index, mask and position tensor is created on the engine's device; the masks are in the
attention's dtype.
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass

import torch

from ..batching import Batch
from ..labels import LabelTrie

# Rows at least this many times as wide as the prefix attend to it in one kernel call with their
# own keys (the prefix copied into each row, C dummy queries in front); shorter rows call the
# kernel twice and merge: for them the dummy queries' P^2/2 products cost more than the merge
# saves. The A/Bs behind 1.5 are in docs/performance.md (*Prefix attention inline for wide rows*).
_INLINE_PREFIX_RATIO = 1.5


@dataclass(frozen=True)
class Layout:
    """Where a batch's real tokens sit in the attention's padded [B, W] layout.

    Each row is right-padded there: its item tokens at columns 0 .. len-1, its trie nodes next,
    so that without trie nodes plain causal attention is exact for every real query.
    """

    B: int
    W: int
    source: torch.Tensor  # [N] flat positions of the real tokens in the batch's left-padded ids (+ nodes)
    index: torch.Tensor  # [N] flat positions (into B*W) of the real tokens in the padded layout, row-major
    read: torch.Tensor  # [B, 1+T] packed indices of each row's last item token and its trie nodes
    positions: torch.Tensor  # [N] rotary position of each real token
    mask: torch.Tensor | None  # [B, 1, W, W] additive (0 = may attend, -inf = may not); None = causal. Never
    #                            lets a query see a later column (trie parents precede their children)
    read_mask: torch.Tensor  # [B, 1, 1+T, W] the mask's rows at the read positions
    prefix_cols: int = 0  # C: the prefix's keys/values copied into each row's first C columns (0: merged apart)
    starts: torch.Tensor | None = None  # [B] int64 packed index of each row's first token (the packed kernel's rows)
    lengths: torch.Tensor | None = None  # [B] int64 item tokens per row (its T trie nodes follow them)
    ancestors: torch.Tensor | None = None  # [T, T] uint8 trie ancestors (self included); None without nodes
    conv_prev: torch.Tensor | None = None  # [N, K-1] each token's predecessors at lags 1..K-1 (convolution layers)
    windows: dict = dataclasses.field(default_factory=dict)  # {window: (mask, read_mask)} of the sliding
    #   windows some query of this batch reaches past (masks as above, keys also within the window); the
    #   prefix is inline then (prefix_cols = P)


@dataclass
class Pool:
    """The tokens of each row's mean (`pool_tokens`) and the means collected so far."""

    tokens: torch.Tensor  # [M] packed indices of the pooled tokens
    rows: torch.Tensor  # [M] their rows
    counts: torch.Tensor  # [B, 1] float32 pooled tokens per row
    layers: frozenset  # the layers whose means are wanted
    means: dict = dataclasses.field(default_factory=dict)  # {layer: [B, hidden] float32}


def prefill_layout(P: int, device: torch.device, dtype: torch.dtype, windows: list[int], conv_taps: int) -> Layout:
    """The prefix's own layout: one causal row of its P tokens, read at its last one."""
    everything = torch.arange(P, device=device)
    zero = torch.zeros(1, dtype=torch.long, device=device)
    causal = everything[None, :, None] >= everything[None, None, :]  # [1, P, P]
    window_masks = {w: (_additive(_within(causal, everything[None], w)[:, None], dtype), None)
                    for w in windows if P > w}
    return Layout(B=1, W=P, source=everything, index=everything, read=torch.tensor([[P - 1]], device=device),
                  positions=everything, mask=None,
                  read_mask=torch.zeros(1, 1, 1, P, dtype=dtype, device=device),
                  conv_prev=_conv_prev(zero, zero + P, None, conv_taps) if conv_taps else None,
                  windows=window_masks)


def batch_layout(batch: Batch, trie: LabelTrie, n_prefix: int, device: torch.device, dtype: torch.dtype,
                 windows: list[int], conv_taps: int) -> Layout:
    """The layout of `batch` and `trie`'s nodes after a prefix of `n_prefix` tokens, for a model
    with sliding `windows` (sorted) and convolutions of `conv_taps` taps (0: none)."""
    dev = device
    lengths = batch.lengths.to(dev)[:, None]  # [B, 1]
    B, S = batch.input_ids.shape
    T = trie.n_nodes
    # A sliding window matters where some query sits `window` or more positions after a key.
    last = n_prefix + int(batch.lengths.max()) - 1 + (int(trie.node_depth.max()) if T else 0)
    windows = [w for w in windows if last >= w]
    # With the prefix inline (wide rows, or windows that reach into it), each padded row starts
    # with C prefix columns:
    #     [ p p p | s s s s n1 n2 . . ]    the p queries are dummies (zero, never read)
    # and plain top-left causal attention then gives every real query the prefix too.
    C = n_prefix if n_prefix and (S >= _INLINE_PREFIX_RATIO * n_prefix or windows) else 0
    W = C + S + T
    col = torch.arange(W, device=dev)[None]  # [1, W]
    own = col - C  # [1, W] column among the row's own tokens (negative: prefix)
    # The real tokens in row-major order are each row's item tokens, then its trie nodes;
    # `source` finds them in the left-padded ids, `index` in the right-padded layout.
    ids_col = torch.arange(S + T, device=dev)[None]  # [1, S+T]
    source = ((ids_col >= S - lengths) | (ids_col >= S)).reshape(-1).nonzero().squeeze(1)  # [N]
    index = ((own >= 0) & (own < lengths + T)).reshape(-1).nonzero().squeeze(1)  # [N]
    node = own - lengths  # [B, W] node number at and after the row's item tokens
    is_node = (node >= 0) & (node < T)
    depth = trie.node_depth.to(dev)[node.clamp(0, max(T - 1, 0))] if T else torch.zeros_like(col)
    positions = n_prefix + torch.where(is_node, lengths + depth - 1, own)  # [B, W]

    # Packed index of each row's first real token; its last item token and nodes follow.
    per_row = lengths[:, 0] + T
    steps = torch.arange(1 + T, device=dev)[None]  # [1, 1+T]
    read = (torch.cumsum(per_row, 0) - per_row + lengths[:, 0] - 1)[:, None] + steps
    read_cols = C + lengths - 1 + steps  # [B, 1+T]

    # Item (and pad) queries see the keys up to themselves (the inline prefix included); node
    # queries see the prefix, every item token of their row and their trie ancestors.
    q, k = col[..., None], col[:, None, :]  # [1, W, 1], [1, 1, W]
    allowed = k <= q  # [1, W, W]
    if T:
        node_q, node_k = node[:, :, None], node[:, None, :]  # [B, W, 1], [B, 1, W]
        k_is_node = is_node[:, None, :]
        sees_ancestor = trie.ancestors.to(dev)[node_q.clamp(0, T - 1), node_k.clamp(0, T - 1)] & k_is_node
        sees_node_row = (node_k < 0) | sees_ancestor
        allowed = torch.where(is_node[:, :, None], sees_node_row, allowed)  # [B, W, W]
    allowed = allowed.expand(B, W, W)
    read_allowed = allowed.gather(1, read_cols[:, :, None].expand(B, 1 + T, W))  # [B, 1+T, W]
    starts = torch.cumsum(per_row, 0) - per_row
    window_masks = {}
    for w in windows:
        sees = _within(allowed, positions, w)
        reads = sees.gather(1, read_cols[:, :, None].expand(B, 1 + T, W))
        window_masks[w] = (_additive(sees[:, None], dtype), _additive(reads[:, None], dtype))
    return Layout(B=B, W=W, source=source, index=index, read=read,
                  positions=positions.reshape(-1)[index],
                  mask=_additive(allowed[:, None], dtype) if T else None,
                  read_mask=_additive(read_allowed[:, None], dtype), prefix_cols=C,
                  starts=starts.long(), lengths=lengths[:, 0].long().contiguous(),
                  ancestors=trie.ancestors.to(device=dev, dtype=torch.uint8).contiguous() if T else None,
                  conv_prev=_conv_prev(starts.long(), lengths[:, 0].long(), trie, conv_taps) if conv_taps else None,
                  windows=window_masks)


def pool_tokens(layout: Layout, trie: LabelTrie, n_prefix: int, pool_from: int, layers) -> Pool:
    """Which packed tokens each row's mean takes: its item tokens at prompt positions
    >= pool_from (the row's own column j sits at position n_prefix + j), at least its last."""
    lengths = layout.lengths
    dev = lengths.device
    row = torch.repeat_interleave(torch.arange(layout.B, device=dev), lengths + trie.n_nodes)  # [N]
    own = torch.arange(row.numel(), device=dev) - layout.starts[row]
    first = torch.full_like(lengths, max(pool_from - n_prefix, 0)).minimum(lengths - 1)  # [B]
    tokens = ((own < lengths[row]) & (own >= first[row])).nonzero().squeeze(1)
    rows = row.index_select(0, tokens)
    counts = torch.bincount(rows, minlength=layout.B).to(torch.float32)[:, None]
    return Pool(tokens=tokens, rows=rows, counts=counts, layers=frozenset(layers))


def _within(allowed: torch.Tensor, positions: torch.Tensor, window: int) -> torch.Tensor:
    """[B, W, W] `allowed` and the key within `window` positions of the query (i - j < window, as
    transformers' sliding-window mask). positions: [B or 1, W] of the layout's columns."""
    return allowed & ((positions[:, :, None] - positions[:, None, :]) < window)


def _conv_prev(starts: torch.Tensor, lengths: torch.Tensor, trie: LabelTrie | None,
                      conv_taps: int) -> torch.Tensor:
    """[N, K-1] where each packed token's predecessors at lags 1 .. K-1 (K = `conv_taps`) are, as
    indices into [the prefix's last K-1 inputs; the packed tokens]: an item token's are the row's
    earlier tokens, then the prefix's last ones (zeros before position 0); a trie node's are its
    ancestors, then the item's last tokens, as in the reference's one unpadded sequence."""
    dev, lags = starts.device, conv_taps - 1
    T = trie.n_nodes if trie is not None else 0
    per_row = lengths + T
    row = torch.repeat_interleave(torch.arange(len(starts), device=dev), per_row)  # [N]
    within = torch.arange(int(per_row.sum()), device=dev) - starts[row]  # [N] index among the row's tokens
    length = lengths[row]
    is_node = within >= length
    node = (within - length).clamp(0, max(T - 1, 0))
    out = []
    if T:
        depth = trie.node_depth.to(dev)[node]  # [N]
        # at_depth[t, d]: t's ancestor at depth d (1 .. depth of t)
        at_depth = torch.zeros(T, int(trie.node_depth.max()) + 1, dtype=torch.long)
        for t in range(T):
            for u in trie.ancestors[t].nonzero().squeeze(1).tolist():
                at_depth[t, int(trie.node_depth[u])] = u
        at_depth = at_depth.to(dev)
    for lag in range(1, lags + 1):
        own = within - lag  # the predecessor's index among the row's item tokens (negative: the prefix's)
        if T:
            own = torch.where(is_node, length - 1 - (lag - depth), own)
            ancestor = starts[row] + length + at_depth[node, (depth - lag).clamp(min=0)]
        idx = torch.where(own >= 0, lags + starts[row] + own, lags + own)
        if T:
            idx = torch.where(is_node & (lag < depth), lags + ancestor, idx)
        out.append(idx)
    return torch.stack(out, dim=1)


def local_index(rows: torch.Tensor, n: int) -> torch.Tensor:
    """[n] each packed token's index among `rows` (-1 where it is not one of them)."""
    local = torch.full((n,), -1, dtype=torch.long, device=rows.device)
    local[rows] = torch.arange(rows.numel(), device=rows.device)
    return local


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool mask → additive mask in the attention's dtype (what the kernel adds to the scores),
    built once per batch, not per layer, on the batch's device."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))
