"""Device and precision backends: each precision's fast path against the float32 reference on
tiny random Llama and Qwen2 models, the cached GEMM choice, `--precision auto`'s agreement gate,
and the CUDA kernels (skipped without a GPU)."""

from __future__ import annotations

import json
import shutil
from importlib import resources

import numpy as np
import pytest
import torch

from slmclassify import Classifier, EngineSettings
from slmclassify.errors import TaskError
from slmclassify.backends import attention, gemm, native
from slmclassify.backends.device import cpu_native
from slmclassify.backends.choice import CACHE_FILE, int8_choice, kernel_for, machine_key, model_key
from slmclassify.models.prepare import load_model
from slmclassify.models.precision import agreement

from helpers import BACKEND_TASK, LABEL_ARG, invoke, random_texts, write_input

pytestmark = pytest.mark.isa  # all of it runs again under `make test`'s ISA caps (Makefile)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
TASK = BACKEND_TASK


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _scores(model_dir, precision, device="cpu", n=24, task=TASK):
    clf = Classifier(task, model=load_model(str(model_dir), device=device, precision=precision))
    encoded = clf.encode(random_texts(n, seed=5))
    return clf, clf.score(encoded).scores, clf.reference(encoded, range(n))


# Tolerances on |Δ label log-prob|. The tiny random models have label log-probs of -10 .. -50
# (random weights of std 0.2): int8's ~1% per-GEMM error becomes up to ~0.9 there (measured 0.86),
# bf16's up to ~0.25; a wrong kernel (transposed weight, lost bias) gives tens.
TOLERANCE = {"fp32": 1e-4, "int8": 1.5, "bf16": 0.5, "fp16": 0.5}


@pytest.mark.parametrize("precision", ["fp32", "int8", "bf16"])
def test_precision_matches_reference(tiny_model_dir, precision):
    if precision == "bf16" and not cpu_native("bf16"):
        pytest.skip("this CPU has no native bf16")
    clf, fast, ref = _scores(tiny_model_dir, precision)
    assert clf.engine.backend.precision == precision
    diff = np.abs(fast - ref).max()
    assert diff <= TOLERANCE[precision], f"{precision}: max |Δ log-prob| {diff:.2e}\nfast:\n{fast}\nreference:\n{ref}"
    if precision == "fp32":
        assert (fast.argmax(1) == ref.argmax(1)).all()
    else:
        assert diff > 1e-3  # really computed in low precision
        agree = agreement(fast, ref)
        # 7-bit weights (CPUs without VNNI) double the weight step: 21/24 on the tiny Llama (the random
        # models' labels are nearly tied, so their argmax flips first)
        floor = 0.85 if precision == "int8" and gemm.int8_weight_levels(clf.engine.backend.gemm) == 63 else 0.9
        assert agree.share >= floor and agree.max_prob_diff <= 0.15, agree


def test_attention_kernel_matches_math(tiny_model_dir):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 7, 16), torch.randn(2, 2, 7, 16), torch.randn(2, 2, 7, 16)
    mask = torch.zeros(2, 1, 7, 7).masked_fill_(torch.rand(2, 1, 7, 7) < 0.3, float("-inf"))
    mask[..., 0] = 0  # every query sees one key
    for m, causal in ((None, True), (None, False), (mask, True)):
        out, lse = attention.attend_cpu(q, k, v, m, causal)
        ref_out, ref_lse = attention.attend_math(q, k, v, m, causal)
        torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("n", [64, 71, 100])
