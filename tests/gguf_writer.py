"""Write a GGUF file of a tiny in-memory model with the `gguf` package, as llama.cpp's converter lays
it out (tensor names from gguf's own name map, float32 tensors, a GPT-2-style BPE tokenizer), so that
`--model FILE.gguf` is tested through transformers' real GGUF reader. Only what the reader of each
architecture needs is written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def write_gguf(model, tokenizer, path: Path, arch: str, skip: tuple[str, ...] = ()) -> Path:
    """A GGUF file of `model` (float32 tensors) and `tokenizer` for llama.cpp's `arch`; `skip`: state-dict
    names left out (an incomplete file)."""
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{config.model_type}")  # transformers reads a "llama" file named *mistral* as Mistral
    writer.add_context_length(config.max_position_embeddings)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_embedding_length(config.hidden_size)
    writer.add_head_count(config.num_attention_heads)
    kinds = getattr(config, "layer_types", None) or []
    if arch == "lfm2":  # llama.cpp marks the convolution layers by 0 KV heads
        writer.add_head_count_kv([0 if kind == "conv" else config.num_key_value_heads for kind in kinds])
        writer.add_uint32(f"{arch}.shortconv.l_cache", config.conv_L_cache)
    else:
        writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(getattr(config, "rms_norm_eps", None) or config.norm_eps)
    rope = config.rope_parameters
    writer.add_rope_freq_base((rope.get("full_attention") or rope)["rope_theta"])
    if arch == "gemma3":
        writer.add_key_length(config.head_dim)
        writer.add_sliding_window(config.sliding_window)
    writer.add_vocab_size(config.vocab_size)

    vocab = tokenizer.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = set(tokenizer.all_special_tokens)
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_unk_token_id(tokenizer.pad_token_id)
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)

    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_id, config.num_hidden_layers)
    state = model.state_dict()
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    for name, tensor in state.items():
        if name in skip:
            continue
        base, suffix = name.rsplit(".", 1)
        gguf_name = names.get_name(base)
        assert gguf_name is not None, name
        tensor = tensor.detach().float()
        if arch == "gemma3" and "norm" in name:  # llama.cpp stores Gemma's norms as 1 + w
            tensor = tensor + 1
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):  # llama.cpp's rotary layout
            heads = config.num_attention_heads if "q_proj" in name else config.num_key_value_heads
            tensor = tensor.reshape(heads, 2, tensor.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(tensor.shape)
        if arch == "lfm2" and name.endswith("conv.conv.weight"):  # [hidden, 1, K] -> [hidden, K]
            tensor = tensor[:, 0]
        writer.add_tensor(f"{gguf_name}.{suffix}", tensor.numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
