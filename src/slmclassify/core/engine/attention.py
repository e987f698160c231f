"""Attention over a batch, one function per layout (`forward.Engine._attention_block` picks it):

- `attend_packed_rows`: the backend attends on the packed rows themselves, one pass per (row, KV
  head) with the prefix included (`Backend.attend_packed`); scoring only.
- `attend_padded`: the rows in the padded layout [B, W], attention to the shared prefix and
  attention within each row as two kernel calls merged by their log-sum-exps (the prefix part one
  dense product for all queries, no copies of the prefix per row, no mask); rows much wider than
  the prefix take it inline instead (`Layout.prefix_cols`), one call. It returns the block's keys
  and values, which the prefill keeps.

Both take q/k/v [N, H + 2 Hkv, D] of the packed tokens (projected, normed and rotated) and return
the attention output [N, H D] in float32 (with `read_only`: at the read positions only, [R, H D]).
"""

from __future__ import annotations

import torch

from .layout import Layout


def attend_packed_rows(backend, qkv: torch.Tensor, n_heads: int, layout: Layout, past,
                       read_only: bool) -> torch.Tensor:
    """[N or R, H D]: every row's attention over its packed tokens and the prefix (`past`, or None)."""
    D = qkv.shape[-1]
    prefix_kv = None if past is None else (past[0][0].contiguous(), past[1][0].contiguous())  # [Hkv, P, D]
    return backend.attend_packed(qkv.contiguous(), n_heads, layout.starts, layout.lengths, layout.ancestors,
                                 prefix_kv, read_only).view(-1, n_heads * D)


def attend_padded(backend, qkv: torch.Tensor, padded: torch.Tensor, layout: Layout, window, past, n_heads: int,
                  n_kv: int, read_only: bool) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """([N or R, H D] float32 output, this block's [B, Hkv, W, D] keys and values): the packed q/k/v
    written into `padded` (shared by all layers: only real rows are written, pad rows stay zero)."""
    H, Hkv, D = n_heads, n_kv, qkv.shape[-1]
    attend = backend.attend
    padded.index_copy_(0, layout.index, qkv)
    rows = padded.view(layout.B, layout.W, H + 2 * Hkv, D)  # [B, W, H+2Hkv, D]
    C = layout.prefix_cols
    if C:  # the prefix inline: its keys/values into every row's first C columns (q stays zero)
        rows[:, :C, H : H + Hkv].copy_(past[0].transpose(1, 2))  # [1, C, Hkv, D] over B
        rows[:, :C, H + Hkv :].copy_(past[1].transpose(1, 2))
        past = None
    heads = rows.transpose(1, 2)  # [B, H+2Hkv, W, D]
    k, v = heads[:, H : H + Hkv], heads[:, H + Hkv :]
    mask, read_mask = layout.windows.get(window, (layout.mask, layout.read_mask))
    q = qkv[:, :H]  # [N, H, D] packed
    if read_only:
        q = q.index_select(0, layout.read.reshape(-1))  # [R, H, D]
        out, lse = attend(q.view(layout.B, -1, H, D).transpose(1, 2), k, v, mask=read_mask)
        out, lse = out.reshape(-1, H, D), lse.reshape(-1, H)  # [R, H, D], [R, H]
    else:
        out, lse = attend(heads[:, :H], k, v, mask=mask, lower=True)
        out = out.reshape(-1, H, D).index_select(0, layout.index)  # [N, H, D]
        if past is not None:
            lse = lse.reshape(-1, H).index_select(0, layout.index)  # [N, H]
    out = out.float()  # merged and projected from float32 (a no-op in float32)
    if past is not None:
        out_p, lse_p = attend(q[None].transpose(1, 2), *past, mask=None, causal=False)  # all rows at once
        out = merge(out, lse, out_p.float().reshape(-1, H, D), lse_p.reshape(-1, H))
    return out.reshape(-1, H * D), (k, v)


def merge(out_a, lse_a, out_b, lse_b):
    """Attention over the union of two disjoint key sets from each set's output and log-sum-exp."""
    lse = torch.logaddexp(lse_a, lse_b)
    return out_a.mul_((lse_a - lse).exp_()[..., None]).addcmul_(out_b, (lse_b - lse).exp_()[..., None])


__all__ = ["attend_packed_rows", "attend_padded", "merge"]
