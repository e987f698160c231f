"""Int8 outlier handling: SmoothQuant scales and float32 outlier channels for each linear op of a
layer, from the activation ranges the float32 engine recorded (`models/activation_ranges.py`).

A few input channels of a transformer's linear layers carry activations tens of times larger
than the rest, in every token. Quantising a token with one scale then leaves the ordinary
channels a few levels of 8 bits. SmoothQuant (Xiao et al. 2022) divides input channel j by

    s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)

and multiplies the weight's input row j by it: x @ W = (x / s) @ (s W) exactly, while the
quantised activations x / s are flat and the weight takes a share of the range. The division
is folded where it is free:

    qkv      input = the RMSNorm output: divided inside the op (one multiply per element)
    o        input = attention output = softmax-weighted v: v's output columns of the qkv
             weight are divided by s (one s per kv head and dimension, shared by the query heads
             that read that kv head), so the attention already hands o its input divided
    gate_up  input = the RMSNorm output: divided inside the op
    down     input = act(gate) * up: up's output columns of the gate_up weight are divided

Per-output-channel weight quantisation is invariant to scaling a weight column, so the folding
into the producer's columns costs it no precision. Input channels that stay outliers after
smoothing (max > `OUTLIER_RATIO` x the median channel's) are computed in float32 apart
(LLM.int8(), Dettmers et al. 2022): on SmolLM2-135M with alpha 0.5 and ratio 2 that is ~58 channels
per layer of down's 1536, ~15-21 of qkv's and o's 576, ~7 of gate_up's. Everything here is exact in real arithmetic: only the
quantisation differs from float32 (tested with quantisation replaced by identity).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ALPHA = 0.5
"""SmoothQuant's migration strength: the share of the activations' range (in log scale) moved into the
weights; 0.5 splits it evenly (0.75 and 0.9 were no better: docs/devices-and-precision.md)."""
OUTLIER_RATIO: float | None = 2.0
"""Input channels whose smoothed max |x| exceeds this times the median channel's stay float32; None: none.
2 (channel counts in the module docstring) lowers int8's error against float32 on every ticket set
tried at no measurable cost, where 1.5 adds 3x the channels for little more; the variants compared
are in docs/devices-and-precision.md, *int8 fidelity*."""


@dataclass(frozen=True)
class Smoothing:
    """How one int8 op rescales its weight and input (see the module docstring)."""

    rows: torch.Tensor
    """[in] the weight's input rows are multiplied by this (s)."""
    inv_in: torch.Tensor | None
    """[in] the op multiplies its input by this (1 / s); None where the producer already divided it."""
    cols: torch.Tensor | None = None
    """[out] the weight's output columns (and bias) are divided by this: the next op's s, folded in."""
    outliers: torch.Tensor | None = None
    """[k] input channels computed in float32 apart; None: none."""


def scales(act_max: torch.Tensor, w_max: torch.Tensor, alpha: float) -> torch.Tensor:
    """[in] SmoothQuant scales from each input channel's max |x| and its weight row's max |w|."""
    act = act_max.float().clamp_min(1e-5)
    w = w_max.float().clamp_min(1e-5)
    return (act.pow(alpha) / w.pow(1 - alpha)).clamp_min(1e-5)


def plan_layer(ranges: dict[str, torch.Tensor], qkv: torch.Tensor, o: torch.Tensor, gate_up: torch.Tensor,
               down: torch.Tensor, n_heads: int, n_kv: int, head_dim: int,
               alpha: float | None = None, outlier_ratio: float | None = None) -> dict[str, Smoothing]:
    """The four ops' `Smoothing` of one layer from its ranges ({"qkv", "o", "gate_up", "down"}: [in]
    max |x| each, as the float32 engine saw them) and its float32 weights ([in, out] each)."""
    alpha = ALPHA if alpha is None else alpha
    outlier_ratio = OUTLIER_RATIO if outlier_ratio is None else outlier_ratio
    group, D = n_heads // n_kv, head_dim
    # o: one s per (kv head, dim), the max over the query heads that read it
    act_o = ranges["o"].float().view(n_kv, group, D).amax(1)  # [H_kv, D]
    w_o = o.abs().amax(1).view(n_kv, group, D).amax(1)  # [H_kv, D]
    s_v = scales(act_o, w_o, alpha).reshape(-1)  # [H_kv D]
    s_o = s_v.view(n_kv, 1, D).expand(n_kv, group, D).reshape(-1)  # [H D]
    rotated = qkv.shape[1] - n_kv * D
    qkv_cols = torch.cat([torch.ones(rotated), s_v])
    inter = down.shape[0]
    s_down = scales(ranges["down"], down.abs().amax(1), alpha)  # [I]
    gate_up_cols = torch.cat([torch.ones(gate_up.shape[1] - inter), s_down])
    s_qkv = scales(ranges["qkv"], (qkv / qkv_cols[None]).abs().amax(1), alpha)  # [hidden]
    s_gate_up = scales(ranges["gate_up"], (gate_up / gate_up_cols[None]).abs().amax(1), alpha)  # [hidden]
    plan = {
        "qkv": Smoothing(rows=s_qkv, inv_in=1 / s_qkv, cols=qkv_cols),
        "o": Smoothing(rows=s_o, inv_in=None),
        "gate_up": Smoothing(rows=s_gate_up, inv_in=1 / s_gate_up, cols=gate_up_cols),
        "down": Smoothing(rows=s_down, inv_in=None),
    }
    if outlier_ratio is not None:
        for name, smooth in plan.items():
            flat = ranges[name].float() / smooth.rows  # [in] max |x / s|
            outliers = (flat > outlier_ratio * flat.median()).nonzero().squeeze(1)
            if len(outliers):
                plan[name] = Smoothing(smooth.rows, smooth.inv_in, smooth.cols, outliers)
    return plan


def split_weight(weight: torch.Tensor, bias: torch.Tensor | None, smooth: Smoothing | None
                 ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(the float32 [in, out] weight an int8 op quantises, its bias, the outlier rows [k, out] it
    computes in float32 apart or None): rows times s, columns (and the bias) divided by the next op's
    s, the outlier rows zeroed (their int8 part is zero and sets no scale); unchanged without smoothing."""
    w = weight.float()
    bias = None if bias is None else bias.float()
    if smooth is None:
        return w, bias, None
    w = w * smooth.rows[:, None]
    if smooth.cols is not None:
        w = w / smooth.cols[None]
        bias = None if bias is None else bias / smooth.cols
    if smooth.outliers is None:
        return w, bias, None
    return w.index_fill(0, smooth.outliers, 0.0), bias, w[smooth.outliers].contiguous()
