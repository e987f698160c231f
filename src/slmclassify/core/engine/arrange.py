"""The Hugging Face model's weights arranged for the fast path (`forward.py`), once, at load.

The weights are the Hugging Face model's own, held ONCE: each linear weight is stored here in
[in, out] layout (q/k/v and gate/up concatenated) and the Hugging Face module's `weight` becomes a
transposed view of it, so the reference path computes with the very same tensors. Arranging goes
layer by layer, writing each arranged tensor block by block, and each source tensor is freed when
its module's weight is replaced, so the transient is about one layer (the loaded weights are in
memory of their own, not a file's memory map: `models/weights.py`). Each RMSNorm weight is folded
into the projections that read its output and the norm's own weight set to one: the module
computes the same function (`arrange_model` checks it) and the engine saves a multiply per norm
(Gemma's (1 + w) alike); norms that cannot be folded (post norms on a branch's output, q/k norms)
are computed. The only copies are the q/k rows, which are interleaved per head so that the rotary
embedding is one complex multiplication (the module keeps q/k in its own order; a fused [q; k; v]
projection's v is copied too): ~13% of a layer's weights.

A layer's arranged weights are float32 tensors (`arrange_layer`); the backend makes its linear
ops from them (`layer_ops`), smoothed for int8 by `smoothing_plan`, so a low-precision engine can
make float32 ops from the same tensors again without arranging twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...backends.device import Backend
from ...backends.gemm import LinearOp
from ...backends.memory import release_freed_memory
from ...backends.smoothing import plan_layer
from ...errors import ModelLoadError
from ..families import Family, LayerKind


@dataclass(frozen=True)
class Heads:
    """The attention's head geometry, which arranging follows (q/k rows per head, q's scale)."""

    n_heads: int
    """H, the query heads."""
    n_kv: int
    """H_kv, the key/value heads."""
    head_dim: int
    """D."""
    rotary_dim: int
    """R: how many of each head's dimensions the rotary embedding turns (D, or less: partial rotary)."""
    q_factor: float
    """The scale folded into q beyond the attention kernels' 1/sqrt(D) (1.0: none)."""

    def order(self) -> torch.Tensor:
        """[D] the engine's order of each head's dimensions: the rotated halves (i, i + R/2) as
        adjacent pairs (2i, 2i + 1), then the dimensions that pass unrotated (partial rotary).

        Rotary embedding then is one complex multiplication per pair. Scores q·k are sums over
        the head dimension, so permuting it the same way in q and k changes nothing (V is untouched).
        """
        R, half = self.rotary_dim, self.rotary_dim // 2
        pairs = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).reshape(-1)  # [R]
        return torch.cat([pairs, torch.arange(R, self.head_dim)])


@dataclass(frozen=True)
class Layer:
    """One decoder layer's weights, arranged for the packed forward.

    Stored as [in, out] (transposed, contiguous): `x @ w` runs ~5% faster on the CPU than
    `F.linear`'s `x @ w.T` on these shapes. Biases are None where the model has none.
    """

    qkv: LinearOp  # [hidden, (H + 2 H_kv) D], input norm folded in; q/k columns interleaved (a copy), v shared
    #                with v_proj; bias (Qwen2, Llama attention_bias) included
    o: LinearOp  # [H D, hidden], shared with o_proj; bias (Llama attention_bias) included
    gate_up: LinearOp  # [hidden, 2 I], post-attention norm folded in, shared with gate_proj and up_proj;
    #                    bias (Llama mlp_bias) included
    down: LinearOp  # [I, hidden], shared with down_proj; bias (Llama mlp_bias) included
    eps: float | None  # the input norm's (folded into qkv); None: the family has none (OLMo 2)
    mlp_eps: float | None = None  # the MLP norm's (folded into gate_up); None: none
    kind: LayerKind = LayerKind("attention")
    qk_norm: tuple | None = None  # (q weight, k weight, eps) in the engine's q/k order, q's scale folded in
    post_attention: tuple | None = None  # (weight, eps) of the norm on the attention (or conv) branch's output
    post_mlp: tuple | None = None  # (weight, eps) of the norm on the MLP branch's output
    conv: torch.Tensor | None = None  # [K, hidden] convolution taps (LFM2; qkv = in_proj, o = out_proj)
    conv_bias: torch.Tensor | None = None


