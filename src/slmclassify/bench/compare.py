"""`slmclassify bench`: the article's experiment and ours, side by side in one process.

Configurations (same model, same threads, same items):
  a  the article's per-item loop: full prompt, logits_to_keep=1, first-token scoring
     (timed interleaved with d, batch by batch, so that a drifting machine speed hits both alike)
  b  the article's fixed batches of 32, arbitrary order (HF forward, left padding)
  c  the article's fixed batches of 32, sorted by length
  d  ours, default settings (prefix cache, sorted token-budget batches)
  e  ablations of ours, one change each: no prefix cache; fixed batches of 32; unsorted
  f  llama.cpp on the same GGUF, item by item with its prompt prefix reused (if llama-cpp-python
     is importable and the model is a GGUF)
  g  ours in the other precisions this machine runs natively (CPU: int8, bf16 where native;
     agreement is with (a), float32). Each is timed interleaved with (d) on the same batches
     (d's batches planned once; each batch scored by d and by g in turn, the order alternating),
     so that its speed-up is (g over d, interleaved) x (d over a, interleaved) and a machine whose
     speed drifts between rows cannot move it; its seconds are d's seconds / (g over d), i.e.
     what g would have taken at the speed the machine had during (d)
  i  CTranslate2 fp32 and int8 on the same weights (converted once into the user cache; if
     ctranslate2 is importable, on a CPU), with its best recipe for this job: the shared prefix as
     its cached `static_prompt`, one step of vocabulary logits, items sorted by length; per item
     and in batches of 2 (its fastest batching), all timed interleaved with (d) like (g); each row is the faster mode
     (`bench_ct2`)
  h  on CUDA: the best plain-transformers configurations (sorted token-budget batches, with and
     without a prefix cache; `backends.hf_plain`)
On CUDA the Hugging Face rows (a, b, c, h) run in bfloat16, as a user would run them there.
Every row reports agreement with (a) and the largest |Δ label log-probability|.
"""

from __future__ import annotations

import json
import platform
import resource
import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch

from ..classifier import Classifier, EngineSettings
from ..models.loading import LoadedModel, with_backend
from ..core.task import Task

SCHEMA_VERSION = 1


@dataclass
class BenchRow:
    """One configuration's measurements."""

    name: str
    description: str
    seconds: float
    items: int
    prompt_tokens: int
    """Tokens of every item's full prompt (what the per-item loop runs)."""
    padding: float | None = None
    """Share of processed tokens that were padding (None: not batched)."""
    speedup: float = 0.0
    """items/s over configuration (a)."""
    agree: int = 0
    """Items whose label equals (a)'s."""
    max_abs_diff: float = 0.0
    """Largest |Δ label log-probability| against (a)."""
    roofline: float | None = None
    """Achieved share of the measured float32 matmul rate (ours only)."""
    vs_d: float | None = None
    """items/s over (d), timed interleaved with it batch by batch on the same batches (g rows)."""
    peak_rss_mb: float | None = None

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.prompt_tokens / self.seconds


@dataclass
class BenchReport:
    rows: list[BenchRow] = field(default_factory=list)
    machine: dict = field(default_factory=dict)
    matmul_gflops: float = 0.0
    prompt_lengths: dict = field(default_factory=dict)
    work_tokens: int = 0
    """The roofline's useful tokens: every scored item's prompt tokens after the shared prefix."""
    flops_per_token: int = 0
    """2 × the model's non-embedding parameters."""
    engine: str = ""
    """Device, precision and GEMM kernel of (d), with the measured kernel rates (`run.engine_line`)."""

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA_VERSION,
            "machine": self.machine,
            "matmul_gflops": round(self.matmul_gflops, 2),
            "work_tokens": self.work_tokens,
            "flops_per_token": self.flops_per_token,
            "prompt_lengths": self.prompt_lengths,
            "engine": self.engine,
            "rows": [
                {**asdict(r), "items_per_s": round(r.items_per_s, 3), "tokens_per_s": round(r.tokens_per_s, 1)}
                for r in self.rows
            ],
        }

    def table(self) -> str:
        head = f"{'config':<30} {'s':>7} {'items/s':>8} {'tok/s':>7} {'pad%':>6} {'speedup':>7} {'agree':>9} {'max|Δ|':>8} {'roofline':>8}"
        lines = [head, "-" * len(head)]
        for r in self.rows:
            pad = f"{100 * r.padding:.1f}" if r.padding is not None else "-"
            roof = f"{r.roofline:.2f}" if r.roofline is not None else "-"
            lines.append(
                f"{r.name:<30} {r.seconds:>7.2f} {r.items_per_s:>8.2f} {r.tokens_per_s:>7.0f} {pad:>6} "
                f"{r.speedup:>6.2f}x {f'{r.agree}/{r.items}':>9} {r.max_abs_diff:>8.1e} {roof:>8}"
            )
        return "\n".join(lines)


