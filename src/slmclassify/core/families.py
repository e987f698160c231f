"""Model families as descriptions: what each decoder does differently from Llama's, as data.

The one engine (`engine/`) follows a `Family`; `config_check.py` derives its rules from the same
description, so a setting a description does not cover is refused, named, instead of dropped.
Adding a family is a description here plus its tests (`tests/test_families.py`).

What the descriptions cover (read from transformers' `models/<family>/modeling_*.py`):

    where the norms sit   input norm before attention / MLP (folded into the projections that
                          read it), or post norms on each branch's output before the residual add
                          (Gemma 3, OLMo 2: computed, they cannot be folded)
    norm weight           w (Llama) or 1 + w (Gemma), the norm always computed in float32
    q/k norm              none, RMSNorm over each head (Qwen3, Gemma 3, LFM2) or over the whole
                          projection (OLMo 2), before the rotary embedding
    scales                embeddings (Granite's multiplier; Gemma's sqrt(hidden) is inside its
                          embedding module), attention (Granite's multiplier, Gemma's
                          query_pre_attn_scalar), residual branches (Granite), logits (Granite's
                          divisor, Gemma's soft cap)
    per layer             attention or a gated short convolution (LFM2); a sliding window; the
                          rotary table (Gemma 3: local and global bases) or none (SmolLM3's NoPE
                          layers)
    fused projections     [q; k; v] and [gate; up] in one matrix (Phi-3), split by the engine
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """One decoder family: module names, norms, scales and per-layer kinds (see the module docstring)."""

    name: str
    """What docs and errors call it."""
    model_types: tuple[str, ...]
    attention: str = "self_attn"
    q: str = "q_proj"
    k: str = "k_proj"
    v: str = "v_proj"
    o: str = "o_proj"
    qkv: str | None = None
    """The fused [q; k; v] projection's name, where there is one (then q, k, v are unused)."""
    mlp: str = "mlp"
    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"
    gate_up: str | None = None
    """The fused [gate; up] projection's name, where there is one."""
    input_norm: str | None = "input_layernorm"
    """The norm before attention (None: OLMo 2 has none)."""
    mlp_norm: str | None = "post_attention_layernorm"
    """The norm before the MLP (None: OLMo 2)."""
    post_attention_norm: str | None = None
    """A norm on the attention branch's output before the residual add (Gemma 3, OLMo 2)."""
    post_mlp_norm: str | None = None
    final_norm: str = "norm"
    norm_offset: float = 0.0
    """1.0 where a norm multiplies by (1 + w) (Gemma)."""
    qk_norm: str | None = None
    """None, "head" (RMSNorm over each head's D) or "projection" (over all heads of q, of k)."""
    q_norm: str = "q_norm"
    k_norm: str = "k_norm"
    conv: str | None = None
    """The name of a layer's short convolution where layers may have one instead of attention (LFM2)."""
    activation: str = "hidden_act"
    """The config setting that names the MLP's activation."""
    embedding_multiplier: str | None = None
    attention_multiplier: str | None = None
    """A config setting that replaces 1/sqrt(head_dim) as the attention scale (Granite)."""
    query_pre_attn_scalar: bool = False
    """Gemma: the attention scale is query_pre_attn_scalar ** -0.5."""
    residual_multiplier: str | None = None
    logits_divisor: str | None = None
    logit_softcap: str | None = None
    window: str = "layer_types"
    """Where sliding windows come from: "layer_types" (layers marked sliding_attention take
    `sliding_window`), "all" (every layer takes `sliding_window` when it is set) or "none"."""
    rope_per_layer_type: bool = False
    """Gemma 3: one rotary table per layer type (local and global bases)."""
    no_rope_layers: bool = False
    """SmolLM3: `no_rope_layers[i]` 0 marks a layer without the rotary embedding."""
    must_be: tuple[tuple[str, object], ...] = ()
    """Settings that must have this value (what the engine does not implement otherwise)."""
    bias_settings: tuple[str, ...] = ("attention_bias", "mlp_bias")
    """Bias settings the engine handles (any value)."""