def arrange_model(model: torch.nn.Module, kinds: list[LayerKind], family: Family, heads: Heads) -> list[dict]:
    """Every decoder layer's weights arranged (`arrange_layer`), shared with the model's modules,
    and the model checked to compute the same logits as before on a probe. Raises `ModelLoadError`
    where its logits are not finite to begin with, or where arranging changed them."""
    probe = torch.arange(min(8, model.config.vocab_size), device=model.device)[None]  # [1, 8] any ids: the function must not change
    with torch.inference_mode():
        before = model(input_ids=probe, logits_to_keep=1).logits
    if not torch.isfinite(before).all():
        raise ModelLoadError("the model's weights give non-finite logits (NaN or infinity) on any input: its "
                             "files are damaged or were saved broken; copy or download the model again")
    with torch.no_grad():
        arranged = []
        for layer, kind in zip(model.model.layers, kinds):
            arranged.append(arrange_layer(layer, kind, family, heads))
            release_freed_memory()  # the layer's sources: freed, but glibc keeps the pages
    with torch.inference_mode():
        after = model(input_ids=probe, logits_to_keep=1).logits
    # Sharing and folding only re-associate float32 products (logits move by ~5e-4 on
    # SmolLM2-135M, whose logits reach ~30); a wrong arrangement moves them by units.
    if not torch.allclose(after, before, rtol=1e-3, atol=1e-3):
        raise ModelLoadError(f"arranging this model's weights for the fast path changed its logits by "
                             f"{float((after - before).abs().max()):.3g}: its configuration is one the engine "
                             "computes wrongly; please report it with the model's config.json")
    return arranged


def smoothing_plan(ranges: dict, w: dict, heads: Heads) -> dict | None:
    """A layer's int8 smoothing. A convolution layer's o input is C * conv(B * x): dividing x's
    columns divides it per channel (the convolution is depthwise and linear), unless it has a bias."""
    if w["kind"].mixer == "conv":
        if w["conv_bias"] is not None:
            return None
        n_heads, kv, dim = 1, 1, w["conv"].shape[1]
    else:
        n_heads, kv, dim = heads.n_heads, heads.n_kv, heads.head_dim
    return plan_layer(ranges, w["qkv"][0], w["o"][0], w["gate_up"][0], w["down"][0], n_heads, kv, dim)


def layer_ops(weights: dict, backend: Backend, plan: dict | None = None) -> Layer:
    """One layer's linear ops from its arranged weights (`arrange_layer`), smoothed by `plan` (int8)."""
    plan = plan or {}
    ops = {name: backend.linear(*weights[name], smooth=plan.get(name)) for name in ("qkv", "o", "gate_up", "down")}
    extra = {name: weights[name] for name in ("eps", "mlp_eps", "kind", "qk_norm", "post_attention", "post_mlp",
                                               "conv", "conv_bias")}
    return Layer(**ops, **extra)


