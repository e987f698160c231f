"""Every configuration the loader accepts is computed exactly by the fast path, or refused at
load time with the setting named (issue 8, item 2). Tiny random models with the configs of the
popular small instruct models: the fast path must give the reference path's label
log-probabilities (≤ 1e-4) in every mode."""

from __future__ import annotations

import numpy as np
import pytest

from slmclassify import Classifier, EngineSettings, ModelLoadError, Task, load_model
from slmclassify.core.config_check import context_limit

from helpers import assert_matches_reference, assert_refused_before_weights, random_texts

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "high_freq_factor": 4.0,
               "low_freq_factor": 1.0, "original_max_position_embeddings": 64}

EXACT = {
    # Llama 3.2 1B/3B: rope type llama3, tied embeddings, grouped-query attention.
    "llama3.2": ("llama", dict(rope_parameters=LLAMA3_ROPE, tie_word_embeddings=True)),
    # SmolLM2-360M: 15 heads over 5 KV heads (3 per group), head_dim 64 = 960/15, tied.
    "smollm2-360m": ("llama", dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=1,
                                   rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
                                   tie_word_embeddings=True)),
    # SmolLM2-1.7B: plain multi-head attention (32 KV heads = 32 heads), tied.
    "smollm2-1.7b-mha": ("llama", dict(num_attention_heads=4, num_key_value_heads=4,
                                       rope_parameters={"rope_type": "default", "rope_theta": 130000.0},
                                       tie_word_embeddings=True)),
    # Qwen2.5 0.5B/1.5B: q/k/v biases, tied; 3B: untied.
    "qwen2.5-tied": ("qwen2", dict(tie_word_embeddings=True, use_sliding_window=False)),
    "qwen2.5-untied": ("qwen2", dict(tie_word_embeddings=False, num_attention_heads=8, num_key_value_heads=2,
                                     use_sliding_window=False)),
    "head_dim-not-hidden/heads": ("llama", dict(head_dim=32, num_attention_heads=4, num_key_value_heads=2)),
    "qwen2-head_dim-24": ("qwen2", dict(head_dim=24, use_sliding_window=False)),
    "llama-attention-and-mlp-bias": ("llama", dict(attention_bias=True, mlp_bias=True)),
    "llama-gelu": ("llama", dict(hidden_act="gelu_pytorch_tanh")),
    "yarn": ("llama", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                            "original_max_position_embeddings": 64})),
    "linear": ("llama", dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})),
    # Qwen2's sliding window, far shorter than the prompts: masked by the window, the prefix included
    "qwen2-sliding-window": ("qwen2", dict(use_sliding_window=True, sliding_window=20, max_window_layers=1)),
}

# Exact only up to a length: the classifier caps prompts there (longer items are truncated).
CAPPED = {
    "dynamic": ("llama", dict(max_position_embeddings=96,
                              rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}), 96),
    "longrope": ("llama", dict(max_position_embeddings=256, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 80,
        "short_factor": [1.0 + 0.1 * i for i in range(8)], "long_factor": [2.0 + 0.5 * i for i in range(8)]}), 80),
}


@pytest.fixture(scope="module")
def loaded_configs(model_dir_factory):
    cache = {}

    def get(name):
        if name not in cache:
            kind, config, *_ = {**EXACT, **CAPPED}[name]
            cache[name] = load_model(str(model_dir_factory(kind, seed=len(cache), **config)))
        return cache[name]

    return get


def _labels(mode):
    return ("billing", "technical", "account") if mode == "first" else ("billing", "technical", "account", "accounting")


@pytest.mark.isa  # the kernels on each config's shapes (head_dim, biases, GQA); the refusals need no ISA cap
@pytest.mark.parametrize("name", list(EXACT))
@pytest.mark.parametrize("mode", ["first", "full"])
def test_config_is_exact(loaded_configs, name, mode):
    loaded = loaded_configs(name)
    clf = Classifier(Task(labels=_labels(mode), mode=mode, user_template="Ticket: {text}"), model=loaded,
                     settings=EngineSettings(token_budget=300, max_rows=4))
    assert_matches_reference(clf, random_texts(7, seed=17, max_words=50))


@pytest.mark.isa
@pytest.mark.parametrize("name", list(CAPPED))
def test_length_dependent_configs_are_capped_and_exact(loaded_configs, name):
    """Dynamic and longrope rotary frequencies change beyond a length: prompts are capped there, so
    long items are truncated (not scored with the wrong frequencies), and every item is exact."""
    loaded = loaded_configs(name)
    limit = CAPPED[name][2]
    assert context_limit(loaded.model.config) == limit
    clf = Classifier(Task(labels=_labels("full"), mode="full"), model=loaded)
    texts = random_texts(5, seed=3, max_words=20) + random_texts(3, seed=4, max_words=200)[:3]
    texts[-1] = " ".join(["refund parcel login"] * 80)  # far beyond the cap
    encoded = clf.encode(texts)
    longest_label = max(len(s) for s in clf.trie.sequences)
    assert max(len(ids) for ids in encoded.ids) + longest_label <= limit
    assert "truncated" in list(encoded.status)
    assert_matches_reference(clf, texts)


