"""Attention kernels that also return the log-sum-exp of each query's scores, so that attention
to the shared prefix and attention within a row can run separately and be merged exactly.

All take q [B, H, Q, D] and k, v [B, H_kv, K, D] (GQA: H a multiple of H_kv), an additive mask
[B, 1, Q, K] in q's dtype or None, and return (out [B, Q, H, D] in q's dtype, lse [B, Q, H]
float32). `mask` None means causal (queries and keys aligned at the start), or, with
causal=False, no mask at all. Scores are scaled by 1/sqrt(D), as in Llama and Qwen2. `lower=True`
says that the mask hides every key after its query (queries and keys aligned at the start, as the
engine's masks do), which lets the CPU kernel skip those keys; the other kernels need no hint.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

# The CPU flash-attention kernel behind F.scaled_dot_product_attention, called directly because
# it also returns the log-sum-exp; torch is pinned (2.13.0) so this private op is stable here.
_CPU_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


# Causal attention (or a `lower` mask) over at least twice this many queries runs in blocks of this many queries, each
# against the keys up to its last query. The CPU kernel computes every key block it is handed in full
# (its key blocks are 512 wide) and masks afterwards, so one causal call over W < 512 keys costs W^2
# products where the triangle needs W^2/2; blocks of b queries cost about W^2/2 + W b/2. 32 was the
# fastest size tried on the engine's shapes, and two blocks lose to one call on short rows (the sizes
# compared: docs/performance.md, *Causal attention in query blocks*).
CAUSAL_BLOCK = 32


def attend_cpu(q, k, v, mask, causal: bool = True, lower: bool = False):
    Q = q.shape[2]
    if ((mask is None and causal) or lower) and Q >= 2 * CAUSAL_BLOCK and k.shape[2] == Q:
        return _causal_blocks(q, k, v, CAUSAL_BLOCK, mask)
    out, lse = _CPU_FLASH(q, k, v, 0.0, causal and mask is None, attn_mask=mask)
    return out.transpose(1, 2), lse.transpose(1, 2)


def _causal_blocks(q, k, v, block: int, mask=None):
    """Causal attention (queries and keys aligned at the start) one block of queries at a time,
    each block against keys 0 .. its end: without `mask` the first block is plain causal and each
    later one takes the rows of an additive upper-triangular mask (the keys before the block all
    visible); with a `lower` mask, each block takes that mask's rows and first columns."""
    Q = q.shape[2]
    above = _above_diagonal(Q, q.dtype, q.device) if mask is None else None  # [Q, Q]
    outs, lses = [], []
    for start in range(0, Q, block):
        end = min(Q, start + block)
        if mask is not None:
            out, lse = _CPU_FLASH(q[:, :, start:end], k[:, :, :end], v[:, :, :end], 0.0, False,
                                  attn_mask=mask[:, :, start:end, :end])
        elif start == 0:
            out, lse = _CPU_FLASH(q[:, :, :end], k[:, :, :end], v[:, :, :end], 0.0, True)
        else:
            out, lse = _CPU_FLASH(q[:, :, start:end], k[:, :, :end], v[:, :, :end], 0.0, False,
                                  attn_mask=above[None, None, start:end, :end])
        outs.append(out.transpose(1, 2))  # [B, b, H, D]
        lses.append(lse.transpose(1, 2))  # [B, b, H]
    return torch.cat(outs, dim=1), torch.cat(lses, dim=1)


@lru_cache(maxsize=8)
def _above_diagonal(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[n, n] additive mask: -inf above the diagonal (a key after the query), 0 elsewhere."""
    return torch.full((n, n), float("-inf"), dtype=dtype, device=device).triu_(1)


def attend_cuda(q, k, v, mask, causal: bool = True, lower: bool = False):
    """CUDA memory-efficient attention (takes a mask, fp32/bf16/fp16, returns the log-sum-exp).

    The kernel wants as many key heads as query heads (GQA keys are repeated: small next to the
    products) and a mask whose rows start 16-element aligned (padded here, then sliced).
    """
    B, H, Q, D = q.shape
    if k.shape[1] != H:
        k = k.repeat_interleave(H // k.shape[1], dim=1)
        v = v.repeat_interleave(H // v.shape[1], dim=1)
    bias = None
    if mask is not None:
        K = mask.shape[-1]
        aligned = mask.new_empty(*mask.shape[:-1], -(-K // 16) * 16)
        aligned[..., :K] = mask
        bias = aligned[..., :K].expand(B, H, Q, K)
    out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, bias, True, 0.0, causal and mask is None, scale=1 / math.sqrt(D))[:2]
    return out.transpose(1, 2), lse[..., :Q].transpose(1, 2).float()  # lse is padded to 32 queries


def attend_math(q, k, v, mask, causal: bool = True, lower: bool = False):
    """The same, written out in float32 on any device: the oracle of the kernels' tests."""
    B, H, Q, D = q.shape
    k = k.float().repeat_interleave(H // k.shape[1], dim=1)
    v = v.float().repeat_interleave(H // v.shape[1], dim=1)
    scores = q.float() @ k.transpose(-1, -2) / math.sqrt(D)  # [B, H, Q, K]
    if mask is not None:
        scores = scores + mask.float()
    elif causal:
        K = k.shape[2]
        scores = scores.masked_fill(torch.ones(Q, K, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [B, H, Q]
    out = torch.softmax(scores, dim=-1) @ v
    return out.to(q.dtype).transpose(1, 2), lse.transpose(1, 2)
