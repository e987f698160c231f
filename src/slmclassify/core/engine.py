"""The fast path: the model's decoder layers over a batch of items that continue a prefix
whose keys and values were computed once, plus the label-trie nodes, in one forward pass.

A batch arrives left-padded ([B, S], `batching.py`); its real tokens are packed, one row after
another, each row's label-trie nodes after its item tokens. Projections, MLP and norms (~90% of
the arithmetic) run on the packed tokens only. Attention runs in a padded layout of width
W = S + T in which every row is right-padded, and in two parts merged by their log-sum-exps:

    padded row:  [ s s s s n1 n2 . . ]           s = item token, n = trie node, . = pad
    positions:     P .. P+3 | P+4+depth-1
    part 1, all queries of the batch at once:    every prefix key  [ p p p p ]  (P tokens, cached)
    part 2, per row:  query s_i sees the row's item keys up to itself (causal)
                      query n_t sees every item key of the row, its trie ancestors and itself
                      query .   sees what is causal (finite; its output is never read)

Part 1 is one dense product (no copies of the prefix per row, no mask). Without trie nodes
(first-token scoring, single-token labels) part 2 is plain causal attention without a mask,
whose kernel skips the blocks above the diagonal; with nodes it takes a mask.

Only the item's last token and the trie nodes reach the output layer (`read_states`; the scorer
stacks several batches' for one `label_scores` call, which reads the vocabulary's weights once).
What differs between model families (norm placement, q/k norms, scales, sliding windows, no-rotary
layers, fused projections, LFM2's short convolutions) is read from the family's description
(`families.py`); the code below follows it. The weights are the Hugging Face model's own, held
ONCE: each linear weight is stored here in [in, out] layout (q/k/v and gate/up concatenated) and
the Hugging Face module's `weight` becomes a transposed view of it, so the reference path computes with the very same
tensors. Arranging goes layer by layer, writing each arranged tensor block by block, and each
source tensor is freed when its module's weight is replaced, so the transient is about one layer
(the loaded weights are in memory of their own, not a file's memory map: `weights.py`). Each
RMSNorm weight is folded into the projections that read its output and the norm's own weight set
to one: the module computes the same function (checked when the engine is built) and the engine
saves a multiply per norm (Gemma's (1 + w) alike); norms that cannot be folded (post norms on a
branch's output, q/k norms) are computed. The only copies are the q/k rows, which are interleaved
per head so that the rotary embedding is one complex multiplication (the module keeps q/k in its
own order; a fused [q; k; v] projection's v is copied too): ~13% of a layer's weights.

LFM2's convolution layers (a gated depthwise causal convolution of kernel K over the sequence) read
each token's K - 1 predecessors: the row's earlier item tokens, the prefix's last K - 1 inputs
(cached in place of keys), or, for a trie node, its ancestors: the same predecessors the reference
sees in its one unpadded sequence. `config_check.py` decides which configurations this code computes exactly.
`reference.py` runs the unmodified Hugging Face forward and is the oracle for this code.

Devices and precisions come from a `backends.Backend`: it makes the linear ops (MKL, oneDNN,
int8, bf16...) and runs the attention kernel; every index, mask and position tensor is created
on its device, and the residual stream, the norms and the output layer stay in float32.
"""

from __future__ import annotations

import copy
import dataclasses

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..backends.device import Backend
from ..backends.gemm import LinearOp, rms_norm, swiglu_
from ..backends.memory import release_freed_memory
from ..backends.smoothing import plan_layer
from ..errors import FieldError, ModelLoadError
from .batching import Batch
from .config_check import check_config, head_dim
from .families import LayerKind, family_of, layer_kinds
from .labels import LabelTrie
from .taps import Taps

# Cap on the [rows, positions, vocab] logits tensor per output-layer call (floats).
_LOGITS_CHUNK = 1 << 24

# Rows at least this many times as wide as the prefix attend to it in one kernel call with their
# own keys (the prefix copied into each row, C dummy queries in front); shorter rows call the
# kernel twice and merge: for them the dummy queries' P^2/2 products cost more than the merge
# saves. The A/Bs behind 1.5 are in docs/performance.md (*Prefix attention inline for wide rows*).
_INLINE_PREFIX_RATIO = 1.5


@dataclass(frozen=True)
class PrefixCache:
    """Keys and values of the shared prefix, computed once per run."""

    keys: tuple[torch.Tensor, ...]
    """Per layer [1, H_kv, P, D], rotary already applied; a convolution layer's last K - 1 inputs [K-1, hidden]."""
    values: tuple[torch.Tensor, ...]
    """Per layer [1, H_kv, P, D] (an empty tensor for a convolution layer)."""
    tokens: int = 0
    """P, the prefix's length."""

    @property
    def length(self) -> int:
        return self.tokens


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's weights, arranged for the packed forward.

    Stored as [in, out] (transposed, contiguous): `x @ w` runs ~5% faster than `F.linear`'s
    `x @ w.T` with MKL on these shapes. Biases are None where the model has none.
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


