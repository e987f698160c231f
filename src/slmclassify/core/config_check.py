"""Which model configurations the fast path computes exactly, checked once when a model loads.

`engine.py` re-implements the Llama/Qwen2 decoder on the Hugging Face modules' weights. A
setting it does not implement must never be dropped silently (the scores would be wrong
whenever verification is off or its probes miss the difference), so every source (local
folder, hub id, GGUF) passes `check_config` before any weights are read: a configuration is
either computed exactly or refused with the setting and its value named.

Implemented: Llama (`attention_bias`, `mlp_bias`, any `head_dim`, grouped-query or plain
multi-head attention) and Qwen2 (q/k/v biases), tied or untied embeddings, any `hidden_act`
transformers knows (the engine calls the same activation module), and the rotary types
`default`, `linear`, `llama3`, `yarn` (their cos/sin come from the Hugging Face rotary module
itself, attention scaling included). Three settings are exact only on sequences up to a length,
which `context_limit` returns and the classifier caps prompts at (longer items are truncated,
status `truncated`): `dynamic` rope (frequencies change beyond `max_position_embeddings`),
`longrope` (the long factors are used beyond `original_max_position_embeddings`) and Qwen2's
sliding-window attention (equal to full causal attention within the window).
"""

from __future__ import annotations

from ..errors import ModelLoadError

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")
EXACT_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
LENGTH_CAPPED_ROPE_TYPES = ("dynamic", "longrope")
LAYER_TYPES = ("full_attention", "sliding_attention")


def check_architecture(model_type: str | None, where: str) -> None:
    """Refuse an architecture the engine does not implement (also used on GGUF metadata)."""
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"{where}: architecture {model_type!r} is not supported; "
            f"supported are {', '.join(SUPPORTED_ARCHITECTURES)}"
        )


def check_config(config, where: str = "model") -> None:
    """Accept a config the engine computes exactly, or raise ModelLoadError naming the setting."""
    check_architecture(getattr(config, "model_type", None), where)

    def refuse(setting: str, value, why: str) -> None:
        raise ModelLoadError(f"{where}: {setting}={value!r} is not supported: {why}")

    from transformers.activations import ACT2FN

    act = getattr(config, "hidden_act", "silu")
    if act not in ACT2FN:
        refuse("hidden_act", act, f"transformers has no activation of that name (known: {', '.join(sorted(ACT2FN))})")
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
    if heads % kv_heads:
        refuse("num_key_value_heads", kv_heads, f"must divide num_attention_heads ({heads})")
    if head_dim(config) % 2:
        refuse("head_dim", head_dim(config), "the rotary embedding needs an even head dimension")

    rope = rope_parameters(config)
    if any(isinstance(v, dict) for v in rope.values()):
        refuse("rope_parameters", rope, "per-layer-type rotary parameters are not implemented")
    rope_type = rope.get("rope_type", "default")
    if rope_type not in EXACT_ROPE_TYPES + LENGTH_CAPPED_ROPE_TYPES:
        refuse("rope_type", rope_type, f"implemented are {', '.join(EXACT_ROPE_TYPES + LENGTH_CAPPED_ROPE_TYPES)}")
    partial = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if partial is not None and float(partial) != 1.0:
        refuse("partial_rotary_factor", partial, "the engine rotates the whole head dimension")
    if rope_type == "longrope" and not _original_context(config, rope):
        refuse("rope_type", rope_type, "longrope needs original_max_position_embeddings")

    layer_types = getattr(config, "layer_types", None) or ()
    unknown = sorted(set(layer_types) - set(LAYER_TYPES))
    if unknown:
        refuse("layer_types", unknown[0], f"implemented are {', '.join(LAYER_TYPES)}")
    if "sliding_attention" in layer_types and not getattr(config, "sliding_window", None):
        refuse("layer_types", "sliding_attention", "a sliding layer without sliding_window")


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rope_parameters(config) -> dict:
    """The rotary settings (transformers 5 keeps them in `rope_parameters`)."""
    return dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})


def context_limit(config) -> int:
    """Longest sequence (prompt + label tokens) the engine computes exactly for this config."""
    limit = getattr(config, "max_position_embeddings", None) or 2048
    rope = rope_parameters(config)
    if rope.get("rope_type") == "longrope":
        limit = min(limit, _original_context(config, rope))
    layer_types = getattr(config, "layer_types", None) or ()
    window = getattr(config, "sliding_window", None)
    if window and "sliding_attention" in layer_types:
        # A query at position i sees keys j with i - j < window: every key while i < window.
        limit = min(limit, int(window))
    return int(limit)


def _original_context(config, rope: dict) -> int | None:
    return rope.get("original_max_position_embeddings") or getattr(config, "original_max_position_embeddings", None)
