"""The fast path: the model's decoder layers run over left-padded batches that continue a
prefix whose keys and values were computed once, plus the label-trie nodes, in one pass.

Layout of one row (P prefix tokens, S suffix width, T trie nodes; `.` = pad):

    keys:      [ p p p p | . . s s s s | n1 n2 ]      n = trie node
    positions:   0 ... P-1  P P P+0 .. P+3  P+4+depth-1
    query s_i sees: every prefix key, real suffix keys up to itself (causal)
    query n_t sees: every prefix key, every real suffix key, its own trie ancestors and itself
    query .   sees: prefix keys and itself (its output is never read)

Only the item's last token and the trie nodes reach the output layer. The weights and
sub-modules are the Hugging Face model's own (Llama and Qwen2 share this layout), so the
reference path in `reference.py` is an independent oracle for this code.
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


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Engine:
    """Scores label tries for batches of items, reusing one prefix cache."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        base = model.model
        self.embed = base.embed_tokens
        self.layers = base.layers
        self.norm = base.norm
        self.rotary = base.rotary_emb
        self.lm_head = model.lm_head
        cfg = model.config
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    @torch.inference_mode()
    def prefill(self, prefix_ids: list[int]) -> PrefixCache:
        """Run the prefix once and keep every layer's keys and values."""
        ids = torch.tensor([prefix_ids], dtype=torch.long)  # [1, P]
        positions = torch.arange(len(prefix_ids))[None]  # [1, P]
        _, keys, values = self._layers(ids, positions, mask=None, prefix=None, keep_kv=True)
        return PrefixCache(keys=tuple(keys), values=tuple(values))

    @torch.inference_mode()
    def score(self, batch: Batch, prefix: PrefixCache | None, trie: LabelTrie) -> torch.Tensor:
        """[B, L] label scores of every row (mode of `trie`)."""
        n_prefix = prefix.length if (batch.cached and prefix is not None) else 0
        B, S = batch.input_ids.shape
        T = trie.n_nodes
        ids = torch.cat([batch.input_ids, trie.node_tokens.expand(B, T)], dim=1)  # [B, S+T]
        positions, mask = self._positions_and_mask(batch.lengths, S, trie, n_prefix)
        hidden, _, _ = self._layers(ids, positions, mask, prefix if n_prefix else None)
        # hidden: [B, S+T, H]; read the item's last token (S-1) and the trie nodes (S..S+T-1)
        read = hidden[:, S - 1 :]  # [B, 1+T, H]
        step_logprobs = self._step_logprobs(self.norm(read), trie)  # [B, N]
        return trie.score(step_logprobs)

    def _positions_and_mask(self, lengths: torch.Tensor, S: int, trie: LabelTrie, n_prefix: int):
        B, T = lengths.shape[0], trie.n_nodes
        pad = (S - lengths)[:, None]  # [B, 1] pads at the left of each row
        col = torch.arange(S)[None]  # [1, S]
        suffix_pos = n_prefix + (col - pad).clamp(min=0)  # [B, S]
        node_pos = n_prefix + lengths[:, None] + trie.node_depth[None] - 1  # [B, T]
        positions = torch.cat([suffix_pos, node_pos], dim=1)  # [B, S+T]

        q = torch.arange(S + T)[:, None]  # [S+T, 1] query index
        k = torch.arange(S)[None]  # [1, S] suffix key index
        real_key = k[None] >= pad[:, :, None]  # [B, 1, S] key is a real token
        causal = k <= q  # [S+T, S]; trie queries (q >= S) see every suffix key
        sees_suffix = (real_key & causal[None]) | (k == q)[None]  # [B, S+T, S]; pads see themselves
        sees_nodes = torch.zeros(S + T, T, dtype=torch.bool)
        sees_nodes[S:] = trie.ancestors  # [S+T, T]
        parts = [sees_suffix, sees_nodes.expand(B, S + T, T)]
        if n_prefix:
            parts.insert(0, torch.ones(B, S + T, n_prefix, dtype=torch.bool))
        mask = torch.cat(parts, dim=2)[:, None]  # [B, 1, S+T, P+S+T]
        return positions, mask

    def _layers(self, ids, positions, mask, prefix: PrefixCache | None, keep_kv: bool = False):
        """Embed, run every decoder layer, return the last hidden states (before the final norm)."""
        h = self.embed(ids)  # [B, Q, H]
        cos, sin = self.rotary(h, positions)  # [B, Q, D] each
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, Q, D]
        keys, values = [], []
        for i, layer in enumerate(self.layers):
            residual = h
            attn_out, k, v = self._attention(
                layer.self_attn, layer.input_layernorm(h), cos, sin, mask,
                None if prefix is None else (prefix.keys[i], prefix.values[i]),
            )
            h = residual + attn_out
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            if keep_kv:
                keys.append(k)
                values.append(v)
        return h, keys, values

    def _attention(self, attn, x, cos, sin, mask, past):
        B, Q, _ = x.shape
        D = self.head_dim
        q = attn.q_proj(x).view(B, Q, -1, D).transpose(1, 2)  # [B, H, Q, D]
        k = attn.k_proj(x).view(B, Q, -1, D).transpose(1, 2)  # [B, H_kv, Q, D]
        v = attn.v_proj(x).view(B, Q, -1, D).transpose(1, 2)  # [B, H_kv, Q, D]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        new_k, new_v = k, v
        if past is not None:
            pk, pv = past  # [1, H_kv, P, D]
            k = torch.cat([pk.expand(B, -1, -1, -1), k], dim=2)  # [B, H_kv, P+Q, D]
            v = torch.cat([pv.expand(B, -1, -1, -1), v], dim=2)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, scale=attn.scaling, enable_gqa=True
        )  # [B, H, Q, D]
        return attn.o_proj(out.transpose(1, 2).reshape(B, Q, -1)), new_k, new_v

    def _step_logprobs(self, read: torch.Tensor, trie: LabelTrie) -> torch.Tensor:
        """[B, 1+T, H] normed hidden states → [B, N] log-probabilities of the trie steps."""
        B, n_pos, _ = read.shape
        vocab = self.lm_head.out_features
        per_call = max(1, _LOGITS_CHUNK // (n_pos * vocab))
        out = []
        for start in range(0, B, per_call):
            logprobs = torch.log_softmax(self.lm_head(read[start : start + per_call]), dim=-1)  # [b, 1+T, V]
            out.append(logprobs[:, trie.step_pos, trie.step_token])  # [b, N]
        return torch.cat(out)
