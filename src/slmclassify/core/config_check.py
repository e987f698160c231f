"""Which model configurations the fast path computes exactly, checked once when a model loads.

`engine/forward.py` re-implements the decoder of each family described in `families.py` on the Hugging
Face modules' weights. A setting it does not implement must never be dropped silently (the scores
would be wrong whenever verification is off or its probes miss the difference), so every source
(local folder, hub id, GGUF) passes `check_config` before any weights are read: a configuration is
either computed exactly or refused with the setting and its value named. The rules come from the
family descriptions: an architecture without one is refused, and so is a setting of a family that
its description does not cover (`Family.must_be`, rotary types, layer types).

Implemented for every family: tied or untied embeddings, any `hidden_act` transformers knows (the
engine calls the same activation module), any `head_dim`, grouped-query or plain multi-head
attention, the biases each family's modules have, and the rotary types `default`, `linear`,
`llama3`, `yarn` (their cos/sin come from the Hugging Face rotary module itself, attention scaling
included); partial rotary where the family's own code has it (Phi-3); sliding-window attention at
any length (the engine masks by the window, the cached prefix included). Two settings are exact
only on sequences up to a length, which `context_limit` returns and the classifier caps prompts at
(longer items are truncated, status `truncated`): `dynamic` rope (frequencies change beyond
`max_position_embeddings`) and `longrope` (the long factors are used beyond
`original_max_position_embeddings`).
"""

from __future__ import annotations

from ..errors import ModelLoadError
from .families import BY_MODEL_TYPE, SUPPORTED_ARCHITECTURES, family_of

EXACT_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
LENGTH_CAPPED_ROPE_TYPES = ("dynamic", "longrope")
LAYER_TYPES = ("full_attention", "sliding_attention")
GGUF_ARCHITECTURES = {"gemma3": "gemma3_text"}
"""GGUF `general.architecture` names that differ from the transformers `model_type` they load as."""
PARTIAL_ROTARY = ("phi3",)
"""Families whose own rotary code rotates part of each head (the rest passes through)."""


def check_architecture(model_type: str | None, where: str) -> None:
    """Refuse an architecture the engine does not implement (also used on GGUF metadata)."""
    if GGUF_ARCHITECTURES.get(model_type, model_type) not in BY_MODEL_TYPE:
        raise ModelLoadError(
            f"{where}: architecture {model_type!r} is not supported; "
            f"supported are {', '.join(SUPPORTED_ARCHITECTURES)}"
        )


def check_config(config, where: str = "model") -> None:
    """Accept a config the engine computes exactly, or raise ModelLoadError naming the setting."""
    check_architecture(getattr(config, "model_type", None), where)
    family = family_of(config)

    def refuse(setting: str, value, why: str) -> None:
        raise ModelLoadError(f"{where}: {setting}={value!r} is not supported: {why}")

    from transformers.activations import ACT2FN

    act = getattr(config, family.activation, "silu")
    if act not in ACT2FN:
        refuse(family.activation, act, f"transformers has no activation of that name (known: {', '.join(sorted(ACT2FN))})")
    for setting, value in family.must_be:
        if getattr(config, setting, value) != value:
            refuse(setting, getattr(config, setting), f"the engine implements {family.name} with {setting}={value!r}")
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
    if heads % kv_heads:
        refuse("num_key_value_heads", kv_heads, f"must divide num_attention_heads ({heads})")
    if head_dim(config) % 2:
        refuse("head_dim", head_dim(config), "the rotary embedding needs an even head dimension")

    rope = rope_parameters(config)
    nested = {k: v for k, v in rope.items() if isinstance(v, dict)}
    if nested and not family.rope_per_layer_type:
        refuse("rope_parameters", rope, "per-layer-type rotary parameters are not implemented")
    for params in (nested.values() if nested else [rope]):
        _check_rope(config, params, family, refuse)

    layer_types = getattr(config, "layer_types", None) or ()
    known = LAYER_TYPES + (("conv",) if family.conv else ())
    unknown = sorted(set(layer_types) - set(known))
    if unknown:
        refuse("layer_types", unknown[0], f"implemented are {', '.join(known)}")
    if "sliding_attention" in layer_types and not getattr(config, "sliding_window", None):
        refuse("layer_types", "sliding_attention", "a sliding layer without sliding_window")
    window = getattr(config, "sliding_window", None)
    if window and family.window == "layer_types" and not hasattr(config, "layer_types"):
        refuse("sliding_window", window, f"{family.name} marks no layer as sliding, and transformers applies this "
               "setting in its KV cache only (a prompt's forward ignores it, a cached continuation does not): "
               "set it to null in config.json")


def _check_rope(config, rope: dict, family, refuse) -> None:
    rope_type = rope.get("rope_type", "default")
    if rope_type not in EXACT_ROPE_TYPES + LENGTH_CAPPED_ROPE_TYPES:
        refuse("rope_type", rope_type, f"implemented are {', '.join(EXACT_ROPE_TYPES + LENGTH_CAPPED_ROPE_TYPES)}")
    partial = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if partial is not None and float(partial) != 1.0:
        if family.model_types[0] not in PARTIAL_ROTARY:
            refuse("partial_rotary_factor", partial, f"{family.name} models rotate the whole head dimension")
        if int(head_dim(config) * float(partial)) % 2:
            refuse("partial_rotary_factor", partial, "the rotated part of each head must have an even width")
    if rope_type == "longrope" and not _original_context(config, rope):
        refuse("rope_type", rope_type, "longrope needs original_max_position_embeddings")


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rope_parameters(config) -> dict:
    """The rotary settings (transformers 5 keeps them in `rope_parameters`)."""
    return dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})


def context_limit(config) -> int:
    """Longest sequence (prompt + label tokens) the engine computes exactly for this config."""
    limit = getattr(config, "max_position_embeddings", None) or 2048
    rope = rope_parameters(config)
    for params in [v for v in rope.values() if isinstance(v, dict)] or [rope]:
        if params.get("rope_type") == "longrope":
            limit = min(limit, _original_context(config, params))
    return int(limit)


def _original_context(config, rope: dict) -> int | None:
    return rope.get("original_max_position_embeddings") or getattr(config, "original_max_position_embeddings", None)
