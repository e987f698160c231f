"""Tiny random models of every family the engine implements, built with transformers' own config
classes (`FAMILY_MODELS`), with every norm weight and bias made random: transformers initialises
norms to one (Gemma's to zero) and biases to zero, which would hide a norm or bias the engine drops."""

from __future__ import annotations

import torch

COMMON = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2, pad_token_id=0, eos_token_id=2,
)

# name: (config class, model class, config settings on top of COMMON). Each family's traits are on.
FAMILY_MODELS = {
    # q/k RMSNorm per head, head_dim set apart from hidden / heads
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=24, tie_word_embeddings=True)),
    # (1 + w) norms, four per layer, GeGLU, query_pre_attn_scalar, local and global layers with their own
    # rotary bases, tied embeddings times sqrt(hidden), a final soft cap
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        head_dim=16, query_pre_attn_scalar=24, sliding_window=512, final_logit_softcapping=5.0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}})),
    # the four multipliers
    "granite": ("GraniteConfig", "GraniteForCausalLM", dict(
        embedding_multiplier=6.0, attention_multiplier=0.08, residual_multiplier=0.3, logits_scaling=4.0)),
    # no rotary embedding on every second layer here (every fourth in SmolLM3-3B)
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(no_rope_layer_interval=2)),
    # Llama with a sliding window wider than the context
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=4096)),
    "ministral": ("MinistralConfig", "MinistralForCausalLM", dict(
        head_dim=16, sliding_window=4096, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    # fused qkv_proj and gate_up_proj, partial rotary (Phi-4-mini: 0.75)
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75},
        tie_word_embeddings=False)),
    # post norms only, q/k norm over the whole projection
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict()),
    # short convolutions (kernel 3) around one attention layer, with biases
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", dict(
        layer_types=["conv", "full_attention", "conv"], conv_L_cache=3, conv_bias=True,
        block_auto_adjust_ff_dim=False)),
}


def family_model(name: str, vocab: int, seed: int = 0, **overrides):
    """A tiny random model of family `name` (see `FAMILY_MODELS`), eval mode, float32."""
    import transformers

    config_cls, model_cls, settings = FAMILY_MODELS[name]
    config = getattr(transformers, config_cls)(**{**COMMON, "vocab_size": vocab, **settings, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if param_name.endswith("bias"):
                param.normal_(0, 0.2)
            elif "norm" in param_name:
                param.add_(torch.randn_like(param) * 0.3)
    return model