def test_causal_attention_in_query_blocks_matches_math(monkeypatch, n, masked):
    """Causal attention over >= 2 blocks of queries runs block by block (each against the keys up to
    its end, through the rows of an upper-triangular mask, or of the caller's mask when it says the
    mask is `lower`): the same output and log-sum-exp as one call, with a last block shorter than
    the others (71, 100) and from strided q/k/v as the engine passes them (views of one
    [B, W, H + 2 H_kv, D] tensor)."""
    torch.manual_seed(0)
    heads = torch.randn(3, n, 6 + 2 * 2, 16).transpose(1, 2)  # [B, H + 2 H_kv, W, D]
    q, k, v = heads[:, :6], heads[:, 6:8], heads[:, 8:]
    mask = None
    if masked:  # random holes below the diagonal, every key after its query hidden, the diagonal kept
        hidden = (torch.rand(3, 1, n, n) < 0.3) | torch.ones(n, n, dtype=torch.bool).triu(1)
        mask = torch.zeros(3, 1, n, n).masked_fill_(hidden & ~torch.eye(n, dtype=torch.bool), float("-inf"))
    assert n >= 2 * attention.CAUSAL_BLOCK
    calls = []
    original = attention._CPU_FLASH
    monkeypatch.setattr(attention, "_CPU_FLASH", lambda *a, **kw: calls.append(a[0].shape[2]) or original(*a, **kw))
    out, lse = attention.attend_cpu(q, k, v, mask, lower=masked)
    assert calls == [min(attention.CAUSAL_BLOCK, n - s) for s in range(0, n, attention.CAUSAL_BLOCK)]
    ref_out, ref_lse = attention.attend_math(q, k, v, mask, True)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(gemm.int8_engine() is None, reason="this PyTorch has no quantized CPU engine")
def test_int8_quantises_activations_per_token():
    """One token with large activations (as the chat template's special tokens have) must not
    cost the other tokens of the batch their precision, and a bias is added once, unscaled."""
    torch.manual_seed(0)
    w, bias = torch.randn(64, 48) * 0.05, torch.randn(48)
    op = gemm.KERNELS[gemm.int8_engine()](w, bias, torch.float32)
    x = torch.randn(9, 64)
    x[0] *= 300  # the outlier token
    exact = torch.addmm(bias, x, w)
    got = op(x)
    rel = ((got - exact).abs().amax(1) / exact.abs().amax(1))
    assert rel.max() < 0.03, rel  # per-tensor activation scales gave ~0.7 on the other rows
    alone = op(x[1:])  # the other rows without the outlier: nearly the same results
    assert ((alone - got[1:]).abs().max() / exact[1:].abs().max()) < 0.01


@pytest.mark.parametrize("kernel", ["int8-eager", "int8-fused", "int8-maddubs"])
def test_int8_products_are_exact_on_this_cpu(kernel):
    """Full-range 8-bit activations times the op's int8 weights give the exact integer product on
    whatever instruction set this runs under (`make test` runs it under AVX2 and AVX-512-without-VNNI
    caps too): without VNNI, 8-bit weights saturated oneDNN's 16-bit pair sums (errors of 1e6 on
    the AVX2 cap), so the weights have 7 bits there."""
    kernel = gemm.int8_engine() if kernel == "int8-eager" else kernel
    if kernel is None or (kernel == "int8-fused" and gemm.int8_kernels.load() is None) or (
            kernel == "int8-maddubs" and not gemm.int8_kernels.has_maddubs(gemm.int8_kernels.load())):
        pytest.skip(f"{kernel} does not run here")
    levels = gemm.int8_weight_levels(kernel)
    assert levels in (127, 63)
    assert gemm._int8_exact(kernel, levels)
    if levels == 63:
        assert not gemm._int8_exact(kernel, 127)  # 7 bits only where 8 really saturate
        assert "7-bit weights" in gemm.int8_arithmetic(kernel)


def _no_int8_op(kernel, levels):
    raise RuntimeError("no such op")


@pytest.mark.parametrize("probe", [lambda kernel, levels: False, _no_int8_op], ids=["saturates", "missing"])
def test_int8_is_refused_where_no_weight_width_is_exact(monkeypatch, probe):
    engine = gemm.int8_engine()
    if engine is None:
        pytest.skip("no quantized CPU engine here")
    monkeypatch.setattr(gemm, "_int8_exact", probe)
    gemm.int8_weight_levels.cache_clear()
    try:
        assert not cpu_native("int8")  # so --precision auto never tries it
        with pytest.raises(TaskError, match=r"precision int8 cannot run on this CPU: .*not exact even with 7-bit weights; use precision fp32"):
            kernel_for("int8", torch.device("cpu"), int8_kernel=engine)
    finally:
        gemm.int8_weight_levels.cache_clear()


