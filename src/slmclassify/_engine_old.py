"""The fast path: the model's decoder layers over a batch of items that continue a prefix
whose keys and values were computed once, plus the label-trie nodes, in one forward pass.

A batch arrives left-padded ([B, S], `batching.py`). The label-trie nodes are appended to every
row, giving a padded layout of width W = S + T. Attention runs in that padded layout; everything
else (projections, MLP, norms: ~90% of the arithmetic) runs on the *packed* real tokens only,
so padding costs attention work and nothing more.

    padded row:  [ . . s s s s | n1 n2 ]        . = pad, s = item token, n = trie node
    keys seen:   [ p p p p ] + the row above     p = cached prefix (P tokens)
    positions:     0 .. P-1    P .. P+3 | P+4+depth-1
    query s_i sees: every prefix key, the row's real suffix keys up to itself (causal)
    query n_t sees: every prefix key, every real suffix key, its trie ancestors and itself
    query .   sees: prefix keys and itself (its output is never read)

Only the item's last token and the trie nodes reach the output layer. The weights are the
Hugging Face model's own (Llama and Qwen2 share this layout), re-arranged once: q/k/v and
gate/up projections concatenated, RMSNorm weights folded into the projection that follows, and
each q/k head's rows interleaved so that the rotary embedding is one complex multiplication.
`reference.py` runs the unmodified Hugging Face forward and is the oracle for this code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .batching import Batch
from .labels import LabelTrie

# Cap on the [rows, positions, vocab] logits tensor per output-layer call (floats).
_LOGITS_CHUNK = 1 << 24


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
    """One decoder layer's weights, re-arranged for the packed forward."""

    qkv: torch.Tensor  # [(H + 2 H_kv) D, hidden], input RMSNorm weight folded in
    qkv_bias: torch.Tensor | None  # [(H + 2 H_kv) D] (Qwen2) or None (Llama)
    o: torch.Tensor  # [hidden, H D]
    gate_up: torch.Tensor  # [2 I, hidden], post-attention RMSNorm weight folded in
    down: torch.Tensor  # [hidden, I]
    eps: float


@dataclass(frozen=True)
class _Layout:
    """Where a batch's real tokens sit in its padded [B, W] layout."""

    B: int
    W: int
    index: torch.Tensor  # [N] flat positions (into B*W) of the real tokens, row-major
    row: torch.Tensor  # [N] index // W: the row of each real token
    col: torch.Tensor  # [N] index % W: its column in the padded layout
    read: torch.Tensor  # [B, 1+T] packed indices of each row's last item token and its trie nodes
    positions: torch.Tensor  # [N] rotary position of each real token
    mask: torch.Tensor  # [B, 1, W, P+W] additive: 0 = may attend, -inf = may not


