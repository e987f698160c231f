"""Random-weight models with the shapes of the small models users pick: folders for `slmclassify bench
--model FOLDER` (docs/models.md, "Speed at real shapes"), and the models `gpu_check.py` beside it builds
on the GPU itself (`random_model`). No download, the embedded SmolLM2 tokenizer (`tokenizer/` beside it; the
vocabulary rows beyond it are never read, but the output layer pays for them).

    .venv/bin/python examples/gpu_check/real_shapes.py /tmp/realshapes granite-350m lfm2-350m
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
    "smollm2-135m": ("LlamaConfig", "LlamaForCausalLM", dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
        tie_word_embeddings=True)),
    "qwen2.5-0.5b": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True)),
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


def tokenizer():
    """The embedded model's tokenizer (committed in `tokenizer/` beside this file)."""
    return transformers.AutoTokenizer.from_pretrained(str(Path(__file__).parent / "tokenizer"))


def random_model(name: str, tokenizer, device: str = "cpu") -> torch.nn.Module:
    """A float32 model of shape `name` (`SHAPES`) with seeded random weights, initialised on `device`."""
    config_cls, modelcls, settings = SHAPES[name]
    config = getattr(transformers, config_cls)(pad_token_id=tokenizer.pad_token_id or 0,
                                               eos_token_id=tokenizer.eos_token_id, **settings)
    torch.manual_seed(0)
    with torch.device(device):
        return getattr(transformers, modelcls)(config).eval()


def build(name: str, folder: Path) -> None:
    from slmclassify.models.loading import save_hf_folder

    tok = tokenizer()
    model = random_model(name, tok)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    save_hf_folder(model, tok, folder)
    print(f"{folder}: {name}, {sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters")


if __name__ == "__main__":
    root = Path(sys.argv[1])
    for shape in sys.argv[2:] or SHAPES:
        build(shape, root / shape)