def machine_info() -> dict:
    import transformers

    from ..backends.choice import cpu_name

    return {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": cpu_name(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def matmul_rate(model: torch.nn.Module, rows: int = 2048, repeats: int = 5) -> float:
    """float32 GFLOP/s of the model's own linear-layer shapes at `rows` tokens (best of repeats)."""
    shapes = sorted({tuple(m.weight.shape) for m in model.model.layers[0].modules()
                     if isinstance(m, torch.nn.Linear)})
    xs = {k: torch.randn(rows, k) for _, k in shapes}
    ws = [torch.randn(k, n) for n, k in shapes]
    flops = sum(2 * rows * n * k for n, k in shapes)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats):
            start = time.perf_counter()
            for (_, k), w in zip(shapes, ws):
                torch.mm(xs[k], w)
            best = min(best, time.perf_counter() - start)
    return flops / best / 1e9


def roofline(work_tokens: int, flops_per_token: int, seconds: float, matmul_gflops: float) -> float:
    """Achieved share of the measured matmul rate: useful GFLOP/s over the measured GFLOP/s."""
    return (work_tokens * flops_per_token / seconds / 1e9) / matmul_gflops


def non_embedding_params(model: torch.nn.Module) -> int:
    """Parameters outside the input embedding and the output head (counted once when tied)."""
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    total = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    return total - embed.numel() - (0 if head is embed else head.numel())


# --- the article's code paths (a, b, c), as in the article ----------------------------------

def _article_first_ids(tokenizer, labels) -> torch.Tensor:
    return torch.tensor([tokenizer.encode(label, add_special_tokens=False)[0] for label in labels])


@torch.inference_mode()
def article_loop(loaded: LoadedModel, prompts: list[str], labels) -> np.ndarray:
    """(a): one forward per item, full prompt, last position only, first-token scores."""
    tok, model = loaded.tokenizer, loaded.model
    first = _article_first_ids(tok, labels)
    out = np.zeros((len(prompts), len(labels)))
    for i, prompt in enumerate(prompts):
        inputs = tok(prompt, add_special_tokens=False, return_tensors="pt").to(model.device)
        logits = model(**inputs, logits_to_keep=1).logits[0, -1, :].float()
        out[i] = torch.log_softmax(logits, dim=-1)[first.to(model.device)].cpu().numpy()
    return out


@torch.inference_mode()
def article_batched(loaded: LoadedModel, prompts: list[str], labels, order, batch_size=32):
    """(b)/(c): fixed batches in the given order; returns (scores, processed, real tokens)."""
    tok, model = loaded.tokenizer, loaded.model
    first = _article_first_ids(tok, labels)
    out = np.zeros((len(prompts), len(labels)))
    processed = real = 0
    for i in range(0, len(order), batch_size):
        idx = order[i : i + batch_size]
        side = tok.padding_side  # the tokenizer is shared with every classifier of this model: restore it
        tok.padding_side = "left"
        try:
            batch = tok([prompts[j] for j in idx], add_special_tokens=False, padding=True, return_tensors="pt")
        finally:
            tok.padding_side = side
        processed += batch["input_ids"].numel()
        real += int(batch["attention_mask"].sum())
        logits = model(**batch.to(model.device), logits_to_keep=1).logits[:, -1, :].float()
        out[idx] = torch.log_softmax(logits, dim=-1)[:, first.to(model.device)].cpu().numpy()
    return out, processed, real