def arrange_layer(layer: torch.nn.Module, kind: LayerKind, family: Family, heads: Heads) -> dict:
    """Arrange one layer's weights [in, out], sharing them with the module (see `_share`):
    {"qkv", "o", "gate_up", "down": (weight [in, out], bias or None), "eps", "mlp_eps", "kind",
    "qk_norm", "post_attention", "post_mlp", "conv", "conv_bias"}."""
    offset = family.norm_offset
    norm = _take_norm(getattr(layer, family.input_norm), offset) if family.input_norm else None
    arranged = {"kind": kind, "eps": _eps(getattr(layer, family.input_norm)) if family.input_norm else None,
                "qk_norm": None, "conv": None, "conv_bias": None}
    if kind.mixer == "conv":
        conv = getattr(layer, family.conv)
        arranged["qkv"] = _shared_in_out(conv.in_proj, norm=norm)  # [hidden, 3 hidden] = [B | C | x]
        arranged["o"] = _shared_in_out(conv.out_proj)
        arranged["conv"] = conv.conv.weight[:, 0, :].t().contiguous()  # [K, hidden]; row K-1: this token
        arranged["conv_bias"] = conv.conv.bias
    else:
        attn = getattr(layer, family.attention)
        arranged["qkv"] = _arrange_qkv(attn, norm, family, heads)
        arranged["o"] = _shared_in_out(getattr(attn, family.o))
        if family.qk_norm:
            arranged["qk_norm"] = _qk_norm_weights(attn, family, heads)
    post = family.post_attention_norm
    arranged["post_attention"] = _norm_weight(getattr(layer, post), offset) if post else None
    mlp = getattr(layer, family.mlp)
    mlp_norm = _take_norm(getattr(layer, family.mlp_norm), offset) if family.mlp_norm else None
    arranged["mlp_eps"] = _eps(getattr(layer, family.mlp_norm)) if family.mlp_norm else None
    if family.gate_up:
        arranged["gate_up"] = _shared_in_out(getattr(mlp, family.gate_up), norm=mlp_norm)
    else:
        arranged["gate_up"] = _shared_in_out(getattr(mlp, family.gate), getattr(mlp, family.up), norm=mlp_norm)
    arranged["down"] = _shared_in_out(getattr(mlp, family.down))
    post = family.post_mlp_norm
    arranged["post_mlp"] = _norm_weight(getattr(layer, post), offset) if post else None
    return arranged


def _arrange_qkv(attn: torch.nn.Module, norm: torch.Tensor | None, family: Family, heads: Heads) -> tuple:
    """(qkv weight [hidden, (H + 2 H_kv) D], bias or None): q/k rows in the engine's head order
    (copies, q scaled by `q_factor` unless a q norm follows), v shared with the module where the
    module's v is a projection of its own, the input norm folded in."""
    D, q_factor = heads.head_dim, heads.q_factor
    q_out, k_out = heads.n_heads * D, heads.n_kv * D
    rotated = q_out + k_out
    if family.qkv:  # fused: the module reads one [in, (H + 2 H_kv) D] tensor; the engine copies
        fused, fused_bias = _shared_in_out(getattr(attn, family.qkv), norm=norm)
        q_w, k_w, v_w = fused[:, :q_out].t(), fused[:, q_out:rotated].t(), fused[:, rotated:]
        biases = (None,) * 3 if fused_bias is None else (fused_bias[:q_out], fused_bias[q_out:rotated],
                                                          fused_bias[rotated:])
        v = None
    else:
        q, k, v = getattr(attn, family.q), getattr(attn, family.k), getattr(attn, family.v)
        _scale_inputs(norm, q, k)  # the module keeps q/k in its own order (folded copies)
        q_w, k_w, v_w = q.weight, k.weight, v.weight.t()
        biases = (q.bias, k.bias, v.bias)
    order = heads.order().to(q_w.device)
    qkv = torch.empty(q_w.shape[1], rotated + v_w.shape[1], device=q_w.device)  # [hidden, (H + 2 H_kv) D]
    _interleave_into(qkv[:, :q_out], q_w, order)
    _interleave_into(qkv[:, q_out:rotated], k_w, order)
    qkv[:, rotated:].copy_(v_w)
    if v is not None:
        if norm is not None:
            qkv[:, rotated:].mul_(norm[:, None])
        _share((v,), qkv[:, rotated:])
    scale_q = q_factor != 1.0 and not family.qk_norm
    if scale_q:
        qkv[:, :q_out].mul_(q_factor)
    if biases[0] is None:
        return qkv, None
    q_b, k_b, v_b = biases
    q_b = q_b.view(-1, D)[:, order].reshape(-1) * (q_factor if scale_q else 1.0)
    bias = torch.cat([q_b, k_b.view(-1, D)[:, order].reshape(-1), v_b])
    if v is not None:
        v.bias = torch.nn.Parameter(bias[rotated:], requires_grad=False)
    return qkv, bias