@dataclass(frozen=True)
class _Layout:
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
    starts: torch.Tensor | None = None  # [B] int64 packed index of each row's first token (the C kernel's rows)
    lengths: torch.Tensor | None = None  # [B] int64 item tokens per row (its T trie nodes follow them)
    ancestors: torch.Tensor | None = None  # [T, T] uint8 trie ancestors (self included); None without nodes
    conv_prev: torch.Tensor | None = None  # [N, K-1] each token's predecessors at lags 1..K-1 (convolution layers)
    windows: dict = dataclasses.field(default_factory=dict)  # {window: (mask, read_mask)} of the sliding
    #   windows some query of this batch reaches past (masks as above, keys also within the window); the
    #   prefix is inline then (prefix_cols = P)


@dataclass
class _Pool:
    """The tokens of each row's mean (`Engine._pool`) and the means collected so far."""

    tokens: torch.Tensor  # [M] packed indices of the pooled tokens
    rows: torch.Tensor  # [M] their rows
    counts: torch.Tensor  # [B, 1] float32 pooled tokens per row
    layers: frozenset  # the layers whose means are wanted
    means: dict = dataclasses.field(default_factory=dict)  # {layer: [B, hidden] float32}


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
    `order` [D] (`Engine._head_order`: the rotated halves (i, i + R/2) made adjacent pairs)."""
    D = order.numel()
    n = weight.shape[0] // D
    out.view(out.shape[0], n, D).copy_(weight.view(n, D, weight.shape[1])[:, order].permute(2, 0, 1))


class Engine:
    """Scores label tries for batches of items, reusing one prefix cache."""

    def __init__(self, model: torch.nn.Module, backend: Backend | None = None,
                 ranges: Callable[[Engine], list[dict[str, torch.Tensor]]] | None = None):
        """`ranges` (int8 backends): given this engine computing in float32, each layer's max |x| per
        input channel of its ops {"qkv", "o", "gate_up", "down"} (`models/activation_ranges.py`), from
        which the int8 ops are smoothed (`backends/smoothing.py`). Without it int8 is not smoothed."""
        from transformers.activations import ACT2FN

        self.backend = backend or Backend(device=model.device, precision="fp32", gemm="mm")
        self.device, self.dtype = self.backend.device, self.backend.dtype
        base = model.model
        cfg = model.config
        check_config(cfg)
        self.family = family = family_of(cfg)
        self.kinds = layer_kinds(cfg)
        self.embed = base.embed_tokens
        self.rotary = getattr(base, "rotary_emb", None)
        self.final_norm = getattr(base, family.final_norm)
        self.lm_head = model.lm_head
        self.head_dim = head_dim(cfg)
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads or cfg.num_attention_heads
        self.embed_scale = _setting(cfg, family.embedding_multiplier)
        self.residual_scale = _setting(cfg, family.residual_multiplier)
        self.logits_divisor = _setting(cfg, family.logits_divisor)
        self.logit_softcap = getattr(cfg, family.logit_softcap, None) if family.logit_softcap else None
        # The attention kernels scale scores by 1/sqrt(D); another scale is folded into q.
        scale = None
        if family.attention_multiplier:
            scale = float(getattr(cfg, family.attention_multiplier))
        elif family.query_pre_attn_scalar:
            scale = float(cfg.query_pre_attn_scalar) ** -0.5
        self.q_factor = 1.0 if scale is None else scale * self.head_dim ** 0.5
        # The model's own activation (transformers' ACT2FN), so any activation is exact; SiLU, the
        # common one, runs in place.
        act = getattr(cfg, family.activation, None) or "silu"
        self.act = ACT2FN[act]
        self.silu = act in ("silu", "swish")
        self.rope_keys = sorted({k.rope for k in self.kinds if k.mixer == "attention" and k.rope is not None})
        self.rotary_dim = self._rotary_dim()
        self.conv_taps = int(cfg.conv_L_cache) if any(k.mixer == "conv" for k in self.kinds) else 0
        self.windows = sorted({k.window for k in self.kinds if k.window})
        self.linear_params = sum(m.weight.numel() for layer in base.layers for m in layer.modules()
                                 if isinstance(m, torch.nn.Linear))
        probe = torch.arange(min(8, cfg.vocab_size), device=model.device)[None]  # [1, 8] any ids: the function must not change
        with torch.inference_mode():
            before = model(input_ids=probe, logits_to_keep=1).logits
        if not torch.isfinite(before).all():
            raise ModelLoadError("the model's weights give non-finite logits (NaN or infinity) on any input: its "
                                 "files are damaged or were saved broken; copy or download the model again")
        with torch.no_grad():
            arranged = []
            for layer, kind in zip(base.layers, self.kinds):
                arranged.append(self._arrange(layer, kind))
                release_freed_memory()  # the layer's sources: freed, but glibc keeps the pages
        with torch.inference_mode():
            after = model(input_ids=probe, logits_to_keep=1).logits
        # Sharing and folding only re-associate float32 products (logits move by ~5e-4 on
        # SmolLM2-135M, whose logits reach ~30); a wrong arrangement moves them by units.
        if not torch.allclose(after, before, rtol=1e-3, atol=1e-3):
            raise ModelLoadError(f"arranging this model's weights for the fast path changed its logits by "
                                 f"{float((after - before).abs().max()):.3g}: its configuration is one the engine "
                                 "computes wrongly; please report it with the model's config.json")
        # A low-precision engine keeps the arranged float32 weights (shared with the model's modules,
        # except the interleaved q/k copy) so that `exact()` can compute in float32 without arranging again.
        self._arranged = arranged if self.backend.precision != "fp32" else None
        plans = [None] * len(arranged)
        if ranges is not None and self.backend.smooths:  # recorded in float32, on the same tensors
            plans = [self._plan(r, w) for r, w in zip(ranges(self.exact()), arranged)]
        self.layers = [self._ops(weights, self.backend, plan) for weights, plan in zip(arranged, plans)]

    def _plan(self, ranges: dict, w: dict) -> dict | None:
        """A layer's int8 smoothing. A convolution layer's o input is C * conv(B * x): dividing x's
        columns divides it per channel (the convolution is depthwise and linear), unless it has a bias."""
        if w["kind"].mixer == "conv":
            if w["conv_bias"] is not None:
                return None
            heads, kv, dim = 1, 1, w["conv"].shape[1]
        else:
            heads, kv, dim = self.n_heads, self.n_kv, self.head_dim
        return plan_layer(ranges, w["qkv"][0], w["o"][0], w["gate_up"][0], w["down"][0], heads, kv, dim)

    def batch_variance(self) -> str | None:
        """Why an item's scores could differ in their last bits with the batch it runs in; None: they
        cannot. The GEMMs are invariant once padded (`Backend.gemm_variance`, probed where the kernels are
        timed); attention computes each row alone only in the C kernel (`Backend.packs_attention`),
        while torch's kernels reduce over the padded row length. Norms, rotary and the short
        convolution compute each token alone."""
        if (why := self.backend.gemm_variance()) is not None:
            return why
        if not self.backend.invariant:
            return "its GEMMs were not probed"
        if not self.backend.packs_attention(self.head_dim):
            return "torch's attention kernel reduces over the batch's padded row length"
        if self.windows:
            return "sliding-window layers attend in the padded layout"
        return None

    @property
    def batch_invariant(self) -> bool:
        return self.batch_variance() is None

    def weight_copy_bytes(self) -> int:
        """Memory the GEMM kernel keeps beside the float32 weights the model's modules share: oneDNN's
        blocked float32 copy, or the low-precision copy a bf16, fp16 or int8 engine computes with."""
        gemm = self.backend.gemm
        per = 4 if gemm == "onednn" else 2 if gemm in ("bf16", "fp16") else 1 if gemm.startswith("int8") else 0
        return per * self.linear_params

    def exact(self) -> Engine:
        """This engine computing in float32 with the exact `mm` kernel, on the same weights (no copy):
        itself when it already is; for a low precision, what calibration is measured with."""
        if self._arranged is None:
            return self
        exact = copy.copy(self)
        exact.backend = Backend(device=self.device, precision="fp32", gemm="mm", invariant=self.backend.invariant)
        exact.dtype = exact.backend.dtype
        exact.layers = [self._ops(weights, exact.backend) for weights in self._arranged]
        exact._arranged = None
        return exact

    @staticmethod
    def _ops(weights: dict, backend: Backend, plan: dict | None = None) -> _Layer:
        """One layer's linear ops from its arranged weights (`_arrange`), smoothed by `plan` (int8)."""
        plan = plan or {}
        ops = {name: backend.linear(*weights[name], smooth=plan.get(name)) for name in ("qkv", "o", "gate_up", "down")}
        extra = {name: weights[name] for name in ("eps", "mlp_eps", "kind", "qk_norm", "post_attention", "post_mlp",
                                                   "conv", "conv_bias")}
        return _Layer(**ops, **extra)

    def _rotary_dim(self) -> int:
        """R: how many of each head's dimensions the rotary embedding turns (D, or less: partial rotary)."""
        if not self.rope_keys:
            return self.head_dim
        dev = self.embed.weight.device
        cos, _ = self._rotary(torch.zeros(1, 1, device=dev), torch.zeros(1, 1, dtype=torch.long, device=dev),
                              self.rope_keys[0])
        return int(cos.shape[-1])

    def _rotary(self, x, positions, key: str):
        """cos, sin [1, N, R] of the Hugging Face rotary module (a layer type's table for Gemma 3)."""
        if self.family.rope_per_layer_type:
            return self.rotary(x, positions, key)
        return self.rotary(x, positions)

    def _head_order(self) -> torch.Tensor:
        """[D] the engine's order of each head's dimensions: the rotated halves (i, i + R/2) as
        adjacent pairs (2i, 2i + 1), then the dimensions that pass unrotated (partial rotary).

        Rotary embedding then is one complex multiplication per pair. Scores q·k are sums over
        the head dimension, so permuting it the same way in q and k changes nothing (V is untouched).
        """
        R, half = self.rotary_dim, self.rotary_dim // 2
        pairs = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).reshape(-1)  # [R]
        return torch.cat([pairs, torch.arange(R, self.head_dim)])

    def _arrange(self, layer: torch.nn.Module, kind: LayerKind) -> dict:
        """Arrange one layer's weights [in, out], sharing them with the module (see `_share`):
        {"qkv", "o", "gate_up", "down": (weight [in, out], bias or None), "eps", "mlp_eps", "kind",
        "qk_norm", "post_attention", "post_mlp", "conv", "conv_bias"}."""
        family, offset = self.family, self.family.norm_offset
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
            arranged["qkv"] = self._arrange_qkv(attn, norm)
            arranged["o"] = _shared_in_out(getattr(attn, family.o))
            if family.qk_norm:
                arranged["qk_norm"] = self._qk_norm_weights(attn)
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
        # the backend's kernel (mm computes with these very tensors, others copy them)
        return arranged

    def _arrange_qkv(self, attn: torch.nn.Module, norm: torch.Tensor | None) -> tuple:
        """(qkv weight [hidden, (H + 2 H_kv) D], bias or None): q/k rows in the engine's head order
        (copies, q scaled by `q_factor` unless a q norm follows), v shared with the module where the
        module's v is a projection of its own, the input norm folded in."""
        family, D = self.family, self.head_dim
        q_out, k_out = self.n_heads * D, self.n_kv * D
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
        order = self._head_order().to(q_w.device)
        qkv = torch.empty(q_w.shape[1], rotated + v_w.shape[1], device=q_w.device)  # [hidden, (H + 2 H_kv) D]
        _interleave_into(qkv[:, :q_out], q_w, order)
        _interleave_into(qkv[:, q_out:rotated], k_w, order)
        qkv[:, rotated:].copy_(v_w)
        if v is not None:
            if norm is not None:
                qkv[:, rotated:].mul_(norm[:, None])
            _share((v,), qkv[:, rotated:])
        scale_q = self.q_factor != 1.0 and not family.qk_norm
        if scale_q:
            qkv[:, :q_out].mul_(self.q_factor)
        if biases[0] is None:
            return qkv, None
        q_b, k_b, v_b = biases
        q_b = q_b.view(-1, D)[:, order].reshape(-1) * (self.q_factor if scale_q else 1.0)
        bias = torch.cat([q_b, k_b.view(-1, D)[:, order].reshape(-1), v_b])
        if v is not None:
            v.bias = torch.nn.Parameter(bias[rotated:], requires_grad=False)
        return qkv, bias

    def _qk_norm_weights(self, attn: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, float]:
        """(q weight, k weight, eps) of the q/k norms in the engine's head order, q's scale folded in."""
        order = self._head_order()
        offset = self.family.norm_offset
        q_norm, k_norm = getattr(attn, self.family.q_norm), getattr(attn, self.family.k_norm)

        def arranged(norm) -> torch.Tensor:
            weight = norm.weight.float() + offset
            order_ = order.to(weight.device)
            if self.family.qk_norm == "head":  # [D]
                return weight[order_].contiguous()
            return weight.view(-1, self.head_dim)[:, order_].reshape(-1).contiguous()  # [n D]

        return arranged(q_norm) * self.q_factor, arranged(k_norm), _eps(q_norm)

    @torch.inference_mode()
    def prefill(self, prefix_ids: list[int]) -> PrefixCache:
        """Run the prefix once and keep every layer's keys and values."""
        P, dev = len(prefix_ids), self.device
        everything = torch.arange(P, device=dev)
        zero = torch.zeros(1, dtype=torch.long, device=dev)
        causal = everything[None, :, None] >= everything[None, None, :]  # [1, P, P]
        windows = {w: (_additive(self._within(causal, everything[None], w)[:, None], self.dtype), None)
                   for w in self.windows if P > w}
        layout = _Layout(B=1, W=P, source=everything, index=everything, read=torch.tensor([[P - 1]], device=dev),
                         positions=everything, mask=None,
                         read_mask=torch.zeros(1, 1, 1, P, dtype=self.dtype, device=dev),
                         conv_prev=self._conv_prev(zero, zero + P, None) if self.conv_taps else None, windows=windows)
        keys, values = [], []
        self._layers(torch.tensor(prefix_ids, device=dev), layout, None, keys, values)
        return PrefixCache(keys=tuple(keys), values=tuple(values), tokens=P)

    @torch.inference_mode()
    def score(self, batch: Batch, prefix: PrefixCache | None, trie: LabelTrie, taps: Taps = Taps(),
              pool_from: int = 0):
        """[B, L] label scores of every row (mode of `trie`): `read_states`, then `label_scores`.

        With `taps` (`core/taps.py`), returns (scores, [B, len(taps), hidden] states) read from the
        same forward (the head's features, `head/`).
        """
        read, states = self.read_states(batch, prefix, trie, taps, pool_from)
        scores = self.label_scores(read, trie)
        return scores if not taps else (scores, states)

    @torch.inference_mode()
    def read_states(self, batch: Batch, prefix: PrefixCache | None, trie: LabelTrie, taps: Taps = Taps(),
                    pool_from: int = 0):
        """The decoder over a batch: ([B, 1+T, hidden] final-normed states at the read positions, the
        [B, len(taps), hidden] tapped states on the CPU or None). The output layer is not run here:
        a caller scoring many small batches stacks their read states for `label_scores`, which then
        streams the output layer's weights (the whole vocabulary, ~400 MB for a 100k one) once
        for all of them instead of once per batch.

        `taps.last`: each row's state at its last item token; `taps.mean`: the mean of each row's
        states at the prompt positions from `pool_from` on (at least its last token), the prompt
        head every item shares being tokens 0 .. pool_from - 1 (`core/taps.py`)."""
        if taps and (bad := taps.out_of_range(len(self.layers))):
            raise FieldError("taps", "{field} {value} out of range: the model has layers 1..{layers} (a mean: "
                             "1..{below})", value=", ".join(bad), layers=len(self.layers), below=len(self.layers) - 1)
        n_prefix = prefix.length if (batch.cached and prefix is not None) else 0
        prefix = prefix if (batch.cached and prefix is not None and prefix.length) else None
        layout = self._layout(batch, trie, prefix.length if prefix else 0)
        B = batch.input_ids.shape[0]
        ids = torch.cat([batch.input_ids.to(self.device, non_blocking=True),
                         trie.node_tokens.to(self.device).expand(B, -1)], dim=1)  # [B, S+T], left-padded
        states = [] if taps else None
        pool = self._pool(layout, trie, n_prefix, pool_from, taps.mean) if taps.mean else None
        read = self.final_norm(self._layers(ids.reshape(-1)[layout.source], layout, prefix, states=states, pool=pool))
        if not taps:
            return read, None
        states.append(read[:, 0])
        tapped = [states[t - 1] for t in taps.last] + [pool.means[t] for t in taps.mean]
        return read, torch.stack(tapped, dim=1).float().cpu()

    def _pool(self, layout: _Layout, trie: LabelTrie, n_prefix: int, pool_from: int, layers) -> _Pool:
        """Which packed tokens each row's mean takes: its item tokens at prompt positions
        >= pool_from (the row's own column j sits at position n_prefix + j), at least its last."""
        dev, lengths = self.device, layout.lengths
        row = torch.repeat_interleave(torch.arange(layout.B, device=dev), lengths + trie.n_nodes)  # [N]
        own = torch.arange(row.numel(), device=dev) - layout.starts[row]
        first = torch.full_like(lengths, max(pool_from - n_prefix, 0)).minimum(lengths - 1)  # [B]
        tokens = ((own < lengths[row]) & (own >= first[row])).nonzero().squeeze(1)
        rows = row.index_select(0, tokens)
        counts = torch.bincount(rows, minlength=layout.B).to(torch.float32)[:, None]
        return _Pool(tokens=tokens, rows=rows, counts=counts, layers=frozenset(layers))

    @torch.inference_mode()
    def label_scores(self, read: torch.Tensor, trie: LabelTrie) -> torch.Tensor:
        """[R, 1+T, hidden] read states (`read_states`, of one batch or several stacked) → [R, L]
        float32 label scores on the CPU."""
        return trie.score(self._step_logprobs(read, trie).float().cpu())

    def output_rows(self, trie: LabelTrie) -> int:
        """Rows per output-layer call (`_LOGITS_CHUNK`): how many read states `label_scores` takes
        at once at no more memory; fewer read the output layer's weights for fewer rows."""
        return max(1, _LOGITS_CHUNK // ((1 + trie.n_nodes) * self.lm_head.out_features))

    def _layout(self, batch: Batch, trie: LabelTrie, n_prefix: int) -> _Layout:
        dev = self.device
        lengths = batch.lengths.to(dev)[:, None]  # [B, 1]
        B, S = batch.input_ids.shape
        T = trie.n_nodes
        # A sliding window matters where some query sits `window` or more positions after a key.
        last = n_prefix + int(batch.lengths.max()) - 1 + (int(trie.node_depth.max()) if T else 0)
        windows = [w for w in self.windows if last >= w]
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
            sees = self._within(allowed, positions, w)
            reads = sees.gather(1, read_cols[:, :, None].expand(B, 1 + T, W))
            window_masks[w] = (_additive(sees[:, None], self.dtype), _additive(reads[:, None], self.dtype))
        return _Layout(B=B, W=W, source=source, index=index, read=read,
                       positions=positions.reshape(-1)[index],
                       mask=_additive(allowed[:, None], self.dtype) if T else None,
                       read_mask=_additive(read_allowed[:, None], self.dtype), prefix_cols=C,
                       starts=starts.long(), lengths=lengths[:, 0].long().contiguous(),
                       ancestors=trie.ancestors.to(device=dev, dtype=torch.uint8).contiguous() if T else None,
                       conv_prev=self._conv_prev(starts.long(), lengths[:, 0].long(), trie) if self.conv_taps else None,
                       windows=window_masks)

    @staticmethod
    def _within(allowed: torch.Tensor, positions: torch.Tensor, window: int) -> torch.Tensor:
        """[B, W, W] `allowed` and the key within `window` positions of the query (i - j < window, as
        transformers' sliding-window mask). positions: [B or 1, W] of the layout's columns."""
        return allowed & ((positions[:, :, None] - positions[:, None, :]) < window)

    def _conv_prev(self, starts: torch.Tensor, lengths: torch.Tensor, trie: LabelTrie | None) -> torch.Tensor:
        """[N, K-1] where each packed token's predecessors at lags 1 .. K-1 are, as indices into
        [the prefix's last K-1 inputs; the packed tokens]: an item token's are the row's earlier
        tokens, then the prefix's last ones (zeros before position 0); a trie node's are its
        ancestors, then the item's last tokens, as in the reference's one unpadded sequence."""
        dev, lags = starts.device, self.conv_taps - 1
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

    def _layers(self, ids: torch.Tensor, layout: _Layout, prefix: PrefixCache | None,
                keys: list | None = None, values: list | None = None, states: list | None = None,
                pool: _Pool | None = None) -> torch.Tensor:
        """Embed the packed ids and run every decoder layer.

        Returns [B, 1+T, hidden] (before the final norm) at the read positions: each layer computes
        the outputs later layers read (`_needed_rows`), the last one its attention queries and MLP
        only at the read positions. With `keys` given (the prefill), every layer's keys and values
        are collected, every token is computed and nothing is read. With `states` given, every layer
        but the last appends its output at each row's last item token, [B, hidden]; with `pool`,
        the layers it names also put their row means in `pool.means` (every token computed then).
        """
        h = self.embed(ids)  # [N, hidden]
        if self.embed_scale is not None:
            h = h * self.embed_scale
        half = self.rotary_dim // 2
        cis = {}
        for key in self.rope_keys:
            cos, sin = self._rotary(h[None], layout.positions[None], key)  # [1, N, R] each
            # HF's cos/sin repeat one half twice; as complex numbers: [N, 1, R/2]
            cis[key] = torch.complex(cos[0, :, None, :half].float().contiguous(), sin[0, :, None, :half].float().contiguous())
        # q/k/v in the padded layout, shared by all layers: only real rows are ever written, so
        # the pad rows stay zero (a pad key is masked or after every real query, a pad query is
        # never read, and zeros keep their products finite). None: the backend's C kernel attends
        # on the packed rows themselves (scoring only; the prefill collects padded keys).
        padded = None
        if (keys is not None or layout.starts is None or layout.windows
                or not self.backend.packs_attention(self.head_dim)):
            padded = h.new_zeros(layout.B * layout.W, self.n_heads + 2 * self.n_kv, self.head_dim, dtype=self.dtype)
        needed = self._needed_rows(layout) if keys is None else [None] * len(self.layers)
        if pool is not None:  # a mean reads every token of its layer
            needed = [None] * (len(self.layers) - 1) + needed[-1:]
        rows = None  # the packed tokens h holds (None: all of them)
        for i, layer in enumerate(self.layers):
            past = None if prefix is None else (prefix.keys[i], prefix.values[i])
            keep = needed[i]
            if layer.kind.mixer == "conv":
                out = self._conv_block(h, layer, padded, layout, past, keep, rows)
            else:
                out = self._attention_block(h, layer, cis, padded, layout, past, keep,
                                            read_only=keep is not None and i == len(needed) - 1)
            if keep is None:
                if keys is not None:
                    k, v = out
                    keys.append(k.clone(memory_format=torch.contiguous_format))  # views of `padded`, which the next layer overwrites
                    values.append(v.clone(memory_format=torch.contiguous_format))
            else:
                h, rows = out, keep
            self._mlp_block(h, layer)
            if states is not None and i < len(self.layers) - 1:
                at = layout.read[:, 0] if rows is None else _local_index(rows, layout.source.numel())[layout.read[:, 0]]
                states.append(h.index_select(0, at))
            if pool is not None and i + 1 in pool.layers:
                sums = h.new_zeros(layout.B, h.shape[-1], dtype=torch.float32)
                pool.means[i + 1] = sums.index_add_(0, pool.rows, h.index_select(0, pool.tokens).float()) / pool.counts
        return h.view(layout.B, -1, h.shape[-1]) if keys is None else h

    def _needed_rows(self, layout: _Layout) -> list:
        """Per layer, the packed tokens whose output a later layer (or the output layer) reads, in
        packed order; None: all of them. The last layer's are the read positions; a convolution
        layer reads its tokens' K - 1 predecessors too (those among the packed tokens; the others
        are the prefix's cached inputs), an attention layer every token (its keys and values), so
        only the layers after the last attention layer compute fewer rows (LFM2's last layers)."""
        need, out = layout.read.reshape(-1), []
        for layer in reversed(self.layers):
            out.append(need)
            if need is None or layer.kind.mixer != "conv":
                need = None
                continue
            prev = layout.conv_prev.index_select(0, need).reshape(-1) - (self.conv_taps - 1)
            need = torch.unique(torch.cat([need, prev[prev >= 0]]))  # sorted: packed order
            if need.numel() == layout.source.numel():
                need = None
        return out[::-1]

    def _attention_block(self, h, layer: _Layer, cis, padded, layout: _Layout, past, keep: torch.Tensor | None = None,
                         read_only: bool = False):
        """h += attention(norm(h)); returns this block's [B, H_kv, W, D] keys and values.

        Attention to the shared prefix and attention within each row run as two flash-attention
        calls, merged with their log-sum-exps: the prefix part is one dense product for all
        queries of the batch (no copies of the prefix per row, no mask), the row part is causal.
        Rows much wider than the prefix (`layout.prefix_cols`) take it inline instead: one call.
        With `keep` (packed indices, `_needed_rows`), the updated hidden states of those tokens only,
        [len(keep), hidden], are returned instead; with `read_only` too, `keep` is the read positions
        and the queries are computed there only.
        """
        N = h.shape[0]
        H, Hkv, D = self.n_heads, self.n_kv, self.head_dim
        attend = self.backend.attend
        qkv = (layer.qkv.normed(h, layer.eps) if layer.eps is not None else layer.qkv(h)).float()
        qkv = qkv.view(N, H + 2 * Hkv, D)  # [N, H+2Hkv, D]; q/k norms and rotary in float32
        if layer.qk_norm is not None:
            self._norm_qk(qkv, *layer.qk_norm)
        if layer.kind.rope is not None:
            qk = torch.view_as_complex(qkv[:, : H + Hkv].unflatten(-1, (D // 2, 2)))  # [N, H+Hkv, D/2]
            rope = cis[layer.kind.rope]
            (qk if rope.shape[-1] == D // 2 else qk[..., : rope.shape[-1]]).mul_(rope)  # in place (rows interleaved at load time)
        qkv = qkv.to(self.dtype)  # attention's precision (a no-op in float32)
        if padded is None:  # one C pass per (row, KV head) over the packed rows, the prefix included
            prefix_kv = None if past is None else (past[0][0].contiguous(), past[1][0].contiguous())  # [Hkv, P, D]
            out = self.backend.attend_packed(qkv.contiguous(), H, layout.starts, layout.lengths, layout.ancestors,
                                             prefix_kv, read_only).view(-1, H * D)  # [N or B*(1+T), H D]
            if keep is not None:  # read_only: `out` is at `keep` already
                return self._residual(h.index_select(0, keep), layer.o,
                                      out if read_only else out.index_select(0, keep), layer.post_attention)
            self._residual(h, layer.o, out, layer.post_attention)
            return None, None
        padded.index_copy_(0, layout.index, qkv)
        rows = padded.view(layout.B, layout.W, H + 2 * Hkv, D)  # [B, W, H+2Hkv, D]
        C = layout.prefix_cols
        if C:  # the prefix inline: its keys/values into every row's first C columns (q stays zero)
            rows[:, :C, H : H + Hkv].copy_(past[0].transpose(1, 2))  # [1, C, Hkv, D] over B
            rows[:, :C, H + Hkv :].copy_(past[1].transpose(1, 2))
            past = None
        heads = rows.transpose(1, 2)  # [B, H+2Hkv, W, D]
        k, v = heads[:, H : H + Hkv], heads[:, H + Hkv :]
        mask, read_mask = layout.windows.get(layer.kind.window, (layout.mask, layout.read_mask))
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
            out = _merge(out, lse, out_p.float().reshape(-1, H, D), lse_p.reshape(-1, H))
        out = out.reshape(-1, H * D)
        if keep is not None:
            return self._residual(h.index_select(0, keep), layer.o,
                                  out if read_only else out.index_select(0, keep), layer.post_attention)
        self._residual(h, layer.o, out, layer.post_attention)
        return k, v

    def _norm_qk(self, qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float) -> None:
        """RMSNorm of q and of k in place, over each head ([D] weights) or the whole projection ([n D])."""
        N, H, Hkv = qkv.shape[0], self.n_heads, self.n_kv
        for part, weight in ((qkv[:, :H], q_weight), (qkv[:, H : H + Hkv], k_weight)):
            flat = part if weight.numel() == self.head_dim else part.reshape(N, -1)  # a view either way
            flat.copy_(rms_norm(flat, eps).mul_(weight))

    def _residual(self, h: torch.Tensor, op: LinearOp, x: torch.Tensor, post: tuple | None) -> torch.Tensor:
        """h += post_norm(x @ w) * residual scale, in place; returns h. Without a post norm, the op
        adds itself (the int8 ops fuse the add into their dequantising pass, `torch.mm` the scale
        into its write-back)."""
        scale = self.residual_scale
        if post is None:
            return op.add_(h, x) if scale is None else op.add_scaled_(h, x, scale)
        y = rms_norm(op(x).float(), post[1]).mul_(post[0])
        return h.add_(y) if scale is None else h.add_(y, alpha=scale)

    def _conv_block(self, h, layer: _Layer, padded, layout: _Layout, past, keep: torch.Tensor | None = None,
                    rows: torch.Tensor | None = None):
        """h += out_proj(C * conv(B * x)) for [B | C | x] = in_proj(norm(h)) (LFM2's short convolution):
        each token's conv reads its K - 1 predecessors (`layout.conv_prev`). Returns the last K - 1
        inputs B * x [K-1, hidden] (the prefill keeps them as this layer's cache) and an empty tensor.
        With `keep` (packed indices, `_needed_rows`), h holds the packed tokens `rows` (None: all),
        among them `keep` and their predecessors, and the updated hidden states of `keep` only,
        [len(keep), hidden], are computed and returned instead."""
        lags = self.conv_taps - 1
        bcx = layer.qkv.normed(h, layer.eps) if layer.eps is not None else layer.qkv(h)  # [n, 3 hidden]
        b, c, x = bcx.float().chunk(3, dim=-1)
        bx = b * x  # [n, hidden]
        tail = past[0] if past is not None else bx.new_zeros(lags, bx.shape[1])
        pool = torch.cat([tail, bx])  # [K-1 + n, hidden]
        prev, here = layout.conv_prev, None  # indices into [tail; all packed tokens]
        if keep is not None:
            prev, here = prev.index_select(0, keep), keep
            if rows is not None:  # into [tail; h's rows]
                local = _local_index(rows, layout.source.numel())
                prev = torch.where(prev < lags, prev, lags + local[(prev - lags).clamp(min=0)])
                here = local[keep]
            bx, c, h = bx.index_select(0, here), c.index_select(0, here), h.index_select(0, here)
        taps = layer.conv  # [K, hidden]
        conv = bx * taps[lags]
        for lag in range(1, lags + 1):
            conv.addcmul_(pool.index_select(0, prev[:, lag - 1]), taps[lags - lag])
        if layer.conv_bias is not None:
            conv.add_(layer.conv_bias)
        y = c.mul_(conv)  # [n or len(keep), hidden]
        h = self._residual(h, layer.o, y, layer.post_attention)
        if keep is not None:
            return h
        last = pool[-lags:] if pool.shape[0] >= lags else pool
        return last.clone(), bx.new_empty(0)

    def _mlp_block(self, h, layer: _Layer) -> None:
        """h += [post_norm](down(act(gate(norm(h))) * up(norm(h)))) (* residual scale)."""
        normed = layer.mlp_eps is not None
        if self.silu:  # one op: the int8-fused op dequantises and multiplies in one pass
            act = layer.gate_up.normed_swiglu(h, layer.mlp_eps) if normed else swiglu_(layer.gate_up(h))
        else:
            gate, up = (layer.gate_up.normed(h, layer.mlp_eps) if normed else layer.gate_up(h)).chunk(2, dim=-1)
            act = self.act(gate).mul_(up)  # [N, I]
        self._residual(h, layer.down, act, layer.post_mlp)

    def _step_logprobs(self, read: torch.Tensor, trie: LabelTrie) -> torch.Tensor:
        """[B, 1+T, hidden] normed hidden states → [B, N_steps] log-probabilities of the trie steps."""
        B = read.shape[0]
        per_call = self.output_rows(trie)
        step_pos, step_token = trie.step_pos.to(self.device), trie.step_token.to(self.device)
        out = []
        rows = self.backend.invariant_rows("lm_head") or 1  # its batch-invariant path (`gemm.PaddedRows`)
        for start in range(0, B, per_call):
            chunk = read[start : start + per_call]  # [b, 1+T, hidden]
            if chunk.shape[0] * chunk.shape[1] < rows:
                pad = -(-rows // chunk.shape[1]) - chunk.shape[0]
                logits = self.lm_head(torch.cat([chunk, chunk.new_zeros(pad, *chunk.shape[1:])]))[: chunk.shape[0]]
            else:
                logits = self.lm_head(chunk)  # [b, 1+T, V]
            if self.logits_divisor is not None:
                logits = logits / self.logits_divisor
            if self.logit_softcap is not None:
                logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
            logprobs = torch.log_softmax(logits, dim=-1)
            out.append(logprobs[:, step_pos, step_token])  # [b, N_steps]
        return torch.cat(out)


def _local_index(rows: torch.Tensor, n: int) -> torch.Tensor:
    """[n] each packed token's index among `rows` (-1 where it is not one of them)."""
    local = torch.full((n,), -1, dtype=torch.long, device=rows.device)
    local[rows] = torch.arange(rows.numel(), device=rows.device)
    return local


def _setting(config, name: str | None) -> float | None:
    """A family's scale setting as a float; None where the family has none or it is 1."""
    value = None if name is None else getattr(config, name, None)
    return None if value is None or float(value) == 1.0 else float(value)


def _merge(out_a, lse_a, out_b, lse_b):
    """Attention over the union of two disjoint key sets from each set's output and log-sum-exp."""
    lse = torch.logaddexp(lse_a, lse_b)
    return out_a.mul_((lse_a - lse).exp_()[..., None]).addcmul_(out_b, (lse_b - lse).exp_()[..., None])


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool mask → additive mask in the attention's dtype (what the kernel adds to the scores),
    built once per batch, not per layer, on the batch's device."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))