REFUSED = [
    ("llama", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                   "original_max_position_embeddings": 64, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor=0.5"),
    ("llama", {"partial_rotary_factor": 0.25}, "partial_rotary_factor=0.25"),
    ("llama", {"rope_parameters": {"rope_type": "proportional", "rope_theta": 10000.0}}, "rope_type='proportional'"),
    ("llama", {"hidden_act": "no_such_activation"}, "hidden_act='no_such_activation'"),
    ("qwen2", {"layer_types": ["full_attention", "chunked_attention"]}, "layer_types='chunked_attention'"),
    ("llama", {"model_type": "gpt_neox"}, "architecture 'gpt_neox'"),
]


@pytest.mark.parametrize("kind,edit,named", REFUSED, ids=[r[2] for r in REFUSED])
def test_unsupported_config_refused_before_loading_weights(tmp_path, model_dir_factory, kind, edit, named):
    assert_refused_before_weights(model_dir_factory(kind), tmp_path, edit, named)


def test_engine_refuses_a_config_changed_after_loading(loaded_configs):
    """The engine checks too: a model built in Python (not through load_model) cannot slip past."""
    from slmclassify.core.engine import Engine

    loaded = loaded_configs("linear")
    config = loaded.model.config
    before = config.hidden_act
    config.hidden_act = "no_such_activation"
    try:
        with pytest.raises(ModelLoadError, match="hidden_act"):
            Engine(loaded.model)
    finally:
        config.hidden_act = before


def test_weights_are_held_once(loaded_configs):
    """The Hugging Face modules compute with the engine's tensors (transposed views): all weights
    together take the model's parameter bytes plus the interleaved q/k copies, nothing more."""
    import torch

    from slmclassify.backends.device import Backend
    from slmclassify.models.engines import with_backend

    # The float32 kernel `mm` (MmLinear: `torch.mm` on the shared [in, out] tensors), whichever kernel
    # this CPU's GEMM choice picked for the loaded model (oneDNN keeps a blocked copy: `weight_copy_bytes`)
    loaded = with_backend(loaded_configs("llama-attention-and-mlp-bias"),
                          Backend(device=torch.device("cpu"), precision="fp32", gemm="mm"))
    clf = Classifier(Task(labels=("billing", "technical")), model=loaded)
    layer, arranged = loaded.model.model.layers[0], clf.engine.layers[0]
    mlp, attn = layer.mlp, layer.self_attn
    for module, op in ((mlp.gate_proj, arranged.gate_up), (mlp.up_proj, arranged.gate_up),
                       (mlp.down_proj, arranged.down), (attn.o_proj, arranged.o), (attn.v_proj, arranged.qkv)):
        assert module.weight.untyped_storage().data_ptr() == op.weight.untyped_storage().data_ptr()

    storages = {}
    tensors = [*loaded.model.parameters()] + [
        t for a in clf.engine.layers for op in (a.qkv, a.o, a.gate_up, a.down) for t in (op.weight, op.bias)
        if t is not None]
    for t in tensors:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    model_bytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    cfg = loaded.model.config
    rotated = (cfg.num_attention_heads + cfg.num_key_value_heads) * cfg.head_dim
    qk_copies = cfg.num_hidden_layers * rotated * (cfg.hidden_size + 1) * 4  # weights and biases
    assert sum(storages.values()) == model_bytes + qk_copies


@pytest.mark.parametrize("name", ["llama-attention-and-mlp-bias", "qwen2.5-untied", "head_dim-not-hidden/heads"])
def test_sharing_weights_leaves_the_reference_model_unchanged(tiny_tokenizer, name):
    """The reference path is the oracle only if building the engine (which makes the module's
    weights views of its own tensors) leaves the Hugging Face forward as it was."""
    import torch

    from conftest import tiny_model
    from slmclassify.core.engine import Engine

    kind, config = EXACT[name]
    model = tiny_model(kind, len(tiny_tokenizer), seed=5, **config).eval()
    ids = torch.tensor([tiny_tokenizer("my card was charged twice, the app crashes")["input_ids"]])
    with torch.inference_mode():
        before = model(input_ids=ids).logits
        Engine(model)
        after = model(input_ids=ids).logits
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5)


@pytest.mark.isa
@pytest.mark.parametrize("mode", ["first", "full"])
@pytest.mark.parametrize("name", ["smollm2-360m", "qwen2.5-untied", "qwen2-head_dim-24", "llama-attention-and-mlp-bias"])
def test_causal_attention_in_query_blocks_is_exact(loaded_configs, monkeypatch, name, mode):
    """Row attention in blocks of 4 queries (`attention.CAUSAL_BLOCK`), causal or with the trie mask's
    rows (full mode): exact on both architectures, with grouped-query attention, q/k/v biases and a
    head width that is not a power of two."""
    from slmclassify.backends import attention

    monkeypatch.setattr(attention, "CAUSAL_BLOCK", 4)
    blocked = []
    original = attention._causal_blocks
    monkeypatch.setattr(attention, "_causal_blocks", lambda q, *a: blocked.append(q.shape[2]) or original(q, *a))
    clf = Classifier(Task(labels=_labels(mode), mode=mode, user_template="Ticket: {text}"), model=loaded_configs(name),
                     settings=EngineSettings(token_budget=300, max_rows=4))
    assert_matches_reference(clf, random_texts(7, seed=17, max_words=50))
    assert blocked
