"""Fixtures: a tiny byte-level BPE tokenizer with a ChatML template, and tiny random Llama and
Qwen2 models saved as local folders. Nothing here touches the network."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
import torch

# The suite's own cache folder (GEMM and schedule choices, conversions, compiled kernels), set
# before anything reads it and inherited by the commands and Ray workers the tests start: the
# choices a test run times on a busy machine never reach the user's cache.
_CACHE = tempfile.mkdtemp(prefix="slmclassify-tests-cache-")
os.environ["XDG_CACHE_HOME"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)

# The float32 kernel pinned (`backends.choice.fp32_kernel_of`), for the suite and the commands it starts: mm
# and oneDNN are both exact but round differently in the last digits, and which one a measurement
# picks can change between two measurements on a loaded machine (and each test's own cache folder
# measures again). Scores are the same bits in any batch for a given kernel (test_batch_invariance).
os.environ.pop("SLMCLASSIFY_FP32_KERNEL", None)

TEST_DEVICE = os.environ.get("SLMCLASSIFY_TEST_DEVICE", "cpu")
"""Where the engine and family tests run their tiny models, in float32: cpu, or cuda (`examples/gpu_check/gpu_check.sh`
runs tests/test_engine.py and tests/test_families.py again with SLMCLASSIFY_TEST_DEVICE=cuda)."""
if TEST_DEVICE.startswith("cuda"):
    # The tests' own Hugging Face forwards (hidden states, logits) in true float32 like the reference
    # path's (`core/reference.py`): cuDNN convolutions (LFM2's) default to TF32.
    torch.backends.cudnn.allow_tf32 = False


def kernels_or_skip(missing: str | None) -> pytest.MarkDecorator:
    """A C-kernel test module's `pytestmark`: skip it where its kernels do not build (`missing` says
    why; None: they built). With SLMCLASSIFY_REQUIRE_KERNELS=1 (`.ci/run`) a machine with a C compiler
    fails instead: a kernel that stopped compiling must not pass as a skipped module."""
    from slmclassify.backends import native

    if missing is not None and os.environ.get("SLMCLASSIFY_REQUIRE_KERNELS") == "1" and native.compiler():
        pytest.fail(f"SLMCLASSIFY_REQUIRE_KERNELS=1 and a C compiler is here ({native.compiler()}), but the C "
                    f"kernels are missing: {missing}", pytrace=False)
    return pytest.mark.skipif(missing is not None, reason=f"no C kernels: {missing}")


def assert_same_scores(got, want, engine, err_msg: str = "") -> None:
    """Scores of the same items from other batches: the same bits where `engine` is batch-invariant
    (`Engine.batch_variance`: its GEMMs probed so, and attention per row), else within float32 rounding."""
    import numpy as np

    if engine.batch_invariant:
        np.testing.assert_array_equal(got, want, err_msg=err_msg)
    else:
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, equal_nan=True, err_msg=err_msg)


def on_test_device(ids) -> torch.Tensor:
    """[1, n] token ids as a tensor on `TEST_DEVICE`, for a model's own forward in a test."""
    return torch.tensor([list(ids)], device=TEST_DEVICE)

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CORPUS = [
    "My card was charged twice for the same invoice.",
    "The mobile app crashes whenever I open the settings page.",
    "I need to change the email address on my profile.",
    "billing technical account shipping feedback accounting account_deletion",
    "You classify support tickets. Answer with exactly one of: billing, technical, account.",
    "Ticket: Category: refund parcel password login error crash invoice delivery",
    "I have been waiting for a response for several days now and would really appreciate an update.",
] * 20 + ["billing", "technical", "refund", "shipping", "feedback"] * 20


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(CORPUS, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    tok.chat_template = CHATML
    return tok


def _model(kind: str, vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        initializer_range=0.2, pad_token_id=0, eos_token_id=2,
    )
    torch.manual_seed(0 if kind == "llama" else 1)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=True, rope_theta=10000.0))
    model = Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=False, use_sliding_window=False))
    with torch.no_grad():  # HF initialises biases to zero; random ones test that they are handled
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.2)
    return model


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return _tokenizer()


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny_model_dir(request, tmp_path_factory, tiny_tokenizer):
    """A local model folder (config, safetensors, tokenizer) for each architecture."""
    folder = tmp_path_factory.mktemp(f"tiny-{request.param}")
    model = _model(request.param, len(tiny_tokenizer))
    model.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model_dir):
    from slmclassify import load_model

    return load_model(str(tiny_model_dir), device=TEST_DEVICE, precision="fp32")


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory, tiny_tokenizer):
    folder = tmp_path_factory.mktemp("tiny-llama-cli")
    _model("llama", len(tiny_tokenizer)).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(autouse=True)
def _isolated_config(tmp_path, monkeypatch):
    """Saved sweep settings of the user running the tests must not leak into them."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


@pytest.fixture(scope="session")
def llama_loaded(llama_dir):
    from slmclassify import load_model

    return load_model(str(llama_dir))


TINY_COMMON = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2, pad_token_id=0, eos_token_id=2,
)


def tiny_model(kind: str, vocab: int, seed: int = 0, **overrides):
    """A tiny random Llama or Qwen2 with `overrides` on top of TINY_COMMON; every bias random
    (HF initialises them to zero, which would hide a dropped bias)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if kind == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**TINY_COMMON, "vocab_size": vocab, **overrides}))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.2)
    return model


@pytest.fixture(scope="session")
def model_dir_factory(tmp_path_factory, tiny_tokenizer):
    """`make(kind, **config)` → a local model folder of a tiny random model with that config."""

    def make(kind: str, seed: int = 0, **overrides):
        folder = tmp_path_factory.mktemp(f"tiny-{kind}")
        tiny_model(kind, len(tiny_tokenizer), seed, **overrides).save_pretrained(folder)
        tiny_tokenizer.save_pretrained(folder)
        return folder

    return make


@pytest.fixture
def one_torch_thread(monkeypatch):
    """The tiny models gain nothing from intra-op threads, and on a busy 2-core machine their
    barriers make each run up to 20x slower; every command calls `set_threads()` at start."""
    from slmclassify.models import loading

    before = torch.get_num_threads()
    monkeypatch.setattr(loading, "set_threads", lambda: torch.set_num_threads(1) or 1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def run_main(monkeypatch, capsys):
    """Run the console entry point with argv; return (exit code, stdout, stderr)."""
    from slmclassify.cli.main import main

    def run(*args):
        monkeypatch.setattr("sys.argv", ["slmclassify", *map(str, args)])
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = 0 if exc.code is None else exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray of 2 CPUs for one test module (the Ray tests; skipped without the ray extra)."""
    ray = pytest.importorskip("ray")
    ray_data = pytest.importorskip("ray.data")
    from slmclassify.ray.local import start_ray

    assert start_ray(num_cpus=2), "Ray was up already: another test module left it running"
    ray_data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()