def _fold(norm: torch.nn.Module, *linears: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate linears that read the same normed input, scaling their columns by the norm weight."""
    weight = torch.cat([lin.weight for lin in linears]) * norm.weight[None, :]
    biases = [lin.bias for lin in linears]
    bias = torch.cat(biases) if all(b is not None for b in biases) else None
    return weight.contiguous(), bias


class Engine:
    """Scores label tries for batches of items, reusing one prefix cache."""

    def __init__(self, model: torch.nn.Module):
        base = model.model
        cfg = model.config
        self.embed = base.embed_tokens
        self.rotary = base.rotary_emb
        self.final_norm = base.norm
        self.lm_head = model.lm_head
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.scale = self.head_dim**-0.5
        with torch.no_grad():
            self.layers = []
            for layer in base.layers:
                attn, mlp = layer.self_attn, layer.mlp
                qkv, qkv_bias = _fold(layer.input_layernorm, attn.q_proj, attn.k_proj, attn.v_proj)
                qkv, qkv_bias = self._interleave_rotary_rows(qkv, qkv_bias)
                gate_up, _ = _fold(layer.post_attention_layernorm, mlp.gate_proj, mlp.up_proj)
                self.layers.append(_Layer(
                    qkv=qkv, qkv_bias=qkv_bias, o=attn.o_proj.weight, gate_up=gate_up,
                    down=mlp.down_proj.weight, eps=layer.input_layernorm.variance_epsilon,
                ))

    def _interleave_rotary_rows(self, qkv: torch.Tensor, bias: torch.Tensor | None):
        """Reorder each q/k head's rows from halves (i, i + D/2) to adjacent pairs (2i, 2i + 1).

        Rotary embedding then is one complex multiplication per pair. Scores q·k are sums over
        the head dimension, so permuting it the same way in q and k changes nothing (V is untouched).
        """
        D, half = self.head_dim, self.head_dim // 2
        pairs = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).reshape(-1)  # [D]
        rotated = (self.n_heads + self.n_kv) * D
        order = torch.cat([
            (torch.arange(rotated // D)[:, None] * D + pairs[None]).reshape(-1),
            torch.arange(rotated, qkv.shape[0]),
        ])
        return qkv[order].contiguous(), None if bias is None else bias[order].contiguous()

    @torch.inference_mode()
    def prefill(self, prefix_ids: list[int]) -> PrefixCache:
        """Run the prefix once and keep every layer's keys and values."""
        P = len(prefix_ids)
        layout = _Layout(
            B=1, W=P, index=torch.arange(P), row=torch.zeros(P, dtype=torch.long), col=torch.arange(P),
            read=torch.tensor([[P - 1]]), positions=torch.arange(P),
            mask=_additive(torch.ones(P, P, dtype=torch.bool).tril()[None, None]),
        )
        keys, values = [], []
        self._layers(torch.tensor(prefix_ids), layout, None, keys, values)
        return PrefixCache(keys=tuple(keys), values=tuple(values))

    @torch.inference_mode()
    def score(self, batch: Batch, prefix: PrefixCache | None, trie: LabelTrie) -> torch.Tensor:
        """[B, L] label scores of every row (mode of `trie`)."""
        prefix = prefix if (batch.cached and prefix is not None and prefix.length) else None
        layout = self._layout(batch, trie, prefix.length if prefix else 0)
        B, S = batch.input_ids.shape
        ids = torch.cat([batch.input_ids, trie.node_tokens.expand(B, -1)], dim=1)  # [B, W]
        read = self.final_norm(self._layers(ids.reshape(-1)[layout.index], layout, prefix))  # [B, 1+T, hidden]
        return trie.score(self._step_logprobs(read, trie))

    def _layout(self, batch: Batch, trie: LabelTrie, n_prefix: int) -> _Layout:
        lengths = batch.lengths
        B, S = batch.input_ids.shape
        T = trie.n_nodes
        W = S + T
        pad = (S - lengths)[:, None]  # [B, 1] pads at the left of each row
        col = torch.arange(W)[None]  # [1, W]
        real = (col >= pad) | (col >= S)  # [B, W] item tokens and trie nodes
        index = real.reshape(-1).nonzero().squeeze(1)  # [N]
        depth = torch.cat([torch.zeros(S, dtype=torch.long), trie.node_depth])  # [W]
        positions = torch.where(col < S, col - pad, lengths[:, None] + depth[None] - 1) + n_prefix  # [B, W]

        # Packed index of each row's first real token; its last item token and nodes follow.
        row_start = torch.cumsum(lengths + T, 0) - (lengths + T)  # [B]
        read = row_start[:, None] + lengths[:, None] - 1 + torch.arange(1 + T)[None]  # [B, 1+T]

        q = torch.arange(W)[:, None]  # [W, 1] query column
        k = torch.arange(S)[None]  # [1, S] suffix key column
        sees_suffix = ((k[None] >= pad[:, :, None]) & (k <= q)[None]) | (k == q)[None]  # [B, W, S]
        sees_nodes = torch.zeros(W, T, dtype=torch.bool)
        sees_nodes[S:] = trie.ancestors  # [W, T]
        parts = [sees_suffix, sees_nodes.expand(B, W, T)]
        if n_prefix:
            parts.insert(0, torch.ones(B, W, n_prefix, dtype=torch.bool))
        mask = _additive(torch.cat(parts, dim=2)[:, None])  # [B, 1, W, P+W]
        return _Layout(B=B, W=W, index=index, row=index // W, col=index % W, read=read,
                       positions=positions.reshape(-1)[index], mask=mask)

    def _layers(self, ids: torch.Tensor, layout: _Layout, prefix: PrefixCache | None,
                keys: list | None = None, values: list | None = None) -> torch.Tensor:
        """Embed the packed ids and run every decoder layer.

        Returns [B, 1+T, hidden] (before the final norm) at the read positions: the last layer
        computes its attention queries and MLP only there. With `keys` given (the prefill), every
        layer's keys and values are collected and nothing is read.
        """
        h = self.embed(ids)  # [N, hidden]
        cos, sin = self.rotary(h[None], layout.positions[None])  # [1, N, D] each
        half = self.head_dim // 2
        # HF's cos/sin repeat one half twice; as complex numbers: [N, 1, D/2]
        cis = torch.complex(cos[0, :, None, :half].contiguous(), sin[0, :, None, :half].contiguous())
        # q/k/v in the padded layout, shared by all layers: only real rows are ever written, so
        # the pad rows stay zero (a pad key is masked anyway, and zeros keep its product finite).
        padded = h.new_zeros(layout.B * layout.W, self.n_heads + 2 * self.n_kv, self.head_dim)
        last = len(self.layers) - 1 if keys is None else None
        for i, layer in enumerate(self.layers):
            past = None if prefix is None else (prefix.keys[i], prefix.values[i])
            if i == last:
                h = self._attention_block(h, layer, cis, padded, layout, past, read_only=True)  # [B*(1+T), hidden]
                self._mlp_block(h, layer)
                return h.view(layout.B, -1, h.shape[-1])
            k, v = self._attention_block(h, layer, cis, padded, layout, past)
            if keys is not None:
                keys.append(k.clone())  # views of `padded`, which the next layer overwrites
                values.append(v.clone())
            self._mlp_block(h, layer)
        return h

    def _attention_block(self, h, layer: _Layer, cis, padded, layout: _Layout, past, read_only: bool = False):
        """h += attention(norm(h)); returns this block's [B, H_kv, W, D] keys and values.

        With `read_only`, queries are computed at the read positions only, and the updated hidden
        states of those positions, [B*(1+T), hidden], are returned instead.
        """
        N = h.shape[0]
        H, Hkv, D = self.n_heads, self.n_kv, self.head_dim
        qkv = F.linear(_rms(h, layer.eps), layer.qkv, layer.qkv_bias).view(N, H + 2 * Hkv, D)  # [N, H+2Hkv, D]
        qk = torch.view_as_complex(qkv[:, : H + Hkv].unflatten(-1, (D // 2, 2)))  # [N, H+Hkv, D/2]
        qk.mul_(cis)  # rotary embedding, in place (rows interleaved at load time)
        padded[layout.index] = qkv
        heads = padded.view(layout.B, layout.W, H + 2 * Hkv, D).transpose(1, 2)  # [B, H+2Hkv, W, D]
        q, k, v = heads[:, :H], heads[:, H : H + Hkv], heads[:, H + Hkv :]
        new_k, new_v = k, v
        if past is not None:
            pk, pv = past  # [1, H_kv, P, D]
            k = torch.cat([pk.expand(layout.B, -1, -1, -1), k], dim=2)  # [B, H_kv, P+W, D]
            v = torch.cat([pv.expand(layout.B, -1, -1, -1), v], dim=2)
        mask = layout.mask
        if read_only:
            n_read = layout.read.shape[1]  # the read columns are the last 1+T of the padded layout
            q, mask = q[:, :, -n_read:], mask[:, :, -n_read:]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=True)
        out = out.transpose(1, 2)  # [B, Q, H, D]
        if read_only:
            return h[layout.read.reshape(-1)] + F.linear(out.reshape(-1, H * D), layer.o)
        h.add_(F.linear(out[layout.row, layout.col].view(N, H * D), layer.o))  # gather real rows: [N, H D]
        return new_k, new_v

    @staticmethod
    def _mlp_block(h, layer: _Layer) -> None:
        """h += down(silu(gate(norm(h))) * up(norm(h)))."""
        gate_up = F.linear(_rms(h, layer.eps), layer.gate_up)  # [N, 2I]
        gate, up = gate_up.chunk(2, dim=-1)
        h.add_(F.linear(F.silu(gate, inplace=True).mul_(up), layer.down))

    def _step_logprobs(self, read: torch.Tensor, trie: LabelTrie) -> torch.Tensor:
        """[B, 1+T, hidden] normed hidden states → [B, N_steps] log-probabilities of the trie steps."""
        B, n_pos, _ = read.shape
        vocab = self.lm_head.out_features
        per_call = max(1, _LOGITS_CHUNK // (n_pos * vocab))
        out = []
        for start in range(0, B, per_call):
            logprobs = torch.log_softmax(self.lm_head(read[start : start + per_call]), dim=-1)  # [b, 1+T, V]
            out.append(logprobs[:, trie.step_pos, trie.step_token])  # [b, N_steps]
        return torch.cat(out)


def _additive(allowed: torch.Tensor) -> torch.Tensor:
    """Bool mask → additive float mask, built once per batch (sdpa would convert a bool mask in every layer)."""
    return torch.zeros(allowed.shape).masked_fill_(~allowed, float("-inf"))


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without its weight (folded into the next projection)."""
    return F.rms_norm(x, (x.shape[-1],), eps=eps)
