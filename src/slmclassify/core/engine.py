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

Only the item's last token and the trie nodes reach the output layer. The weights are the
Hugging Face model's own (Llama and Qwen2 share this layout), held ONCE: each linear weight is
stored here in [in, out] layout (q/k/v and gate/up concatenated) and the Hugging Face module's
`weight` becomes a transposed view of it, so the reference path computes with the very same
tensors. Arranging goes layer by layer, writing each arranged tensor block by block, and each
source tensor is freed when its module's weight is replaced, so the transient is about one layer
(the loaded weights are in memory of their own, not a file's memory map: `weights.py`). Each
RMSNorm weight is folded into the projections that read its output and the norm's own weight set
to one: the module computes the same function (checked when the engine is built) and the engine
saves a multiply per norm. The only copies are the q/k rows, which are interleaved per head so
that the rotary embedding is one complex multiplication (the module keeps q/k in its own order):
~13% of a layer's weights. `config_check.py` decides which configurations this code computes exactly.
`reference.py` runs the unmodified Hugging Face forward and is the oracle for this code.

Devices and precisions come from a `backends.Backend`: it makes the linear ops (MKL, oneDNN,
int8, bf16...) and runs the attention kernel; every index, mask and position tensor is created
on its device, and the residual stream, the norms and the output layer stay in float32.
"""

from __future__ import annotations

import copy

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..backends.device import Backend
from ..backends.gemm import LinearOp
from ..backends.smoothing import plan_layer
from .batching import Batch
from .config_check import check_config, head_dim
from .labels import LabelTrie

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
    """Per layer [1, H_kv, P, D], rotary already applied."""
    values: tuple[torch.Tensor, ...]
    """Per layer [1, H_kv, P, D]."""

    @property
    def length(self) -> int:
        return int(self.keys[0].shape[2]) if self.keys else 0


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
    eps: float


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


def _fold_norm(norm: torch.nn.Module, *linears: torch.nn.Linear) -> torch.Tensor:
    """Scale the input columns of the linears that read `norm`'s output by its weight (new
    tensors), set the weight to one and return the old one: norm(x) @ W.T = (x / rms(x)) @ (W * w).T,
    so the module's function is unchanged while the engine's norm is one multiply shorter. A
    second call finds weight one and changes nothing."""
    weight = norm.weight
    for lin in linears:
        lin.weight = torch.nn.Parameter(lin.weight * weight[None, :], requires_grad=False)
    norm.weight = torch.nn.Parameter(torch.ones_like(weight), requires_grad=False)
    return weight


def _shared_in_out(*linears: torch.nn.Linear, norm: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Linears that read the same input as one [in, sum(out)] weight, shared with them, with the
    weight `norm` [in] of the RMSNorm before them folded in (see `_fold_norm`).

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


def _interleave_into(out: torch.Tensor, weight: torch.Tensor, head_dim: int) -> None:
    """Write q or k rows `weight` [n D, in] into `out` [in, n D] with each head's halves
    (i, i + D/2) made adjacent pairs (2i, 2i + 1), through strided views (no temporary)."""
    n, half = weight.shape[0] // head_dim, head_dim // 2
    pairs = out.view(out.shape[0], n, half, 2)  # [in, head, i, j]: column h D + 2i + j
    halves = weight.view(n, 2, half, weight.shape[1])  # [head, j, i, in]: row h D + j D/2 + i
    for j in (0, 1):
        pairs[..., j].copy_(halves[:, j].permute(2, 0, 1))


class Engine:
    """Scores label tries for batches of items, reusing one prefix cache."""

    def __init__(self, model: torch.nn.Module, backend: Backend | None = None,
                 ranges: Callable[[Engine], list[dict[str, torch.Tensor]]] | None = None):
        """`ranges` (int8 backends): given this engine computing in float32, each layer's max |x| per
        input channel of its ops {"qkv", "o", "gate_up", "down"} (`models/activation_ranges.py`), from
        which the int8 ops are smoothed (`backends/smoothing.py`). Without it int8 is not smoothed."""
        self.backend = backend or Backend(device=model.device, precision="fp32", gemm="mm")
        self.device, self.dtype = self.backend.device, self.backend.dtype
        base = model.model
        cfg = model.config
        check_config(cfg)
        self.embed = base.embed_tokens
        self.rotary = base.rotary_emb
        self.final_norm = base.norm
        self.lm_head = model.lm_head
        self.head_dim = head_dim(cfg)
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads or cfg.num_attention_heads
        # The model's own activation module (transformers' ACT2FN), so any hidden_act is exact;
        # SiLU, the common one, runs in place.
        self.act = base.layers[0].mlp.act_fn if len(base.layers) else None
        self.silu = getattr(cfg, "hidden_act", "silu") in ("silu", "swish")
        probe = torch.arange(min(8, cfg.vocab_size))[None]  # [1, 8] any ids: the function must not change
        with torch.inference_mode():
            before = model(input_ids=probe, logits_to_keep=1).logits
        with torch.no_grad():
            arranged = [self._arrange(layer) for layer in base.layers]
        with torch.inference_mode():
            after = model(input_ids=probe, logits_to_keep=1).logits
        # Sharing and folding only re-associate float32 products (logits move by ~5e-4 on
        # SmolLM2-135M, whose logits reach ~30); a wrong arrangement moves them by units.
        assert torch.allclose(after, before, rtol=1e-3, atol=1e-3), float((after - before).abs().max())
        # A low-precision engine keeps the arranged float32 weights (shared with the model's modules,
        # except the interleaved q/k copy) so that `exact()` can compute in float32 without arranging again.
        self._arranged = arranged if self.backend.precision != "fp32" else None
        plans = [None] * len(arranged)
        if ranges is not None and self.backend.smooths:  # recorded in float32, on the same tensors
            plans = [plan_layer(r, w["qkv"][0], w["o"][0], w["gate_up"][0], w["down"][0],
                                self.n_heads, self.n_kv, self.head_dim)
                     for r, w in zip(ranges(self.exact()), arranged)]
        self.layers = [self._ops(weights, self.backend, plan) for weights, plan in zip(arranged, plans)]

    def exact(self) -> Engine:
        """This engine computing in float32 with the exact `mm` kernel, on the same weights (no copy):
        itself when it already is; for a low precision, what calibration is measured with."""
        if self._arranged is None:
            return self
        exact = copy.copy(self)
        exact.backend = Backend(device=self.device, precision="fp32", gemm="mm")
        exact.dtype = exact.backend.dtype
        exact.layers = [self._ops(weights, exact.backend) for weights in self._arranged]
        exact._arranged = None
        return exact

    @staticmethod
    def _ops(weights: dict, backend: Backend, plan: dict | None = None) -> _Layer:
        """One layer's linear ops from its arranged weights (`_arrange`), smoothed by `plan` (int8)."""
        plan = plan or {}
        ops = {name: backend.linear(*weights[name], smooth=plan.get(name)) for name in ("qkv", "o", "gate_up", "down")}
        return _Layer(**ops, eps=weights["eps"])

    def _arrange(self, layer: torch.nn.Module) -> dict:
        """Arrange one layer's weights [in, out], sharing them with the module (see `_share`):
        {"qkv", "o", "gate_up", "down": (weight [in, out], bias or None), "eps": float}."""
        attn, mlp = layer.self_attn, layer.mlp
        rotated = (self.n_heads + self.n_kv) * self.head_dim
        order = self._rotary_order().to(attn.q_proj.weight.device)
        q, k, v = attn.q_proj, attn.k_proj, attn.v_proj
        # The module keeps q/k in its own order (folded copies); the engine's are interleaved.
        norm = _fold_norm(layer.input_layernorm, q, k)
        qkv = torch.empty(q.weight.shape[1], rotated + v.weight.shape[0], device=q.weight.device)  # [hidden, (H + 2 H_kv) D]
        _interleave_into(qkv[:, : q.weight.shape[0]], q.weight, self.head_dim)
        _interleave_into(qkv[:, q.weight.shape[0] : rotated], k.weight, self.head_dim)
        qkv[:, rotated:].copy_(v.weight.t()).mul_(norm[:, None])
        _share((v,), qkv[:, rotated:])
        qkv_bias = None
        if q.bias is not None:
            qkv_bias = torch.cat([torch.cat([q.bias, k.bias])[order], v.bias])
            v.bias = torch.nn.Parameter(qkv_bias[rotated:], requires_grad=False)
        o, o_bias = _shared_in_out(attn.o_proj)
        post = layer.post_attention_layernorm
        gate_up, gate_up_bias = _shared_in_out(mlp.gate_proj, mlp.up_proj, norm=post.weight)
        post.weight = torch.nn.Parameter(torch.ones_like(post.weight), requires_grad=False)
        down, down_bias = _shared_in_out(mlp.down_proj)
        # the backend's kernel (mm computes with these very tensors, others copy them)
        return {"qkv": (qkv, qkv_bias), "o": (o, o_bias), "gate_up": (gate_up, gate_up_bias),
                "down": (down, down_bias), "eps": layer.input_layernorm.variance_epsilon}

    def _rotary_order(self) -> torch.Tensor:
        """Row order of the concatenated q/k weights: each head's rows from halves (i, i + D/2)
        to adjacent pairs (2i, 2i + 1).

        Rotary embedding then is one complex multiplication per pair. Scores q·k are sums over
        the head dimension, so permuting it the same way in q and k changes nothing (V is untouched).
        """
        D, half = self.head_dim, self.head_dim // 2
        pairs = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).reshape(-1)  # [D]
        return (torch.arange(self.n_heads + self.n_kv)[:, None] * D + pairs[None]).reshape(-1)

    @torch.inference_mode()
    def prefill(self, prefix_ids: list[int]) -> PrefixCache:
        """Run the prefix once and keep every layer's keys and values."""
        P, dev = len(prefix_ids), self.device
        everything = torch.arange(P, device=dev)
        layout = _Layout(B=1, W=P, source=everything, index=everything, read=torch.tensor([[P - 1]], device=dev),
                         positions=everything, mask=None,
                         read_mask=torch.zeros(1, 1, 1, P, dtype=self.dtype, device=dev))
        keys, values = [], []
        self._layers(torch.tensor(prefix_ids, device=dev), layout, None, keys, values)
        return PrefixCache(keys=tuple(keys), values=tuple(values))

    @torch.inference_mode()
    def score(self, batch: Batch, prefix: PrefixCache | None, trie: LabelTrie, taps: tuple[int, ...] = ()):
        """[B, L] label scores of every row (mode of `trie`).

        With `taps` (layer numbers as in Hugging Face's `hidden_states`: 1 .. n_layers, the last one
        after the final norm), returns (scores, [B, len(taps), hidden] states at each row's last item
        token), read from the same forward (the head's features, `head/`).
        """
        prefix = prefix if (batch.cached and prefix is not None and prefix.length) else None
        layout = self._layout(batch, trie, prefix.length if prefix else 0)
        B = batch.input_ids.shape[0]
        ids = torch.cat([batch.input_ids.to(self.device, non_blocking=True),
                         trie.node_tokens.to(self.device).expand(B, -1)], dim=1)  # [B, S+T], left-padded
        states = [] if taps else None
        read = self.final_norm(self._layers(ids.reshape(-1)[layout.source], layout, prefix, states=states))
        scores = trie.score(self._step_logprobs(read, trie).float().cpu())  # read: [B, 1+T, hidden]
        if not taps:
            return scores
        states.append(read[:, 0])
        return scores, torch.stack([states[t - 1] for t in taps], dim=1).float().cpu()

    def _layout(self, batch: Batch, trie: LabelTrie, n_prefix: int) -> _Layout:
        dev = self.device
        lengths = batch.lengths.to(dev)[:, None]  # [B, 1]
        B, S = batch.input_ids.shape
        T = trie.n_nodes
        # With the prefix inline (wide rows), each padded row starts with C prefix columns:
        #     [ p p p | s s s s n1 n2 . . ]    the p queries are dummies (zero, never read)
        # and plain top-left causal attention then gives every real query the prefix too.
        C = n_prefix if n_prefix and S >= _INLINE_PREFIX_RATIO * n_prefix else 0
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
        return _Layout(B=B, W=W, source=source, index=index, read=read,
                       positions=positions.reshape(-1)[index],
                       mask=_additive(allowed[:, None], self.dtype) if T else None,
                       read_mask=_additive(read_allowed[:, None], self.dtype), prefix_cols=C,
                       starts=(torch.cumsum(per_row, 0) - per_row).long(), lengths=lengths[:, 0].long().contiguous(),
                       ancestors=trie.ancestors.to(device=dev, dtype=torch.uint8).contiguous() if T else None)

    def _layers(self, ids: torch.Tensor, layout: _Layout, prefix: PrefixCache | None,
                keys: list | None = None, values: list | None = None, states: list | None = None) -> torch.Tensor:
        """Embed the packed ids and run every decoder layer.

        Returns [B, 1+T, hidden] (before the final norm) at the read positions: the last layer
        computes its attention queries and MLP only there. With `keys` given (the prefill), every
        layer's keys and values are collected and nothing is read. With `states` given, every layer
        but the last appends its output at each row's last item token, [B, hidden].
        """
        h = self.embed(ids)  # [N, hidden]
        cos, sin = self.rotary(h[None], layout.positions[None])  # [1, N, D] each
        half = self.head_dim // 2
        # HF's cos/sin repeat one half twice; as complex numbers: [N, 1, D/2]
        cis = torch.complex(cos[0, :, None, :half].contiguous(), sin[0, :, None, :half].contiguous())
        # q/k/v in the padded layout, shared by all layers: only real rows are ever written, so
        # the pad rows stay zero (a pad key is masked or after every real query, a pad query is
        # never read, and zeros keep their products finite). None: the backend's C kernel attends
        # on the packed rows themselves (scoring only; the prefill collects padded keys).
        padded = None
        if keys is not None or layout.starts is None or not self.backend.packs_attention(self.head_dim):
            padded = h.new_zeros(layout.B * layout.W, self.n_heads + 2 * self.n_kv, self.head_dim, dtype=self.dtype)
        last = len(self.layers) - 1 if keys is None else None
        for i, layer in enumerate(self.layers):
            past = None if prefix is None else (prefix.keys[i], prefix.values[i])
            if i == last:
                h = self._attention_block(h, layer, cis, padded, layout, past, read_only=True)  # [B*(1+T), hidden]
                self._mlp_block(h, layer)
                return h.view(layout.B, -1, h.shape[-1])
            k, v = self._attention_block(h, layer, cis, padded, layout, past)
            if keys is not None:
                keys.append(k.clone(memory_format=torch.contiguous_format))  # views of `padded`, which the next layer overwrites
                values.append(v.clone(memory_format=torch.contiguous_format))
            self._mlp_block(h, layer)
            if states is not None:
                states.append(h.index_select(0, layout.read[:, 0]))
        return h

    def _attention_block(self, h, layer: _Layer, cis, padded, layout: _Layout, past, read_only: bool = False):
        """h += attention(norm(h)); returns this block's [B, H_kv, W, D] keys and values.

        Attention to the shared prefix and attention within each row run as two flash-attention
        calls, merged with their log-sum-exps: the prefix part is one dense product for all
        queries of the batch (no copies of the prefix per row, no mask), the row part is causal.
        Rows much wider than the prefix (`layout.prefix_cols`) take it inline instead: one call.
        With `read_only`, queries are computed at the read positions only, and the updated hidden
        states of those positions, [B*(1+T), hidden], are returned instead.
        """
        N = h.shape[0]
        H, Hkv, D = self.n_heads, self.n_kv, self.head_dim
        attend = self.backend.attend
        qkv = layer.qkv.normed(h, layer.eps).float().view(N, H + 2 * Hkv, D)  # [N, H+2Hkv, D]; rotary in float32
        qk = torch.view_as_complex(qkv[:, : H + Hkv].unflatten(-1, (D // 2, 2)))  # [N, H+Hkv, D/2]
        qk.mul_(cis)  # rotary embedding, in place (rows interleaved at load time)
        qkv = qkv.to(self.dtype)  # attention's precision (a no-op in float32)
        if padded is None:  # one C pass per (row, KV head) over the packed rows, the prefix included
            prefix_kv = None if past is None else (past[0][0].contiguous(), past[1][0].contiguous())  # [Hkv, P, D]
            out = self.backend.attend_packed(qkv.contiguous(), H, layout.starts, layout.lengths, layout.ancestors,
                                             prefix_kv, read_only).view(-1, H * D)  # [N or B*(1+T), H D]
            if read_only:
                return layer.o.add_(h.index_select(0, layout.read.reshape(-1)), out)
            layer.o.add_(h, out)
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
        q = qkv[:, :H]  # [N, H, D] packed
        if read_only:
            q = q.index_select(0, layout.read.reshape(-1))  # [R, H, D]
            out, lse = attend(q.view(layout.B, -1, H, D).transpose(1, 2), k, v, mask=layout.read_mask)
            out, lse = out.reshape(-1, H, D), lse.reshape(-1, H)  # [R, H, D], [R, H]
        else:
            out, lse = attend(heads[:, :H], k, v, mask=layout.mask, lower=True)
            out = out.reshape(-1, H, D).index_select(0, layout.index)  # [N, H, D]
            if past is not None:
                lse = lse.reshape(-1, H).index_select(0, layout.index)  # [N, H]
        out = out.float()  # merged and projected from float32 (a no-op in float32)
        if past is not None:
            out_p, lse_p = attend(q[None].transpose(1, 2), *past, mask=None, causal=False)  # all rows at once
            out = _merge(out, lse, out_p.float().reshape(-1, H, D), lse_p.reshape(-1, H))
        out = out.reshape(-1, H * D)
        if read_only:
            return layer.o.add_(h.index_select(0, layout.read.reshape(-1)), out)
        layer.o.add_(h, out)
        return k, v

    def _mlp_block(self, h, layer: _Layer) -> None:
        """h += down(act(gate(norm(h))) * up(norm(h)))."""
        if self.silu:  # one op: the int8-fused op dequantises and multiplies in one pass
            layer.down.add_(h, layer.gate_up.normed_swiglu(h, layer.eps))
            return
        gate, up = layer.gate_up.normed(h, layer.eps).chunk(2, dim=-1)  # [N, I] each
        layer.down.add_(h, self.act(gate).mul_(up))

    def _step_logprobs(self, read: torch.Tensor, trie: LabelTrie) -> torch.Tensor:
        """[B, 1+T, hidden] normed hidden states → [B, N_steps] log-probabilities of the trie steps."""
        B, n_pos, _ = read.shape
        vocab = self.lm_head.out_features
        per_call = max(1, _LOGITS_CHUNK // (n_pos * vocab))
        step_pos, step_token = trie.step_pos.to(self.device), trie.step_token.to(self.device)
        out = []
        for start in range(0, B, per_call):
            logprobs = torch.log_softmax(self.lm_head(read[start : start + per_call]), dim=-1)  # [b, 1+T, V]
            out.append(logprobs[:, step_pos, step_token])  # [b, N_steps]
        return torch.cat(out)


def _merge(out_a, lse_a, out_b, lse_b):
    """Attention over the union of two disjoint key sets from each set's output and log-sum-exp."""
    lse = torch.logaddexp(lse_a, lse_b)
    return out_a.mul_((lse_a - lse).exp_()[..., None]).addcmul_(out_b, (lse_b - lse).exp_()[..., None])


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool mask → additive mask in the attention's dtype (what the kernel adds to the scores),
    built once per batch, not per layer, on the batch's device."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))