def llama_cpp_scores(gguf_path: str, prompts: list[str], labels, tokenizer) -> np.ndarray | None:
    """(f): llama.cpp item by item, reusing its cached prompt prefix between calls."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    threads = torch.get_num_threads()
    llm = Llama(model_path=gguf_path, n_ctx=2048, verbose=False, n_threads=threads, n_threads_batch=threads,
                flash_attn=True)  # ~12% faster prompt processing here; llama.cpp's own CLI picks it by default
    first = [tokenizer.encode(label, add_special_tokens=False)[0] for label in labels]
    vocab = llm.n_vocab()
    out = np.zeros((len(prompts), len(labels)))
    for i, prompt in enumerate(prompts):
        tokens = llm.tokenize(prompt.encode(), add_bos=False, special=True)
        # Reuse the longest common prefix with what is already in llama.cpp's KV cache.
        previous = llm.input_ids[: llm.n_tokens].tolist()
        common = 0
        while common < min(len(previous), len(tokens) - 1) and previous[common] == tokens[common]:
            common += 1
        llm.n_tokens = common
        llm.eval(tokens[common:])
        # Without logits_all, llama-cpp-python keeps no scores: read the last token's logits.
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,)).astype(np.float64)
        out[i] = logits[first] - (np.log(np.exp(logits - logits.max()).sum()) + logits.max())
    return out


# --- the whole comparison -------------------------------------------------------------------

def reset_peak_rss() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets the peak resident set size (VmHWM) on Linux
    except OSError:
        pass


def peak_rss_mb() -> float:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_bench(loaded: LoadedModel, texts: list[str], task: Task, settings: EngineSettings | None = None,
              gguf_path: str | None = None, log=print, precision_sample: list[str] | None = None,
              with_ctranslate2: bool = True) -> BenchReport:
    """Run every configuration on `texts` and return the report (rows in table order).

    `precision_sample`: the user's texts for `--precision auto`'s check (None: article tickets);
    `with_ctranslate2` False: no (i) rows."""
    from ..jobs.verify import engine_line

    # No item-token cap: the article's loop (a) runs every item whole, and every row must see the same tokens.
    settings = replace(settings or EngineSettings(), max_text_tokens=None)
    report = BenchReport(machine=machine_info())
    device = loaded.backend.device
    hf = loaded if device.type == "cpu" else _bf16_copy(loaded)  # what a user runs on a GPU
    probe = Classifier(task, model=loaded, settings=settings, precision_sample=precision_sample)
    loaded = probe.loaded  # with --precision auto decided, if it was not yet: every row below uses it
    report.engine = engine_line(loaded)
    log(f"engine: {report.engine}")
    prompts = [probe.renderer.render(t) for t in texts]
    encoded = probe.encode(texts)
    lengths = np.array([len(ids) for ids in encoded.ids])
    total_tokens = int(lengths.sum())
    # The roofline's useful work: every scored item's tokens after the shared prefix, the same
    # for every configuration (recomputing the prefix, as the ablation without the cache does,
    # is not useful work).
    report.work_tokens = int(lengths[encoded.scored].sum()) - len(encoded.scored) * len(probe.prefix_ids)
    report.prompt_lengths = {"min": int(lengths.min()), "median": int(np.median(lengths)), "max": int(lengths.max())}
    log(f"{len(texts)} items; prompt tokens min {lengths.min()}, median {int(np.median(lengths))}, max {lengths.max()}")
    report.matmul_gflops = matmul_rate(loaded.model) if device.type == "cpu" else loaded.gemm_rates["rates"]["bf16"]
    report.flops_per_token = 2 * non_embedding_params(loaded.model)
    log(f"float32 matmul rate on the model's shapes: {report.matmul_gflops:.1f} GFLOP/s")

    def add(name, description, seconds, scores, padding=None, roofline=None, rss=None):
        row = BenchRow(name, description, seconds, len(texts), total_tokens, padding=padding,
                       roofline=roofline, peak_rss_mb=rss)
        base = report.rows[0] if report.rows else None
        if base is None:
            row.speedup, row.agree, row.max_abs_diff = 1.0, len(texts), 0.0
            add.reference = scores
        else:
            row.speedup = base.seconds / seconds
            row.agree = int((scores.argmax(1) == add.reference.argmax(1)).sum())
            row.max_abs_diff = float(np.abs(scores - add.reference).max())
        report.rows.append(row)
        log(f"  {name}: {seconds:.2f} s, {row.items_per_s:.2f} items/s, agree {row.agree}/{row.items}")

    # (a) and (d) run interleaved: after each of our batches, the article's loop takes as many
    # items, so that drift in the machine's speed (shared hosts) hits both alike.
    article_loop(hf, prompts[:4], task.labels)  # warm-up of both paths
    probe.score(probe.encode(texts[:4]))
    loop_scores = np.zeros((len(texts), len(task.labels)))
    loop = {"seconds": 0.0, "done": 0}

    def run_loop_chunk(n: int) -> None:
        start, done = time.perf_counter(), loop["done"]
        loop_scores[done : done + n] = article_loop(hf, prompts[done : done + n], task.labels)
        loop["seconds"] += time.perf_counter() - start
        loop["done"] += n

    reset_peak_rss()
    start = time.perf_counter()
    clf = Classifier(task, model=loaded, settings=settings)  # includes the prefix prefill and calibration
    d_scored = clf.score(clf.encode(texts), progress=run_loop_chunk)
    ours_seconds = time.perf_counter() - start - loop["seconds"]
    ours_rss = peak_rss_mb()
    run_loop_chunk(len(texts) - loop["done"])  # items not scored by us (empty texts), if any
    add("a article per-item loop", "full prompt per item, logits_to_keep=1", loop["seconds"], loop_scores)

    for name, order in (("b article batch 32 unsorted", np.arange(len(texts))),  # input order
                        ("c article batch 32 sorted", np.argsort(lengths, kind="stable"))):
        start = time.perf_counter()
        scores, processed, real = article_batched(hf, prompts, task.labels, order)
        add(name, "HF forward, fixed batches of 32", time.perf_counter() - start, scores, padding=1 - real / processed)

    def share(seconds: float) -> float:
        return roofline(report.work_tokens, report.flops_per_token, seconds, report.matmul_gflops)

    add("d ours (default)", f"prefix cache, sorted, token budget {settings.token_budget}; timed interleaved with a",
        ours_seconds, d_scored.scores, padding=d_scored.stats.padding_share, roofline=share(ours_seconds),
        rss=ours_rss)

    def ours(name, description, engine_settings, model=loaded):
        _sync(device)
        start = time.perf_counter()
        clf = Classifier(task, model=model, settings=engine_settings)
        scored = clf.score(clf.encode(texts))
        _sync(device)
        seconds = time.perf_counter() - start
        add(name, description, seconds, scored.scores, padding=scored.stats.padding_share, roofline=share(seconds))

    ours("e ours - no prefix cache", "sorted token-budget batches only",
         replace(settings, prefix_cache=False))
    ours("e ours - fixed 32 rows", "prefix cache, sorted, 32 rows per batch",
         replace(settings, token_budget=None, max_rows=32))
    ours("e ours - unsorted", "prefix cache, token budget, input order", replace(settings, sort=False))

    d_seconds = report.rows[3].seconds
    for precision in _other_precisions(loaded):
        other = _with_precision(loaded, precision)
        low = Classifier(task, model=other, settings=settings)
        ratios, scores = _interleaved(clf, {"g": lambda items: low.score(items).scores}, encoded, device)
        seconds = d_seconds / ratios["g"]  # g at the machine speed of the (d) run
        add(f"g ours {precision}", f"as d, {other.backend.describe()}; {ratios['g']:.2f}x d, timed interleaved with d",
            seconds, scores["g"], padding=report.rows[3].padding, roofline=share(seconds))  # d's batches
        report.rows[-1].vs_d = ratios["g"]

    from . import ctranslate2 as bench_ct2

    skipped = bench_ct2.skipped(device) if with_ctranslate2 else "switched off"
    if skipped:
        log(f"  i ctranslate2: skipped ({skipped})")
    for peer in [] if skipped else bench_ct2.measure(loaded, task, clf, encoded, device):
        add(peer.name, peer.description, d_seconds / peer.vs_d, peer.scores)  # at the speed of the (d) run
        report.rows[-1].vs_d = peer.vs_d
        ours = _ours_vs_d(report, loaded, peer.precision)
        log(f"    {peer.modes}" + (f"; ours {peer.precision} is {ours / peer.vs_d:.2f}x it" if ours else ""))

    if device.type == "cuda":
        from .plain_transformers import token_budget_scores

        for use_prefix in (False, True):
            _sync(device)
            start = time.perf_counter()
            scores, padding = token_budget_scores(hf, prompts, task.labels, probe.prefix_ids if use_prefix else [],
                                                  budget=32768, max_rows=512)
            _sync(device)
            add(f"h transformers budget{' +prefix' if use_prefix else ''}",
                "HF bf16, sorted token-budget batches (32k)" + (", prefix KV cache copied per batch" if use_prefix else ""),
                time.perf_counter() - start, scores, padding=padding)

    if gguf_path is not None:
        start = time.perf_counter()
        scores = llama_cpp_scores(gguf_path, prompts, task.labels, loaded.tokenizer)
        if scores is not None:
            add("f llama.cpp per item", "llama-cpp-python, prefix reused", time.perf_counter() - start, scores)
        else:
            log("  f llama.cpp: skipped (llama-cpp-python is not installed)")
    return report


def _interleaved(base: Classifier, others: dict, encoded, device: torch.device) -> tuple[dict, dict]:
    """({name: items/s of others[name] over `base`}, {name: its [n, L] scores}), all timed batch by batch.

    `others`: name -> a scorer of `EncodedItems` ([b, L] scores, like `Classifier.score`). The
    batches are those `base.score` makes (`Classifier.plan`), planned once; each is scored by
    `base` and by every other in turn (its items as one call; a Classifier plans them as the same
    single batch), the order rotating by one each batch, so that drift in the machine's speed hits all.
    """
    batches = [rows for _, rows in base.plan(encoded)]  # input indices of each batch's items
    runners = [*others.items(), (None, base.score)]  # None: the base
    scores = {name: np.full((len(encoded), len(base.task.labels)), np.nan) for name in others}
    seconds = dict.fromkeys([*others, None], 0.0)
    if batches:
        for score in others.values():
            score(encoded.subset(batches[-1]))  # warm-up of the other kernels (and caches)
    for k, rows in enumerate(batches):
        items = encoded.subset(rows)
        shift = k % len(runners)
        for name, score in runners[shift:] + runners[:shift]:
            _sync(device)
            start = time.perf_counter()
            batch_scores = score(items)
            _sync(device)
            seconds[name] += time.perf_counter() - start
            if name is not None:
                scores[name][rows] = batch_scores
    return {name: seconds[None] / seconds[name] for name in others}, scores


def _ours_vs_d(report: BenchReport, loaded: LoadedModel, precision: str) -> float | None:
    """items/s of ours in `precision` over (d): 1 for d's own, a (g) row's ratio, else None."""
    if precision == loaded.backend.precision:
        return 1.0
    return next((r.vs_d for r in report.rows if r.name == f"g ours {precision}"), None)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _bf16_copy(loaded: LoadedModel) -> LoadedModel:
    import copy

    model = copy.deepcopy(loaded.model).to(torch.bfloat16)
    return replace(loaded, model=model, engine=None)


def _other_precisions(loaded: LoadedModel) -> list[str]:
    """The precisions besides (d)'s that this machine runs natively (bf16 and fp16 on CUDA)."""
    from ..backends.device import cpu_native

    mine = loaded.backend.precision
    if loaded.backend.device.type == "cuda":
        return [p for p in ("fp32", "bf16") if p != mine]
    return [p for p in ("fp32", "int8", "bf16") if p != mine and cpu_native(p)]


def _with_precision(loaded: LoadedModel, precision: str) -> LoadedModel:
    """The same model and weights with another backend (its own engine)."""
    from ..backends.choice import make_backend
    from ..cache import cache_root

    backend, rates = make_backend(loaded.model.config, loaded.backend.device, precision, cache_root())
    return with_backend(loaded, backend, rates, auto_precision=False, auto_decision=None)


def dump_json(report: BenchReport) -> str:
    return json.dumps(report.to_json(), sort_keys=True)