@pytest.mark.parametrize("env, march", [
    ({}, "native"),
    ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, "x86-64-v3"),
    ({"ATEN_CPU_CAPABILITY": "avx2"}, "x86-64-v3"),
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "ATEN_CPU_CAPABILITY": "avx2"}, "x86-64-v3"),  # the lower cap
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, "x86-64-v4"),
    ({"ONEDNN_MAX_CPU_ISA": "ALL"}, "native"),
])
def test_c_kernels_follow_the_isa_cap(monkeypatch, env, march):
    """One capped run computes as a CPU of that level would, the C kernels included."""
    from slmclassify.backends import isa, native

    monkeypatch.setattr(isa.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(isa, "native_flags", lambda: frozenset({"avx2", "fma", "avx512f", "avx512_vnni"}))
    for name in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert isa.march() == march
    assert f"-march={march}" in native.compile_flags()


def test_gemm_choice_is_cached_and_reused(llama_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("SLMCLASSIFY_FP32_KERNEL", raising=False)  # the measured choice, not the suite's pin
    loaded = load_model(str(llama_dir), device="cpu")
    assert loaded.gemm_rates["cached"] is False
    assert loaded.backend.gemm == loaded.gemm_rates["gemm"] in loaded.gemm_rates["rates"]
    path = tmp_path / "cache" / "slmclassify" / CACHE_FILE
    stored = json.loads(path.read_text())
    key = f"{machine_key(torch.device('cpu'))}|{model_key(loaded.model.config)}"
    assert stored[key]["gemm"] == loaded.backend.gemm
    # A planted choice is reused as is: nothing is re-timed.
    other = "onednn" if loaded.backend.gemm == "mm" else "mm"
    stored[key]["gemm"] = other
    stored[key].pop("provisional", None)  # as if measured on a quiet machine
    path.write_text(json.dumps(stored))
    again = load_model(str(llama_dir), device="cpu")
    assert again.gemm_rates["cached"] is True
    assert again.backend.gemm == other
    clf = Classifier(TASK, model=again)
    encoded = clf.encode(random_texts(6, seed=1))
    assert np.abs(clf.score(encoded).scores - clf.reference(encoded, range(6))).max() <= 1e-4


def test_rates_measured_on_a_busy_machine_are_measured_again_when_quiet(llama_dir, monkeypatch):
    from slmclassify.backends import choice
    from slmclassify.cache import cache_root

    monkeypatch.setattr(choice, "machine_load", lambda: 3.0)  # busy: 3 runnable tasks per core
    monkeypatch.setattr(choice, "others_share", lambda before: 0.0)  # only the load average says busy here
    busy = load_model(str(llama_dir), device="cpu").gemm_rates
    assert busy["cached"] is False and busy["provisional"] is True and busy["load_per_core"] == 3.0
    assert load_model(str(llama_dir), device="cpu").gemm_rates["cached"] is True  # still busy: reused
    monkeypatch.setattr(choice, "machine_load", lambda: 0.5)
    assert load_model(str(llama_dir), device="cpu").gemm_rates["cached"] is True  # this process measured it
    monkeypatch.setattr(choice, "_MEASURED_HERE", set())  # a later start
    quiet = load_model(str(llama_dir), device="cpu").gemm_rates
    assert quiet["cached"] is False and "provisional" not in quiet
    stored = json.loads((cache_root() / CACHE_FILE).read_text())
    assert [entry.get("provisional") for entry in stored.values()] == [None]
    assert load_model(str(llama_dir), device="cpu").gemm_rates["cached"] is True


def _plant_rates(model_dir, rates: dict) -> None:
    """Pretend the GEMM measurement found these rates (the auto gate then reads them)."""
    loaded = load_model(str(model_dir), device="cpu")
    key = f"{machine_key(torch.device('cpu'))}|{model_key(loaded.model.config)}"
    from slmclassify.cache import cache_root

    path = cache_root() / CACHE_FILE
    stored = json.loads(path.read_text())
    stored[key]["rates"].update(rates)
    stored[key]["gemm"] = "mm"
    stored[key]["int8"] = int8_choice(stored[key]["rates"])
    stored[key].pop("provisional", None)  # as if measured on a quiet machine
    path.write_text(json.dumps(stored))


def test_auto_picks_a_faster_low_precision_that_agrees(llama_dir, monkeypatch):
    from slmclassify.models import precision as prec

    kernel = kernel_for("int8", torch.device("cpu"))
    _plant_rates(llama_dir, {"mm": 10.0, "onednn": 9.0, kernel: 40.0, "bf16": 0.0, "fp16": 0.0})
    clf = Classifier(TASK, model=str(llama_dir), settings=EngineSettings(device="cpu", precision="auto"))
    assert clf.loaded.auto_decision["tried"]["int8"]["n"] == prec.AGREEMENT_ITEMS
    share = clf.loaded.auto_decision["tried"]["int8"]["agree"] / prec.AGREEMENT_ITEMS
    expected = "int8" if share >= prec.MIN_AGREEMENT else "fp32"
    assert clf.engine.backend.precision == expected == clf.loaded.auto_decision["precision"]


def test_auto_rejects_a_low_precision_that_disagrees(llama_dir, monkeypatch):
    """A faster precision whose predictions differ from fp32 on > 1% of items is not picked."""
    from slmclassify.models import precision as prec

    kernel = kernel_for("int8", torch.device("cpu"))
    _plant_rates(llama_dir, {"mm": 10.0, "onednn": 9.0, kernel: 40.0, "bf16": 0.0, "fp16": 0.0})
    real = prec.agreement
    monkeypatch.setattr(prec, "agreement", lambda low, fp32: real(-low, fp32))  # a broken precision
    clf = Classifier(TASK, model=str(llama_dir), settings=EngineSettings(device="cpu", precision="auto"))
    assert clf.loaded.auto_decision["precision"] == "fp32"
    assert clf.loaded.auto_decision["tried"]["int8"]["agree"] < prec.AGREEMENT_ITEMS
    assert clf.engine.backend.precision == "fp32"
    encoded = clf.encode(random_texts(5, seed=2))
    assert np.abs(clf.score(encoded).scores - clf.reference(encoded, range(5))).max() <= 1e-4


def test_auto_never_tries_a_precision_that_is_not_faster(llama_dir):
    slow_int8 = {kernel: 10.0 for kernel in gemm.KERNELS if kernel.startswith("int8")}
    _plant_rates(llama_dir, {"mm": 50.0, "onednn": 40.0, **slow_int8, "bf16": 1.0, "fp16": 1.0})
    clf = Classifier(TASK, model=str(llama_dir), settings=EngineSettings(device="cpu", precision="auto"))
    assert clf.loaded.auto_decision == {"precision": "fp32", "tried": {}, "sample": "200 article tickets",
                                        "cached": False}


@pytest.mark.parametrize("cap, left", [
    (None, {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "fma"}),
    ("ALL", {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "fma"}),
    ("avx2", {"avx2", "fma"}),
    ("AVX512_CORE_VNNI", {"avx2", "avx512f", "avx512_vnni", "fma"}),
    ("AVX512_CORE_AMX", {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "fma"}),
])
def test_onednn_isa_cap_hides_the_flags_above_it(cap, left):
    """Under ONEDNN_MAX_CPU_ISA=AVX2 an AVX-512 machine's bf16 matmuls crawl (~1 GFLOP/s, measured):
    bf16 must then not count as native, so neither auto nor bench tries it."""
    from slmclassify.backends import isa

    flags = frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "fma"})
    assert flags - isa.above_cap(flags, cap) == left


