"""The forward of the fast path (`Engine`): the model's decoder layers over a batch of items that
continue a prefix whose keys and values were computed once (`prefill`), plus the label-trie nodes,
in one pass, on the weights `arrange.py` arranged at load and in the layout `layout.py` built for
the batch.

Projections, MLP and norms run on the packed tokens; attention (`attention.py`) runs on the packed
rows where the backend can, else in the padded layout, in the two parts drawn in the package's
docstring, merged by their log-sum-exps. Part 1 is one dense
product for all queries of the batch (no copies of the prefix per row, no mask). Without trie
nodes (first-token scoring, single-token labels) part 2 is plain causal attention without a mask,
whose kernel skips the blocks above the diagonal; with nodes it takes a mask. Rows much wider than
the prefix take it inline instead, in one call (`Layout.prefix_cols`).

Only the item's last token and the trie nodes reach the output layer (`read_states`; the scorer
stacks several batches' for one `label_scores` call, which reads the vocabulary's weights once).
What differs between model families (norm placement, q/k norms, scales, sliding windows, no-rotary
layers, fused projections, LFM2's short convolutions) is read from the family's description
(`core/families.py`); the code below follows it. `core/config_check.py` decides which
configurations this code computes exactly; `core/reference.py` runs the unmodified Hugging Face
forward and is the oracle for this code.

Devices and precisions come from a `backends.Backend`: it makes the linear ops and runs the
attention kernels; the residual stream, the norms and the output layer stay in float32.
"""

from __future__ import annotations

import copy

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...backends.device import Backend
from ...backends.gemm import LinearOp, rms_norm, swiglu_
from ...errors import FieldError
from ..batching import Batch
from ..config_check import check_config, head_dim
from ..families import family_of, layer_kinds
from ..labels import LabelTrie
from ..taps import Taps
from .arrange import Heads, Layer, arrange_model, layer_ops, smoothing_plan
from .attention import attend_packed_rows, attend_padded
from .layout import Layout, Pool, batch_layout, local_index, pool_tokens, prefill_layout

# Cap on the [rows, positions, vocab] logits tensor per output-layer call (floats).
_LOGITS_CHUNK = 1 << 24


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


