"""Random-weight model folders with the shapes of the small models users pick, for `slmclassify bench
--model FOLDER` (docs/models.md, "Speed at real shapes"): no download, the embedded SmolLM2 tokenizer
(`scripts/tokenizer`; the vocabulary rows beyond it are never read, but the output layer pays for them).

    .venv/bin/python scripts/real_shapes.py /tmp/realshapes granite-350m lfm2-350m
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
import transformers

# name: (config class, model class, settings): each model's sizes (vocabulary, widths, layers, heads, layer
# kinds), what the speed depends on; the parameter counts printed match docs/models.md's table
SHAPES = {
    "qwen3-0.6b": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, tie_word_embeddings=True, max_position_embeddings=40960)),
    "gemma3-270m": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=512,
        max_position_embeddings=32768)),
    "granite-350m": ("GraniteConfig", "GraniteForCausalLM", dict(
        vocab_size=100352, hidden_size=1024, intermediate_size=2048, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=4, embedding_multiplier=12.0, attention_multiplier=0.015625, residual_multiplier=0.263,
        logits_scaling=4.0, tie_word_embeddings=True, max_position_embeddings=32768)),
    "lfm2-350m": ("Lfm2Config", "Lfm2ForCausalLM", dict(
        vocab_size=65536, hidden_size=1024, intermediate_size=6656, num_hidden_layers=16, num_attention_heads=16,
        num_key_value_heads=8, conv_L_cache=3, block_multiple_of=256, block_ffn_dim_multiplier=1.0,
        block_auto_adjust_ff_dim=True, max_position_embeddings=128000,
        layer_types=["conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv", "conv",
                     "full_attention", "conv", "full_attention", "conv", "full_attention", "conv",
                     "full_attention", "conv"])),
}


def build(name: str, folder: Path) -> None:
    from slmclassify.models.loading import save_hf_folder

    config_cls, model_cls, settings = SHAPES[name]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(Path(__file__).parent / "tokenizer"))
    config = getattr(transformers, config_cls)(pad_token_id=tokenizer.pad_token_id or 0,
                                               eos_token_id=tokenizer.eos_token_id, **settings)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval()
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    save_hf_folder(model, tokenizer, folder)
    print(f"{folder}: {name}, {sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters")


if __name__ == "__main__":
    root = Path(sys.argv[1])
    for shape in sys.argv[2:] or SHAPES:
        build(shape, root / shape)