def test_cpu_native_follows_the_isa_cap(monkeypatch):
    from slmclassify.backends import device, isa

    flags = frozenset("fpu avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile".split())
    monkeypatch.setattr(isa, "native_flags", lambda: flags)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    isa.cpu_flags.cache_clear()
    try:
        assert not device.cpu_native("bf16") and device.matmul_flags() == ["avx2"]
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
        isa.cpu_flags.cache_clear()
        assert device.cpu_native("bf16")
    finally:
        isa.cpu_flags.cache_clear()


def test_bf16_is_not_a_candidate_without_native_support(monkeypatch):
    from slmclassify.backends import device, isa

    monkeypatch.setattr(isa, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert not device.cpu_native("bf16") and not device.cpu_native("fp16")
    from slmclassify.models.precision import candidates

    measured = {"gemm": "mm", "rates": {"mm": 10.0, "bf16": 100.0, "fp16": 100.0}}
    assert candidates(measured, torch.device("cpu")) == []


def test_bad_device_and_precision_are_clear_errors():
    from slmclassify.errors import TaskError

    with pytest.raises(TaskError, match="^precision must be one of"):
        EngineSettings(precision="int4")
    with pytest.raises(TaskError, match="^device must be one of"):
        EngineSettings(device="tpu")
    if not torch.cuda.is_available():
        from slmclassify.backends.device import resolve_device

        with pytest.raises(TaskError, match="no CUDA device"):
            resolve_device("cuda")


@cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_cuda_matches_reference(tiny_model_dir, precision):
    clf, fast, ref = _scores(tiny_model_dir, precision, device="cuda")
    assert clf.engine.device.type == "cuda" and clf.loaded.model.device.type == "cuda"
    assert np.abs(fast - ref).max() <= TOLERANCE[precision]
    assert agreement(fast, ref).share >= 0.9


@cuda
def test_cuda_attention_matches_math():
    torch.manual_seed(0)
    dev = torch.device("cuda")
    q, k, v = (torch.randn(2, h, 37, 64, device=dev) for h in (4, 2, 2))
    mask = torch.zeros(2, 1, 37, 37, device=dev).masked_fill_(torch.rand(2, 1, 37, 37, device=dev) < 0.3, float("-inf"))
    mask[..., 0] = 0
    for m, causal in ((None, True), (None, False), (mask, True)):
        out, lse = attention.attend_cuda(q, k, v, m, causal)
        ref_out, ref_lse = attention.attend_math(q, k, v, m, causal)
        torch.testing.assert_close(out, ref_out, atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(lse, ref_lse, atol=2e-4, rtol=2e-4)


def test_verify_int8_reports_agreement_with_fp32(llama_dir, tmp_path):
    src = write_input(tmp_path / "in.csv")
    result = invoke("verify", src, "--labels", LABEL_ARG, "--model", llama_dir, "--device", "cpu",
                    "--precision", "int8", "--n", 3)
    assert "engine: cpu int8 (int8-" in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert "agree with the float32 per-item path, max |Δ probability| " in line
    assert "(int8: ≥ 99% agree)" in line or "(int8: AGREEMENT TOO LOW)" in line


def test_task_file_precision_and_flag_precedence(llama_dir, tmp_path):
    src = write_input(tmp_path / "in.csv")
    task = tmp_path / "task.toml"
    task.write_text(f'labels = {list(LABEL_ARG.split(","))!r}\nprecision = "int8"\ndevice = "cpu"\n'.replace("'", '"'))
    result = invoke("verify", src, "--task", task, "--model", llama_dir, "--n", 2)
    assert "engine: cpu int8 (" in result.stderr
    result = invoke("verify", src, "--task", task, "--model", llama_dir, "--n", 2, "--precision", "fp32")
    assert "engine: cpu fp32 (" in result.stderr
    assert "(identical predictions)" in result.stderr


def test_plain_transformers_token_budget_rows_match_the_loop(llama_loaded):
    """bench's (h) rows (run on CUDA) are device-agnostic: on CPU in float32 they equal the loop."""
    from slmclassify.bench.plain_transformers import token_budget_scores
    from slmclassify.bench.article import article_loop
    from slmclassify.core.article_tickets import ARTICLE_TASK

    clf = Classifier(ARTICLE_TASK, model=llama_loaded)
    texts = random_texts(9, seed=4, max_words=30)
    prompts = [clf.renderer.render(t) for t in texts]
    loop = article_loop(llama_loaded, prompts, ARTICLE_TASK.labels)
    for prefix in ([], clf.prefix_ids):
        scores, padding = token_budget_scores(llama_loaded, prompts, ARTICLE_TASK.labels, prefix, budget=200, max_rows=4)
        assert np.abs(scores - loop).max() <= 1e-4
        assert 0 <= padding < 1


def test_float32_prefers_mm_unless_a_copying_kernel_is_clearly_faster():
    """oneDNN's prepacked layout is a second copy of the weights (+1.4 GB on a 0.5B model for 3.5%):
    it is chosen only when ≥ MIN_COPY_SPEEDUP faster than mm, which computes with the shared weights."""
    from slmclassify.backends.choice import MIN_COPY_SPEEDUP, fp32_choice

    cpu = torch.device("cpu")
    assert fp32_choice({"mm": 10.0, "onednn": 10.0 * MIN_COPY_SPEEDUP - 0.1}, cpu) == "mm"
    assert fp32_choice({"mm": 10.0, "onednn": 9.0}, cpu) == "mm"
    if torch.backends.mkldnn.is_available():
        assert fp32_choice({"mm": 10.0, "onednn": 10.0 * MIN_COPY_SPEEDUP}, cpu) == "onednn"


def test_machine_key_names_the_isa_cap(monkeypatch):
    """A GEMM choice or precision decision measured with every instruction is not reused under a cap."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    full = machine_key(torch.device("cpu"))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    assert machine_key(torch.device("cpu")) != full and "ONEDNN_MAX_CPU_ISA=AVX2" in machine_key(torch.device("cpu"))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "ALL")
    assert machine_key(torch.device("cpu")) == full


def test_machine_key_changes_with_the_int8_kernels(monkeypatch, tmp_path):
    """A changed C kernel (its .c file or a header it includes) is timed again at the next load instead
    of being judged by its old rate."""
    before = machine_key(torch.device("cpu"))
    with resources.as_file(native.csrc()) as folder:
        shutil.copytree(folder, tmp_path / "csrc")
    monkeypatch.setattr(native, "csrc", lambda: tmp_path / "csrc")
    assert machine_key(torch.device("cpu")) == before
    with open(tmp_path / "csrc" / "vexp.h", "a") as fh:
        fh.write("/* changed */\n")
    assert machine_key(torch.device("cpu")) != before


def test_the_float32_kernel_can_be_pinned(llama_dir, monkeypatch):
    """SLMCLASSIFY_FP32_KERNEL picks the exact kernel whatever was measured; a kernel that does not run
    here is one clear error naming the variable and what it can be."""
    from slmclassify.errors import TaskError

    kernels = ["ordered", "mm"] + (["onednn"] if torch.backends.mkldnn.is_available() else [])
    for kernel in kernels:
        monkeypatch.setenv("SLMCLASSIFY_FP32_KERNEL", kernel)
        assert load_model(str(llama_dir), device="cpu", precision="fp32").backend.gemm == kernel
    monkeypatch.setenv("SLMCLASSIFY_FP32_KERNEL", "int8-fused")
    with pytest.raises(TaskError, match=r"^SLMCLASSIFY_FP32_KERNEL=int8-fused is not a float32 kernel that runs "
                                        r"here; set it to one of ordered, mm"):
        load_model(str(llama_dir), device="cpu", precision="fp32")
