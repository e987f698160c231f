"""The weights are held once: read into memory of the process's own (no file memory map), shared
between the engine and the Hugging Face modules, and loading plus arranging peaks at about one copy.

Regressions these pin: the engine and the reference each holding the weights (4.0 GB RSS for a
0.5B model); the safetensors file's memory map keeping every page read resident next to the
engine's arranged copies; transformers' loader threads leaving the freed source tensors in their
malloc arenas while the engine's copies came on top (both ~2x the weights at the peak).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from slmclassify import load_model
from slmclassify.core.engine import Engine

from conftest import tiny_model


def _file_mappings() -> list[tuple[int, int, str]]:
    """(start, end, path) of every file-backed mapping of this process."""
    spans = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            spans.append((start, end, fields[5]))
    return spans


def _storages(tensors) -> dict[int, int]:
    """{storage address: bytes} of the distinct storages behind `tensors` (None skipped)."""
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t is not None}


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_loaded_weights_are_not_memory_mapped(tiny_model_dir):
    loaded = load_model(str(tiny_model_dir))
    spans = _file_mappings()
    mapped = [name for name, p in loaded.model.named_parameters()
              if any(start <= p.data_ptr() < end for start, end, _ in spans)]
    assert mapped == [], f"parameters in a file mapping: {mapped}"


def test_tied_matrix_stored_under_the_output_name_loads_tied(tmp_path, tiny_tokenizer):
    """Our GGUF conversions store a tied embedding as `lm_head.weight` only: it must load as the
    same model, tied, without an embedding-sized placeholder (which transformers would also
    initialise at random)."""
    from safetensors.torch import save_file

    model = tiny_model("llama", len(tiny_tokenizer), tie_word_embeddings=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "model.embed_tokens.weight"}
    assert "lm_head.weight" in state
    model.config.save_pretrained(tmp_path)
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    tiny_tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path)).model
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    expected = model.state_dict()
    for name, value in loaded.state_dict().items():
        assert torch.equal(value, expected[name]), name


def test_engine_and_reference_share_the_weights(tiny_model_dir):
    """Every byte reachable from the loaded model and its engine: the parameters once, plus the
    q/k rows the engine interleaves for the rotary embedding (its only copy)."""
    loaded = load_model(str(tiny_model_dir))
    model = loaded.model
    cfg = model.config
    unique = {id(p): p for p in model.parameters()}.values()
    param_bytes = sum(p.numel() * p.element_size() for p in unique)
    rows = (cfg.num_attention_heads + cfg.num_key_value_heads) * (cfg.hidden_size // cfg.num_attention_heads)
    has_bias = model.model.layers[0].self_attn.q_proj.bias is not None
    qk_copy = cfg.num_hidden_layers * rows * (cfg.hidden_size + has_bias) * 4

    engine = Engine(model)  # float32 `mm` kernel: the engine computes with the shared tensors
    held = _storages(model.parameters())
    for layer in engine.layers:
        held |= _storages(t for op in (layer.qkv, layer.o, layer.gate_up, layer.down) for t in (op.weight, op.bias))
    assert sum(held.values()) == param_bytes + qk_copy, (sum(held.values()), param_bytes, qk_copy)
    for layer, arranged in zip(model.model.layers, engine.layers):
        for lin, op in ((layer.self_attn.v_proj, arranged.qkv), (layer.self_attn.o_proj, arranged.o),
                        (layer.mlp.gate_proj, arranged.gate_up), (layer.mlp.up_proj, arranged.gate_up),
                        (layer.mlp.down_proj, arranged.down)):
            assert lin.weight.untyped_storage().data_ptr() == op.weight.untyped_storage().data_ptr()


_PEAK_SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from slmclassify.core.engine import Engine
    from slmclassify.models.loading import read_model as _load  # the model only: no GEMM measurement (its own buffers)

    def status(key):
        line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(key + ":"))
        return int(line.split()[1]) * 1024

    _load(sys.argv[2])  # imports, the tokenizer's code paths, transformers' model classes
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    before = status("VmRSS")
    Engine(_load(sys.argv[1])[0])  # (model, tokenizer, name)
    print(json.dumps({"before": before, "peak": status("VmHWM")}))
""")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_loading_and_arranging_peak_near_one_copy(tmp_path, tiny_tokenizer, llama_dir):
    """Peak RSS of loading + Engine over the RSS before, in a fresh process: ≤ 1.5x the float32
    weights, 94 MiB here. Measured 1.31-1.33x: the weights, the q/k copy (11% for these shapes) and
    one layer's transient; 1.37-1.50x run to run while glibc kept the freed sources' pages (now
    returned after each layer, `backends/memory.py`); it was 2.25x with the memory map (file pages + arranged copies), ~1.8x with
    the loader's threads."""
    big = tiny_model("llama", len(tiny_tokenizer), hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                     num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False)
    growth, weights = _peak_growth(_PEAK_SCRIPT, big, tmp_path, tiny_tokenizer, llama_dir)
    assert growth <= 1.5 * weights, f"peak grew {growth / 2**20:.0f} MiB for {weights / 2**20:.0f} MiB of weights"


def _peak_growth(script: str, model, folder: Path, tokenizer, warm_up: Path) -> tuple[int, int]:
    """(peak RSS growth, float32 weight bytes, tied matrices once) of `script` run on `model` saved
    in `folder`, in a fresh process that first loads the `warm_up` model (imports and code paths)."""
    weights = sum(p.numel() for p in model.parameters()) * 4
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    out = subprocess.run([sys.executable, "-c", script, str(folder), str(warm_up)],
                         capture_output=True, text=True, check=True)
    rss = json.loads(out.stdout.strip().splitlines()[-1])
    return rss["peak"] - rss["before"], weights