class Engine:
    """Scores label tries for batches of items, reusing one prefix cache."""

    def __init__(self, model: torch.nn.Module, backend: Backend | None = None,
                 ranges: Callable[[Engine], list[dict[str, torch.Tensor]]] | None = None):
        """`ranges` (int8 backends): given this engine computing in float32, each layer's max |x| per
        input channel of its ops {"qkv", "o", "gate_up", "down"} (`models/activation_ranges.py`), from
        which the int8 ops are smoothed (`backends/smoothing.py`). Without it int8 is not smoothed."""
        from transformers.activations import ACT2FN

        self.backend = backend or Backend.exact(model.device)
        self.device, self.dtype = self.backend.device, self.backend.dtype
        base = model.model
        cfg = model.config
        check_config(cfg)
        self.family = family = family_of(cfg)
        self.kinds = layer_kinds(cfg)
        self.embed = base.embed_tokens
        self.rotary = getattr(base, "rotary_emb", None)
        self.final_norm = getattr(base, family.final_norm)
        self.lm_head = self.backend.output_layer(model.lm_head.weight, model.lm_head.bias)
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
        self.act, self.act_name = ACT2FN[act], act
        self.silu = act in ("silu", "swish")
        self.rope_keys = sorted({k.rope for k in self.kinds if k.mixer == "attention" and k.rope is not None})
        self.rotary_dim = self._rotary_dim()
        self.conv_taps = int(cfg.conv_L_cache) if any(k.mixer == "conv" for k in self.kinds) else 0
        self.windows = sorted({k.window for k in self.kinds if k.window})
        self.linear_params = sum(m.weight.numel() for layer in base.layers for m in layer.modules()
                                 if isinstance(m, torch.nn.Linear))
        heads = Heads(n_heads=self.n_heads, n_kv=self.n_kv, head_dim=self.head_dim, rotary_dim=self.rotary_dim,
                      q_factor=self.q_factor)
        arranged = arrange_model(model, self.kinds, family, heads)
        # A low-precision engine keeps the arranged float32 weights (shared with the model's modules,
        # except the interleaved q/k copy) so that `exact()` can compute in float32 without arranging again.
        self._arranged = arranged if self.backend.precision != "fp32" else None
        plans = [None] * len(arranged)
        if ranges is not None and self.backend.smooths:  # recorded in float32, on the same tensors
            plans = [smoothing_plan(r, w, heads) for r, w in zip(ranges(self.exact()), arranged)]
        self.layers = [layer_ops(weights, self.backend, plan) for weights, plan in zip(arranged, plans)]

    def batch_variance(self) -> str | None:
        """Why an item's scores could differ in their last bits with the batch it runs in; None: they
        cannot. The ordered GEMM sums every element in one fixed order (`Backend.gemm_variance`), the
        output layer's log-sum-exp too (`Backend.log_softmax`); attention computes each row alone only
        on the packed rows (`Backend.packs_attention`), while the padded layout's kernels reduce over the
        padded row length. Norms, rotary, SwiGLU and the short convolution compute each token alone;
        another activation runs in torch's elementwise kernels, whose vector loop and scalar tail
        (split where the threads' shares of a tensor end) may round one element two ways."""
        if (why := self.backend.gemm_variance()) is not None:
            return why
        if not self.silu:
            return f"the model's activation ({self.act_name}) runs in torch's elementwise kernels"
        if self.logit_softcap is not None:
            return "the output layer's soft cap (tanh) runs in torch's elementwise kernels"
        if not self.backend.packs_attention(self.head_dim):
            return "torch's attention kernel reduces over the batch's padded row length"
        if self.windows:
            return "sliding-window layers attend in the padded layout"
        return None

    @property
    def batch_invariant(self) -> bool:
        return self.batch_variance() is None

    def weight_copy_bytes(self) -> int:
        """Memory the GEMM kernel keeps beside the float32 weights the model's modules share
        (`Backend.copy_bytes_per_weight`)."""
        return self.backend.copy_bytes_per_weight * self.linear_params

    def exact(self) -> Engine:
        """This engine computing in float32 with the exact kernel (`Backend.exact`), on the same weights
        (no copy): itself when it already is; for a low precision, what calibration is measured with."""
        if self._arranged is None:
            return self
        exact = copy.copy(self)
        exact.backend = Backend.exact(self.device, invariant=self.backend.invariant)
        exact.dtype = exact.backend.dtype
        exact.layers = [layer_ops(weights, exact.backend) for weights in self._arranged]
        exact._arranged = None
        return exact

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

    @torch.inference_mode()
    def prefill(self, prefix_ids: list[int]) -> PrefixCache:
        """Run the prefix once and keep every layer's keys and values."""
        P = len(prefix_ids)
        layout = prefill_layout(P, self.device, self.dtype, self.windows, self.conv_taps)
        keys, values = [], []
        self._layers(torch.tensor(prefix_ids, device=self.device), layout, None, keys, values)
        return PrefixCache(keys=tuple(keys), values=tuple(values), tokens=P)

    @torch.inference_mode()
    def score(self, batch: Batch, prefix: PrefixCache | None, trie: LabelTrie) -> torch.Tensor:
        """[B, L] label scores of every row (mode of `trie`): `read_states`, then `label_scores`
        (a scorer stacks several batches' read states for one `label_scores` call instead)."""
        return self.label_scores(self.read_states(batch, prefix, trie)[0], trie)

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
        pool = pool_tokens(layout, trie, n_prefix, pool_from, taps.mean) if taps.mean else None
        read = self.final_norm(self._layers(ids.reshape(-1)[layout.source], layout, prefix, states=states, pool=pool))
        if not taps:
            return read, None
        states.append(read[:, 0])
        tapped = [states[t - 1] for t in taps.last] + [pool.means[t] for t in taps.mean]
        return read, torch.stack(tapped, dim=1).float().cpu()

    @torch.inference_mode()
    def label_scores(self, read: torch.Tensor, trie: LabelTrie) -> torch.Tensor:
        """[R, 1+T, hidden] read states (`read_states`, of one batch or several stacked) → [R, L]
        float32 label scores on the CPU."""
        return trie.score(self._step_logprobs(read, trie).float().cpu())

    def output_rows(self, trie: LabelTrie) -> int:
        """Rows per output-layer call (`_LOGITS_CHUNK`): how many read states `label_scores` takes
        at once at no more memory; fewer read the output layer's weights for fewer rows."""
        return max(1, _LOGITS_CHUNK // ((1 + trie.n_nodes) * self.lm_head.out_features))

    def _layout(self, batch: Batch, trie: LabelTrie, n_prefix: int) -> Layout:
        """The batch's layout (`batch_layout`) for this engine: its device, attention dtype, sliding
        windows and convolution taps."""
        return batch_layout(batch, trie, n_prefix, self.device, self.dtype, self.windows, self.conv_taps)

    def _layers(self, ids: torch.Tensor, layout: Layout, prefix: PrefixCache | None,
                keys: list | None = None, values: list | None = None, states: list | None = None,
                pool: Pool | None = None) -> torch.Tensor:
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
        # never read, and zeros keep their products finite). None: the backend attends on the
        # packed rows themselves (`Backend.attend_packed`; scoring only: the prefill collects padded keys).
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
                at = layout.read[:, 0] if rows is None else local_index(rows, layout.source.numel())[layout.read[:, 0]]
                states.append(h.index_select(0, at))
            if pool is not None and i + 1 in pool.layers:
                sums = h.new_zeros(layout.B, h.shape[-1], dtype=torch.float32)
                pool.means[i + 1] = sums.index_add_(0, pool.rows, h.index_select(0, pool.tokens).float()) / pool.counts
        return h.view(layout.B, -1, h.shape[-1]) if keys is None else h

    def _needed_rows(self, layout: Layout) -> list:
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

    def _attention_block(self, h, layer: Layer, cis, padded, layout: Layout, past, keep: torch.Tensor | None = None,
                         read_only: bool = False):
        """h += attention(norm(h)); returns this block's [B, H_kv, W, D] keys and values (None, None
        on the packed rows). The attention runs in the layout the batch takes (`attention.py`): on
        the packed rows (`padded` None) or in the padded layout. With `keep` (packed indices,
        `_needed_rows`), the updated hidden states of those tokens only, [len(keep), hidden], are
        returned instead; with `read_only` too, `keep` is the read positions and the queries are
        computed there only.
        """
        N, H, Hkv, D = h.shape[0], self.n_heads, self.n_kv, self.head_dim
        qkv = (layer.qkv.normed(h, layer.eps) if layer.eps is not None else layer.qkv(h)).float()
        qkv = qkv.view(N, H + 2 * Hkv, D)  # [N, H+2Hkv, D]; q/k norms and rotary in float32
        if layer.qk_norm is not None:
            self._norm_qk(qkv, *layer.qk_norm)
        if layer.kind.rope is not None:
            qk = torch.view_as_complex(qkv[:, : H + Hkv].unflatten(-1, (D // 2, 2)))  # [N, H+Hkv, D/2]
            rope = cis[layer.kind.rope]
            (qk if rope.shape[-1] == D // 2 else qk[..., : rope.shape[-1]]).mul_(rope)  # in place (rows interleaved at load time)
        qkv = qkv.to(self.dtype)  # attention's precision (a no-op in float32)
        if padded is None:
            out, kv = attend_packed_rows(self.backend, qkv, H, layout, past, read_only), (None, None)
        else:
            out, kv = attend_padded(self.backend, qkv, padded, layout, layer.kind.window, past, H, Hkv, read_only)
        if keep is not None:  # read_only: `out` is at `keep` already
            return self._residual(h.index_select(0, keep), layer.o,
                                  out if read_only else out.index_select(0, keep), layer.post_attention)
        self._residual(h, layer.o, out, layer.post_attention)
        return kv

    def _norm_qk(self, qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float) -> None:
        """RMSNorm of q and of k in place, over each head ([D] weights) or the whole projection ([n D])."""
        N, H, Hkv = qkv.shape[0], self.n_heads, self.n_kv
        for part, weight in ((qkv[:, :H], q_weight), (qkv[:, H : H + Hkv], k_weight)):
            flat = part if weight.numel() == self.head_dim else part.reshape(N, -1)  # a view either way
            flat.copy_(rms_norm(flat, eps).mul_(weight))

    def _residual(self, h: torch.Tensor, op: LinearOp, x: torch.Tensor, post: tuple | None) -> torch.Tensor:
        """h += post_norm(x @ w) * residual scale, in place; returns h. Without a post norm, the op
        adds itself (`LinearOp.add_`, `LinearOp.add_scaled_`: a kernel can fuse the add and the scale
        into the pass that writes its output)."""
        scale = self.residual_scale
        if post is None:
            return op.add_(h, x) if scale is None else op.add_scaled_(h, x, scale)
        y = rms_norm(op(x).float(), post[1]).mul_(post[0])
        return h.add_(y) if scale is None else h.add_(y, alpha=scale)

    def _conv_block(self, h, layer: Layer, padded, layout: Layout, past, keep: torch.Tensor | None = None,
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
                local = local_index(rows, layout.source.numel())
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

    def _mlp_block(self, h, layer: Layer) -> None:
        """h += [post_norm](down(act(gate(norm(h))) * up(norm(h)))) (* residual scale)."""
        normed = layer.mlp_eps is not None
        if self.silu:  # one op (`LinearOp.normed_swiglu`): a kernel can fuse it into the pass that writes its output
            act = layer.gate_up.normed_swiglu(h, layer.mlp_eps) if normed else swiglu_(layer.gate_up(h))
        else:
            gate, up = (layer.gate_up.normed(h, layer.mlp_eps) if normed else layer.gate_up(h)).chunk(2, dim=-1)
            act = self.act(gate).mul_(up)  # [N, I]
        self._residual(h, layer.down, act, layer.post_mlp)

    def _step_logprobs(self, read: torch.Tensor, trie: LabelTrie) -> torch.Tensor:
        """[B, 1+T, hidden] normed hidden states → [B, N_steps] log-probabilities of the trie steps."""
        step_pos, step_token = trie.step_pos.to(self.device), trie.step_token.to(self.device)
        return torch.cat([logprobs[:, step_pos, step_token] for logprobs in self._logprobs(read, trie)])

    @torch.inference_mode()
    def read_logprobs(self, read: torch.Tensor, trie: LabelTrie, top: int):
        """[B, 1+T, hidden] read states → ([B, N_steps] log-probabilities of the trie steps, and at
        every read position the `top` likeliest tokens' log-probabilities and ids, [B, 1+T, top]
        each), float32 / int64 numpy: a completion's prompt log-probabilities (`wire/completions.py`)."""
        step_pos, step_token = trie.step_pos.to(self.device), trie.step_token.to(self.device)
        steps, values, ids = [], [], []
        for logprobs in self._logprobs(read, trie):
            steps.append(logprobs[:, step_pos, step_token])
            best = logprobs.topk(top, dim=-1) if top else None
            values.append(best.values if best else logprobs.new_zeros(*logprobs.shape[:2], 0))
            ids.append(best.indices if best else logprobs.new_zeros(*logprobs.shape[:2], 0, dtype=torch.long))
        return (torch.cat(steps).float().cpu().numpy(), torch.cat(values).float().cpu().numpy(),
                torch.cat(ids).cpu().numpy())

    def _logprobs(self, read: torch.Tensor, trie: LabelTrie):
        """[b, 1+T, V] log-softmax of the output layer at the read positions, a chunk of rows at a time
        (`output_rows`)."""
        B = read.shape[0]
        per_call = self.output_rows(trie)
        for start in range(0, B, per_call):
            chunk = read[start : start + per_call]  # [b, 1+T, hidden]
            logits = self.lm_head(chunk.reshape(-1, chunk.shape[-1])).view(*chunk.shape[:2], -1)  # [b, 1+T, V]
            if self.logits_divisor is not None:
                logits = logits / self.logits_divisor
            if self.logit_softcap is not None:
                logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
            yield self.backend.log_softmax(logits)


def _setting(config, name: str | None) -> float | None:
    """A family's scale setting as a float; None where the family has none or it is 1."""
    value = None if name is None else getattr(config, name, None)
    return None if value is None or float(value) == 1.0 else float(value)