def _qk_norm_weights(attn: torch.nn.Module, family: Family, heads: Heads) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(q weight, k weight, eps) of the q/k norms in the engine's head order, q's scale folded in."""
    order = heads.order()
    offset = family.norm_offset
    q_norm, k_norm = getattr(attn, family.q_norm), getattr(attn, family.k_norm)

    def arranged(norm) -> torch.Tensor:
        weight = norm.weight.float() + offset
        order_ = order.to(weight.device)
        if family.qk_norm == "head":  # [D]
            return weight[order_].contiguous()
        return weight.view(-1, heads.head_dim)[:, order_].reshape(-1).contiguous()  # [n D]

    return arranged(q_norm) * heads.q_factor, arranged(k_norm), _eps(q_norm)


def _share(linears: tuple[torch.nn.Linear, ...], weight: torch.Tensor) -> None:
    """Make the linears' weights transposed views of column blocks of `weight` [in, sum(out)].

    `F.linear` reads a transposed view without copying, so the Hugging Face forward (the
    reference path) computes with the engine's tensors and the weights are held once.
    """
    start = 0
    for lin in linears:
        out = lin.weight.shape[0]
        lin.weight = torch.nn.Parameter(weight[:, start : start + out].t(), requires_grad=False)
        start += out


def _take_norm(norm: torch.nn.Module, offset: float) -> torch.Tensor:
    """The RMSNorm's effective weight (w, or 1 + w with `offset` 1), float32, and the module made
    the plain normalisation (weight 1 - offset): the caller folds the weight into the linears that
    read the norm's output, norm(x) @ W.T = (x / rms(x)) @ (W * w).T, so the module's function is
    unchanged while the engine's norm is one multiply shorter."""
    weight = norm.weight.float() + offset
    norm.weight = torch.nn.Parameter(torch.full_like(norm.weight, 1.0 - offset), requires_grad=False)
    return weight


def _scale_inputs(norm: torch.Tensor | None, *linears: torch.nn.Linear) -> None:
    """Multiply the input columns of the linears by `norm` (new tensors; see `_take_norm`)."""
    if norm is None:
        return
    for lin in linears:
        lin.weight = torch.nn.Parameter(lin.weight * norm[None, :], requires_grad=False)


def _norm_weight(norm: torch.nn.Module, offset: float) -> tuple[torch.Tensor, float]:
    """(effective weight, eps) of a norm the engine computes (it cannot be folded)."""
    return norm.weight.float() + offset, _eps(norm)


def _eps(norm: torch.nn.Module) -> float:
    eps = getattr(norm, "variance_epsilon", None)
    return float(norm.eps if eps is None else eps)


def _shared_in_out(*linears: torch.nn.Linear, norm: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Linears that read the same input as one [in, sum(out)] weight, shared with them, with the
    weight `norm` [in] of the RMSNorm before them folded in (taken by `_take_norm`).

    Written block by block into one new tensor and scaled in place: each source is freed when its
    module's weight is replaced, and no layer-sized temporary exists on the way.
    """
    weight = torch.empty(linears[0].weight.shape[1], sum(lin.weight.shape[0] for lin in linears),
                         device=linears[0].weight.device)  # [in, sum(out)]
    start = 0
    for lin in linears:
        out = lin.weight.shape[0]
        weight[:, start : start + out].copy_(lin.weight.t())
        start += out
    if norm is not None:
        weight.mul_(norm[:, None])
    biases = [lin.bias for lin in linears]
    bias = torch.cat(biases) if all(b is not None for b in biases) else None
    _share(linears, weight)
    if bias is not None:
        start = 0
        for lin in linears:
            out = lin.weight.shape[0]
            lin.bias = torch.nn.Parameter(bias[start : start + out], requires_grad=False)
            start += out
    return weight, bias


def _interleave_into(out: torch.Tensor, weight: torch.Tensor, order: torch.Tensor) -> None:
    """Write q or k rows `weight` [n D, in] into `out` [in, n D] with each head's dimensions in
    `order` [D] (`Heads.order`: the rotated halves (i, i + R/2) made adjacent pairs)."""
    D = order.numel()
    n = weight.shape[0] // D
    out.view(out.shape[0], n, D).copy_(weight.view(n, D, weight.shape[1])[:, order].permute(2, 0, 1))