LLAMA = Family("Llama", ("llama",))
QWEN2 = Family("Qwen2", ("qwen2",))
QWEN3 = Family("Qwen3", ("qwen3",), qk_norm="head")
MISTRAL = Family("Mistral", ("mistral",), window="all")
MINISTRAL = Family("Ministral", ("ministral",))
GRANITE = Family("Granite", ("granite",), embedding_multiplier="embedding_multiplier",
                 attention_multiplier="attention_multiplier", residual_multiplier="residual_multiplier",
                 logits_divisor="logits_scaling")
SMOLLM3 = Family("SmolLM3", ("smollm3",), no_rope_layers=True)
PHI3 = Family("Phi-3", ("phi3",), qkv="qkv_proj", gate_up="gate_up_proj", window="all")
OLMO2 = Family("OLMo 2", ("olmo2",), input_norm=None, mlp_norm=None, post_attention_norm="post_attention_layernorm",
               post_mlp_norm="post_feedforward_layernorm", qk_norm="projection")
GEMMA3 = Family("Gemma 3", ("gemma3_text",), mlp_norm="pre_feedforward_layernorm",
                post_attention_norm="post_attention_layernorm", post_mlp_norm="post_feedforward_layernorm",
                norm_offset=1.0, qk_norm="head", activation="hidden_activation", query_pre_attn_scalar=True,
                logit_softcap="final_logit_softcapping", rope_per_layer_type=True,
                must_be=(("attn_logit_softcapping", None), ("use_bidirectional_attention", False)))
LFM2 = Family("LFM2", ("lfm2",), o="out_proj", mlp="feed_forward", gate="w1", up="w3", down="w2",
              input_norm="operator_norm", mlp_norm="ffn_norm", final_norm="embedding_norm", qk_norm="head",
              q_norm="q_layernorm", k_norm="k_layernorm", conv="conv", window="none")

FAMILIES = (LLAMA, QWEN2, QWEN3, MISTRAL, MINISTRAL, GRANITE, SMOLLM3, PHI3, OLMO2, GEMMA3, LFM2)
BY_MODEL_TYPE = {t: f for f in FAMILIES for t in f.model_types}
SUPPORTED_ARCHITECTURES = tuple(BY_MODEL_TYPE)


def family_of(config) -> Family:
    """The family of a config (its `model_type`); KeyError for one not described here."""
    return BY_MODEL_TYPE[getattr(config, "model_type", None)]


@dataclass(frozen=True)
class LayerKind:
    """What one decoder layer computes, beyond the shared weights."""

    mixer: str
    """"attention" or "conv"."""
    window: int | None = None
    """Sliding window: a query at position i sees keys j with i - j < window; None: every earlier key."""
    rope: str | None = "default"
    """Which rotary table: "default", a layer type (Gemma 3), or None (no rotary embedding)."""


def layer_kinds(config) -> list[LayerKind]:
    """Per decoder layer, what it computes (see `LayerKind`)."""
    family = family_of(config)
    n = config.num_hidden_layers
    types = list(getattr(config, "layer_types", None) or ["full_attention"] * n)
    window = getattr(config, "sliding_window", None)
    if family.model_types == ("smollm3",) and not getattr(config, "use_sliding_window", False):
        window = None  # SmolLM3 marks layers sliding only when use_sliding_window is on
    kinds = []
    for i in range(n):
        kind = types[i]
        if family.conv and kind == "conv":
            kinds.append(LayerKind("conv", rope=None))
            continue
        w = None
        if family.window == "all":
            w = window
        elif family.window == "layer_types" and kind == "sliding_attention":
            w = window
        rope = kind if family.rope_per_layer_type else "default"
        if family.no_rope_layers and not config.no_rope_layers[i]:
            rope = None
        kinds.append(LayerKind("attention", window=int(w) if w else None, rope=rope))
    return kinds