_READ_PEAK_SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from slmclassify.models.loading import read_model as _load

    def status(key):
        line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(key + ":"))
        return int(line.split()[1]) * 1024

    _load(sys.argv[2])
    Path("/proc/self/clear_refs").write_text("5")
    before = status("VmRSS")
    _load(sys.argv[1])
    print(json.dumps({"before": before, "peak": status("VmHWM")}))
""")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_the_largest_tensor_is_read_once(tmp_path, tiny_tokenizer, llama_dir):
    """Loading a folder whose embedding is most of the weights (as Gemma 3's 262k vocabulary is)
    peaks at ≤ 1.2x the float32 weights over the RSS before. Regression: safetensors' pread backend
    read each tensor into a buffer and then copied it, so the embedding was held twice at the peak
    (1.76x here); read straight into its tensor (`weights._FileTensor`): 1.00x measured."""
    big = tiny_model("llama", 65536, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                     num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True)
    growth, weights = _peak_growth(_READ_PEAK_SCRIPT, big, tmp_path, tiny_tokenizer, llama_dir)
    assert growth <= 1.2 * weights, f"peak grew {growth / 2**20:.0f} MiB for {weights / 2**20:.0f} MiB of weights"


_GGUF_PEAK_SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from slmclassify.models import loading
    from slmclassify.models.gguf_pages import converting_gguf

    def status(key):
        line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(key + ":"))
        return int(line.split()[1]) * 1024

    from transformers import AutoTokenizer, Qwen2ForCausalLM, Qwen2TokenizerFast  # imported before, not measured

    read, rss = gguf_utils.load_gguf_checkpoint, {}

    def measured(*args, return_tensors=False, **kwargs):  # from the first read of the file (the metadata
        if "before" not in rss:                          # the tokenizer's, the config and the tensors share)
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
            rss["before"] = status("VmRSS")
        result = read(*args, return_tensors=return_tensors, **kwargs)
        if return_tensors:
            rss["peak"] = status("VmHWM")
        return result

    gguf_utils.load_gguf_checkpoint = measured
    with converting_gguf():  # as `loading._convert_gguf` de-quantises
        loading._dequantise(Path(sys.argv[1]))
    print(json.dumps(rss))
""")


def _write_qwen2_gguf(path: Path, hidden: int, layers: int, intermediate: int) -> int:
    """A float32 Qwen2 GGUF of random weights with the embedded model's tokenizer; its weight bytes."""
    import numpy as np
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    from slmclassify.errors import ModelLoadError
    from slmclassify.models.loading import embedded_gguf_path

    try:
        source = GGUFReader(embedded_gguf_path())
    except ModelLoadError as exc:
        pytest.skip(str(exc))
    heads, kv_heads, vocab = 8, 2, 49152
    kv = kv_heads * hidden // heads
    writer = GGUFWriter(str(path), "qwen2")
    writer.add_context_length(256)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(intermediate)
    writer.add_embedding_length(hidden)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(vocab)
    for name, field in source.fields.items():
        if name.startswith("tokenizer."):
            kind = field.types[0]
            sub = {"sub_type": field.types[-1]} if kind == GGUFValueType.ARRAY else {}
            writer.add_key_value(name, field.contents(), kind, **sub)
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,)}
    for i in range(layers):
        shapes |= {f"blk.{i}.{name}": shape for name, shape in (
            ("attn_norm.weight", (hidden,)), ("ffn_norm.weight", (hidden,)),
            ("attn_q.weight", (hidden, hidden)), ("attn_q.bias", (hidden,)),
            ("attn_k.weight", (kv, hidden)), ("attn_k.bias", (kv,)),
            ("attn_v.weight", (kv, hidden)), ("attn_v.bias", (kv,)),
            ("attn_output.weight", (hidden, hidden)), ("ffn_gate.weight", (intermediate, hidden)),
            ("ffn_up.weight", (intermediate, hidden)), ("ffn_down.weight", (hidden, intermediate)))}
    for name, shape in shapes.items():
        writer.add_tensor(name, rng.standard_normal(shape, dtype=np.float32) * 0.02)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sum(int(np.prod(shape)) for shape in shapes.values()) * 4


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_gguf_conversion_peaks_near_one_copy(tmp_path):
    """Peak RSS of de-quantising a GGUF (transformers' `load_gguf_checkpoint` for the tokenizer, the
    config and the tensors, which share one parse of the metadata) over the RSS before its first
    read, in a fresh process: ≤ 1.6x its float32 weights (212 MiB here). Regressions: transformers'
    read-only map of the file kept every page it had read resident until the last tensor was
    converted, so the conversion peaked at the weights plus the whole file (2.8x); the reader's
    parsed metadata stayed until the last tensor, and `np.copy` copied each de-quantised tensor once
    more (1.80x). Measured 1.45x (1.53x with a parse per read, 2.87x without `converting_gguf`: the
    metadata, parsed before the first tensor, and the tokenizer are the rest at this size)."""
    weights = _write_qwen2_gguf(tmp_path / "model.gguf", hidden=512, layers=8, intermediate=2048)
    out = subprocess.run([sys.executable, "-c", _GGUF_PEAK_SCRIPT, str(tmp_path / "model.gguf")],
                         capture_output=True, text=True, check=True)
    rss = json.loads(out.stdout.strip().splitlines()[-1])
    growth = rss["peak"] - rss["before"]
    assert growth <= 1.6 * weights, f"peak grew {growth / 2**20:.0f} MiB for {weights / 2**20:.0f} MiB of weights"
