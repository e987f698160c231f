"""Attention kernels that also return the log-sum-exp of each query's scores, so that attention
to the shared prefix and attention within a row can run separately and be merged exactly.

All take q [B, H, Q, D] and k, v [B, H_kv, K, D] (GQA: H a multiple of H_kv), an additive mask
[B, 1, Q, K] in q's dtype or None, and return (out [B, Q, H, D] in q's dtype, lse [B, Q, H]
float32). `mask` None means causal (queries and keys aligned at the start), or, with
causal=False, no mask at all. Scores are scaled by 1/sqrt(D), as in Llama and Qwen2.
"""

from __future__ import annotations

import math

import torch

# The CPU flash-attention kernel behind F.scaled_dot_product_attention, called directly because
# it also returns the log-sum-exp; torch is pinned (2.13.0) so this private op is stable here.
_CPU_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def attend_cpu(q, k, v, mask, causal: bool = True):
    out, lse = _CPU_FLASH(q, k, v, 0.0, causal and mask is None, attn_mask=mask)
    return out.transpose(1, 2), lse.transpose(1, 2)


def attend_cuda(q, k, v, mask, causal: bool = True):
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


def attend_math(q, k, v, mask, causal: bool = True):
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
