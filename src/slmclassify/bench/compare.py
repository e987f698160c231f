"""`slmclassify bench`: the article's experiment and ours, side by side in one process.

Configurations (same model, same threads, same items):
  a  the article's per-item loop: full prompt, logits_to_keep=1, first-token scoring
     (timed interleaved with d, batch by batch, so that a drifting machine speed hits both alike)
  b  the article's fixed batches of 32, arbitrary order (HF forward, left padding)
  c  the article's fixed batches of 32, sorted by length
  d  ours, default settings (prefix cache, sorted token-budget batches, the schedule measured here)
  e  ablations of ours, one change each: no prefix cache; fixed batches of 32; unsorted. Each is
     a whole run (its classifier built inside the clock), timed interleaved with a whole run of (d)
     round by round (`E_ROUNDS`, the order rotating), so that its ratio to (d) is not a drift of the
     machine's speed between rows; its seconds are d's seconds x (e over d)
  f  llama.cpp on the same GGUF, item by item with its prompt prefix reused (if llama-cpp-python
     is importable and the model is a GGUF)
  k  ours in float32 on the fastest vendor GEMM (MKL `mm` or oneDNN, whichever the measurement
     found faster), which does not keep an item's bits independent of its batch, timed interleaved
     with (d) on d's batches like (g): what the ordered GEMM's invariance costs (or saves) here
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
     (`ctranslate2.py`)
  h  on CUDA: the best plain-transformers configurations (sorted token-budget batches, with and
     without a prefix cache; `plain_transformers.py`)
On CUDA the Hugging Face rows (a, b, c, h) run in bfloat16, as a user would run them there.
Every row reports agreement with (a) and the largest |Δ label log-probability|. The timing is
`timing.py`'s: (g) and (i) by its interleaving on d's batches (`on_batches.py`), the other rows
with its stopwatch.
"""

from __future__ import annotations

import platform
import resource
import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch

from ..backends.sync import sync_of
from ..classifier import Classifier, EngineSettings, engine_line
from ..core.encode import EncodedItems
from ..core.task import Task
from ..models.engines import with_backend, with_precision
from ..models.loading import LoadedModel
from ..timing import Side, Stopwatch, interleave, json_line
from .article import article_batched, article_loop, first_ids
from .on_batches import against_base

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
    """items/s over (d), timed interleaved with it: batch by batch on the same batches (g, i, m
    rows), or whole run by whole run (e rows)."""
    vs_d_rounds: list[float] | None = None
    """(e) rows: the ratio to (d) in each interleaved round (`vs_d` is their median). How far repeated
    rounds of one comparison disagree: rounds on both sides of 1.00 show no difference."""
    peak_rss_mb: float | None = None
    ratios: dict | None = None
    """Other ratios measured side by side for this row, with each round's (the q row: its cost over
    one question's, and how many times faster than three single-question runs)."""

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
    """Device, precision and GEMM kernel of (d), with the measured kernel rates (`classifier.engine_line`)."""

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

    def roofline_of(self, seconds: float) -> float:
        """The roofline share of a run of ours that took `seconds` (`roofline`)."""
        return roofline(self.work_tokens, self.flops_per_token, seconds, self.matmul_gflops)


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

    @torch.inference_mode()
    def every_shape(unit) -> None:
        for (_, k), w in zip(shapes, ws):
            torch.mm(xs[k], w)

    return flops / interleave([Side("mm", every_shape)], rounds=repeats, warmup=0).best_round("mm") / 1e9


def roofline(work_tokens: int, flops_per_token: int, seconds: float, matmul_gflops: float) -> float:
    """Achieved share of the measured matmul rate: useful GFLOP/s over the measured GFLOP/s."""
    return (work_tokens * flops_per_token / seconds / 1e9) / matmul_gflops


def non_embedding_params(model: torch.nn.Module) -> int:
    """Parameters outside the input embedding and the output head (counted once when tied)."""
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    total = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    return total - embed.numel() - (0 if head is embed else head.numel())


# --- the peers ----------------------------------------------------------------------------

def llama_cpp_scores(gguf_path: str, prompts: list[str], labels, tokenizer) -> np.ndarray | None:
    """(f): llama.cpp item by item, reusing its cached prompt prefix between calls."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    threads = torch.get_num_threads()
    llm = Llama(model_path=gguf_path, n_ctx=2048, verbose=False, n_threads=threads, n_threads_batch=threads,
                flash_attn=True)  # ~12% faster prompt processing here; llama.cpp's own CLI picks it by default
    first = first_ids(tokenizer, labels).tolist()
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


@dataclass
class _Inputs:
    """What every configuration of one bench run scores: the same items, prompts and model."""

    loaded: LoadedModel
    hf: LoadedModel
    """The model the Hugging Face rows (a, b, c, h) run: bfloat16 on CUDA, as a user runs it there."""
    task: Task
    settings: EngineSettings
    texts: list[str]
    prompts: list[str]
    encoded: EncodedItems
    lengths: np.ndarray
    """[n] prompt tokens of each item."""
    probe: Classifier
    """Ours with default settings, for the prompts and the prefix (never timed)."""

    @property
    def device(self) -> torch.device:
        return self.loaded.backend.device


class _Rows:
    """Appends rows to the report; (a), the first row, is the reference of every later row's speed-up and agreement."""

    def __init__(self, report: BenchReport, inputs: _Inputs, log):
        self.report, self.log = report, log
        self.items, self.prompt_tokens = len(inputs.texts), int(inputs.lengths.sum())
        self.reference: np.ndarray | None = None
        """[n, L] (a)'s scores."""
        self.reference_seconds = 0.0
        """(a)'s seconds."""

    def add(self, name, description, seconds, scores, padding=None, roofline=None, rss=None, vs_d=None,
            vs_d_rounds=None) -> BenchRow:
        row = BenchRow(name, description, seconds, self.items, self.prompt_tokens, padding=padding,
                       roofline=roofline, peak_rss_mb=rss, vs_d=vs_d, vs_d_rounds=vs_d_rounds)
        if self.reference is None:
            row.speedup, row.agree, row.max_abs_diff = 1.0, self.items, 0.0
            self.reference, self.reference_seconds = scores, seconds
        else:
            row.speedup = self.reference_seconds / seconds
            row.agree = int((scores.argmax(1) == self.reference.argmax(1)).sum())
            row.max_abs_diff = float(np.abs(scores - self.reference).max())
        self.report.rows.append(row)
        self.log(f"  {name}: {seconds:.2f} s, {row.items_per_s:.2f} items/s, agree {row.agree}/{row.items}")
        if vs_d_rounds:
            self.log(f"    {vs_d:.2f}x d; rounds {' / '.join(f'{r:.2f}' for r in vs_d_rounds)}")
        return row


def bench_settings(settings: EngineSettings | None = None) -> EngineSettings:
    """The settings every row runs with: no item-token cap, for the article's loop (a) runs every
    item whole and every row must see the same tokens (`--precision auto` is decided with them)."""
    return replace(settings or EngineSettings(), max_text_tokens=None)


ROW_GROUPS = {"e": "the ablations of (d)", "k": "(d) on the fastest vendor float32 GEMM",
              "g": "ours in each other precision", "m": "a multi-label task", "q": "several questions",
              "s": "structured outputs", "i": "CTranslate2", "t": "plain transformers (CUDA)", "f": "llama.cpp"}
"""The rows a bench may leave out, by their letter; (a) to (d) always run (the others are timed against (d))."""


def run_bench(loaded: LoadedModel, texts: list[str], task: Task, settings: EngineSettings | None = None,
              gguf_path: str | None = None, log=print, with_ctranslate2: bool = True,
              rows: frozenset[str] | None = None) -> BenchReport:
    """Run every configuration on `texts` and return the report (rows in table order).

    `loaded`: a prepared model (`load_model`; with `--precision auto`, decided on `task` with
    `bench_settings`); `with_ctranslate2` False: no (i) rows; `rows`: only these of `ROW_GROUPS`
    besides (a) to (d) (None: all)."""
    settings = bench_settings(settings)
    wanted = ROW_GROUPS.keys() if rows is None else rows
    report = BenchReport(machine=machine_info())
    inputs = _prepare(loaded, texts, task, settings, report, log)
    table = _Rows(report, inputs, log)
    clf, d = _article_and_ours(inputs, table, report)
    steps = {"e": lambda: _ablations(inputs, table, report, d),
             "k": lambda: _vendor_kernel_row(inputs, table, report, clf, d),
             "g": lambda: _other_precisions_rows(inputs, table, report, clf, d),
             "m": lambda: _multilabel_row(inputs, report, clf, d),
             "q": lambda: _questions_row(inputs, report),
             "s": lambda: _structured_row(inputs, report, log),
             "i": lambda: _ctranslate2_rows(inputs, table, report, clf, d, log, with_ctranslate2),
             "t": lambda: _plain_transformers_rows(inputs, table) if inputs.device.type == "cuda" else None,
             "f": lambda: _llama_cpp_row(inputs, table, gguf_path, log) if gguf_path is not None else None}
    for letter, step in steps.items():  # in table order
        if letter in wanted:
            step()
    return report


def parse_rows(spec: str | None) -> frozenset[str] | None:
    """`--rows e,g` → {"e", "g"}; "none" → {} ((a) to (d) alone); None → None (every row). A letter
    that is no row is refused, naming the letters."""
    if spec is None:
        return None
    if spec.strip().lower() == "none":
        return frozenset()
    letters = frozenset(part.strip().lower() for part in spec.split(",") if part.strip())
    unknown = sorted(letters - ROW_GROUPS.keys())
    if unknown or not letters:
        from ..errors import FieldError

        raise FieldError("rows", "{field} {value!r}: the rows besides (a)-(d) are "
                         + ", ".join(f"{k} ({v})" for k, v in ROW_GROUPS.items()) + ", or none",
                         value=spec)
    return letters


def _prepare(loaded, texts, task, settings, report: BenchReport, log) -> _Inputs:
    """The prompts, encoded items and lengths every row shares; fills the report's machine figures."""
    device = loaded.backend.device
    hf = loaded if device.type == "cpu" else _bf16_copy(loaded)  # what a user runs on a GPU
    probe = Classifier(task, model=loaded, settings=settings)
    settings = probe.settings  # the schedule measured here (or given): (d) runs it, each (e) row changes one thing
    report.engine = engine_line(probe)
    log(f"engine: {report.engine}")
    encoded = probe.encode(texts)
    lengths = np.array([len(ids) for ids in encoded.ids])
    # The roofline's useful work: every scored item's tokens after the shared prefix, the same
    # for every configuration (recomputing the prefix, as the ablation without the cache does,
    # is not useful work).
    report.work_tokens = int(lengths[encoded.scored].sum()) - len(encoded.scored) * len(probe.prefix_ids)
    report.prompt_lengths = {"min": int(lengths.min()), "median": int(np.median(lengths)), "max": int(lengths.max())}
    log(f"{len(texts)} items; prompt tokens min {lengths.min()}, median {int(np.median(lengths))}, max {lengths.max()}")
    report.matmul_gflops = matmul_rate(loaded.model) if device.type == "cpu" else loaded.gemm_rates["rates"]["bf16"]
    report.flops_per_token = 2 * non_embedding_params(loaded.model)
    log(f"float32 matmul rate on the model's shapes: {report.matmul_gflops:.1f} GFLOP/s")
    return _Inputs(loaded, hf, task, settings, texts, [probe.renderer.render(t) for t in texts], encoded, lengths,
                   probe)


class _ArticleAlongside:
    """(a) advanced by ours: `advance(n)` runs the article's loop on its next n items (a progress
    callback of our run), so that drift in the machine's speed (shared hosts) hits both alike; its
    seconds are its own `watch`, taken out of our run's."""

    def __init__(self, inputs: _Inputs):
        self.inputs = inputs
        self.scores = np.zeros((len(inputs.texts), len(inputs.task.labels)))
        self.done = 0
        self.watch = Stopwatch()

    def advance(self, n: int) -> None:
        with self.watch:
            end = self.done + n
            self.scores[self.done : end] = article_loop(self.inputs.hf, self.inputs.prompts[self.done : end],
                                                        self.inputs.task.labels)
            self.done = end


def _article_and_ours(inputs: _Inputs, rows: _Rows, report: BenchReport) -> tuple[Classifier, BenchRow]:
    """Rows (a), (b), (c) and (d); (a) and (d) interleaved, item count for item count. Returns
    (d's classifier, d's row)."""
    texts, labels = inputs.texts, inputs.task.labels
    article_loop(inputs.hf, inputs.prompts[:4], labels)  # warm-up of both paths
    inputs.probe.score(inputs.probe.encode(texts[:4]))
    article = _ArticleAlongside(inputs)
    reset_peak_rss()
    with Stopwatch() as whole:
        clf = Classifier(inputs.task, model=inputs.loaded, settings=inputs.settings)  # prefix prefill, calibration
        ours = clf.score(clf.encode(texts), progress=article.advance)
    ours_seconds = whole.seconds - article.watch.seconds
    ours_rss = peak_rss_mb()
    article.advance(len(texts) - article.done)  # items not scored by us (empty texts), if any
    rows.add("a article per-item loop", "full prompt per item, logits_to_keep=1", article.watch.seconds,
             article.scores)

    for name, order in (("b article batch 32 unsorted", np.arange(len(texts))),  # input order
                        ("c article batch 32 sorted", np.argsort(inputs.lengths, kind="stable"))):
        with Stopwatch() as watch:
            scores, processed, real = article_batched(inputs.hf, inputs.prompts, labels, order)
        rows.add(name, "HF forward, fixed batches of 32", watch.seconds, scores, padding=1 - real / processed)

    d = rows.add("d ours (default)",
                 f"prefix cache, sorted, token budget {inputs.settings.token_budget}; timed interleaved with a",
                 ours_seconds, ours.scores, padding=ours.stats.padding_share, roofline=report.roofline_of(ours_seconds),
                 rss=ours_rss)
    return clf, d


E_ROUNDS = 3
"""Whole runs of each (e) row and of (d) in the interleaved timing of the ablations."""


def _ablations(inputs: _Inputs, rows: _Rows, report: BenchReport, d: BenchRow) -> None:
    """Rows (e): ours with one change each, whole runs (each classifier built inside the clock)
    interleaved with whole runs of (d), round by round; each row's ratio to (d) is the median of its
    rounds', its seconds d's seconds over that ratio (the machine speed of the (d) run)."""
    settings = inputs.settings
    variants = (("e ours - no prefix cache", "sorted token-budget batches only", replace(settings, prefix_cache=False)),
                ("e ours - fixed 32 rows", "prefix cache, sorted, 32 rows per batch",
                 replace(settings, token_budget=None, max_rows=32)),
                ("e ours - unsorted", "prefix cache, token budget, input order", replace(settings, sort=False)))

    def whole(changed: EngineSettings):
        def run(_):
            clf = Classifier(inputs.task, model=inputs.loaded, settings=changed)
            return clf.score(clf.encode(inputs.texts))
        return run

    timings = interleave([Side("d", whole(settings)), *(Side(name, whole(changed)) for name, _, changed in variants)],
                         rounds=E_ROUNDS, warmup=0, sync=sync_of(inputs.device))
    for name, description, _ in variants:
        ratio = timings.speedup("d", name)  # d's seconds over e's, round by round: e's speed over d's
        each = [round(float(r), 3) for r in timings.ratios("d", name)]
        scored = timings.last(name)[0]
        seconds = d.seconds / ratio
        rows.add(name, f"{description}; {ratio:.2f}x d (rounds {min(each):.2f}-{max(each):.2f}), whole runs "
                 "interleaved with d", seconds, scored.scores, padding=scored.stats.padding_share,
                 roofline=report.roofline_of(seconds), vs_d=ratio, vs_d_rounds=each)


def vendor_kernel(loaded: LoadedModel) -> str | None:
    """The fastest float32 vendor kernel measured here, where (d) runs on the ordered GEMM (else None)."""
    rates = (loaded.gemm_rates or {}).get("rates", {})
    vendor = [k for k in ("mm", "onednn") if k in rates]
    if loaded.backend.gemm != "ordered" or not vendor:
        return None
    return max(vendor, key=lambda k: rates[k])


def _vendor_kernel_row(inputs: _Inputs, rows: _Rows, report: BenchReport, clf: Classifier, d: BenchRow) -> None:
    """Row (k): (d) on the fastest vendor float32 GEMM, timed against (d) on d's batches."""
    kernel = vendor_kernel(inputs.loaded)
    if kernel is None:
        return
    other = with_backend(inputs.loaded, replace(inputs.loaded.backend, gemm=kernel, invariant=()))
    vendor = Classifier(inputs.task, model=other, settings=inputs.settings)
    ratios, scores = against_base(clf, {"k": lambda items: vendor.score(items).scores}, inputs.encoded, inputs.device)
    seconds = d.seconds / ratios["k"]
    rows.add(f"k ours fp32 {kernel}", f"as d on the {kernel} GEMM (not batch-invariant); d takes {ratios['k']:.3f}x "
             f"its time, timed interleaved with d", seconds, scores["k"], padding=d.padding,
             roofline=report.roofline_of(seconds), vs_d=ratios["k"])


def _other_precisions_rows(inputs: _Inputs, rows: _Rows, report: BenchReport, clf: Classifier, d: BenchRow) -> None:
    """Rows (g): ours in each other precision this machine runs natively, timed against (d) on d's batches."""
    for precision in _other_precisions(inputs.loaded):
        other = with_precision(inputs.loaded, precision, auto_decision=None)
        low = Classifier(inputs.task, model=other, settings=inputs.settings)
        ratios, scores = against_base(clf, {"g": lambda items: low.score(items).scores}, inputs.encoded,
                                      inputs.device)
        seconds = d.seconds / ratios["g"]  # g at the machine speed of the (d) run
        rows.add(f"g ours {precision}", f"as d, {other.backend.describe()}; {ratios['g']:.2f}x d, timed interleaved "
                 "with d", seconds, scores["g"], padding=d.padding, roofline=report.roofline_of(seconds),  # d's batches
                 vs_d=ratios["g"])


def _multilabel_row(inputs: _Inputs, report: BenchReport, clf: Classifier, d: BenchRow) -> None:
    """Row (m): the task's labels as a multi-label task (each label's yes and no branches in the same
    pass, `core/multilabel.py`), timed against (d) batch by batch on d's batches; its agreement and
    max |Δ| are against its own per-label reference path on every item (the label sets chosen)."""
    from ..core import multilabel

    task = inputs.task.with_overrides(multi_label=True, mode="auto")
    multi = Classifier(task, model=inputs.loaded, settings=inputs.settings)
    items = multi.encode(inputs.texts)
    ratios, found = against_base(clf, {"m": lambda batch: multi.score(batch).scores}, inputs.encoded, inputs.device,
                                 items={"m": items})
    ratio, scores = ratios["m"], found["m"]
    scored = items.scored
    reference = np.full_like(scores, np.nan)
    reference[scored] = multi.reference(items, scored)

    def chosen(s):
        return multilabel.probabilities(multi.calibration.calibrated(s[scored])) >= np.array(task.label_thresholds)

    seconds = d.seconds / ratio
    row = BenchRow(f"m ours multi-label ({len(task.labels)})",
                   f"each label's yes/no branch in d's pass; {1 / ratio:.2f}x d's cost, timed interleaved with d; "
                   "agree and max|Δ| against its own per-label reference", seconds, d.items, d.prompt_tokens,
                   padding=d.padding, vs_d=ratio)
    row.speedup = report.rows[0].seconds / seconds
    row.agree = int((chosen(scores) == chosen(reference)).all(axis=1).sum()) + (d.items - len(scored))
    row.max_abs_diff = float(np.nanmax(np.abs(scores - reference))) if len(scored) else 0.0
    report.rows.append(row)


def _questions_row(inputs: _Inputs, report: BenchReport) -> None:
    """Row (q): three questions (5 + 3 + 3 labels) in each item's one pass, whole runs interleaved with
    one question's and with three single-question runs (`bench/questions.py`)."""
    from .questions import TRIAGE, questions_row

    figures = questions_row(inputs.loaded, inputs.texts, inputs.settings, inputs.device)
    sizes = "+".join(str(len(q.labels)) for q in TRIAGE.questions)
    one, three = figures["cost_vs_one_rounds"], figures["faster_than_three_rounds"]
    row = BenchRow(f"q ours 3 questions ({sizes})",
                   f"team, priority, sentiment in one pass: {figures['cost_vs_one']:.2f}x one question's cost "
                   f"(rounds {min(one):.2f}-{max(one):.2f}), {figures['faster_than_three']:.2f}x faster than three "
                   f"single-question runs (rounds {min(three):.2f}-{max(three):.2f}); whole runs interleaved; agree "
                   "and max|Δ| against each question's reference", figures["seconds"], len(inputs.texts),
                   report.rows[0].prompt_tokens, padding=figures["padding"],
                   ratios={k: figures[k] for k in ("cost_vs_one", "cost_vs_one_rounds", "faster_than_three",
                                                   "faster_than_three_rounds")})
    row.speedup = report.rows[0].seconds / row.seconds
    row.agree, row.max_abs_diff = figures["agree"], figures["max_abs_diff"]
    report.rows.append(row)


def _structured_row(inputs: _Inputs, report: BenchReport, log) -> None:
    """Row (s): the same three fields asked as a Pydantic model's JSON schema (openai `.parse()`),
    through the service's path per request body, whole runs interleaved with one field's
    (`bench/structured.py`)."""
    from .structured import FIELDS, structured_row

    figures = structured_row(inputs.loaded, inputs.texts, inputs.settings, inputs.device)
    if figures is None:
        log("  s 3-field schema: skipped (no item's conversation fits the model's context)")
        return
    sizes = "+".join(str(len(v)) for v in FIELDS.values())
    rounds = figures["cost_vs_one_rounds"]
    row = BenchRow(f"s ours 3-field schema ({sizes})",
                   f"a Pydantic model of team, priority, sentiment as response_format (openai .parse()), each body "
                   f"read and answered as the service does: {figures['cost_vs_one']:.2f}x a one-field model's "
                   f"seconds (rounds {min(rounds):.2f}-{max(rounds):.2f}); whole runs interleaved; agree and max|Δ| "
                   "against offline classify of the task of questions"
                   + (f"; {len(inputs.texts) - figures['answered']} items over the model's context left out (a 400)"
                      if figures["answered"] < len(inputs.texts) else ""), figures["seconds"], len(inputs.texts),
                   report.rows[0].prompt_tokens, padding=figures["padding"],
                   ratios={k: figures[k] for k in ("cost_vs_one", "cost_vs_one_rounds")})
    row.speedup = report.rows[0].seconds / row.seconds
    row.agree, row.max_abs_diff = figures["agree"], figures["max_abs_diff"]  # of the answered items
    report.rows.append(row)


def _ctranslate2_rows(inputs: _Inputs, rows: _Rows, report: BenchReport, clf: Classifier, d: BenchRow, log,
                      wanted: bool) -> None:
    """Rows (i): CTranslate2 in fp32 and int8, timed against (d) on d's batches (`ctranslate2.py`)."""
    from . import ctranslate2 as bench_ct2

    skipped = bench_ct2.skipped(inputs.device) if wanted else "switched off"
    if skipped:
        log(f"  i ctranslate2: skipped ({skipped})")
        return
    for peer in bench_ct2.measure(inputs.loaded, inputs.task, clf, inputs.encoded, inputs.device):
        rows.add(peer.name, peer.description, d.seconds / peer.vs_d, peer.scores, vs_d=peer.vs_d)  # at d's speed
        ours = _ours_vs_d(report, inputs.loaded, peer.precision)
        log(f"    {peer.modes}" + (f"; ours {peer.precision} is {ours / peer.vs_d:.2f}x it" if ours else ""))


def _plain_transformers_rows(inputs: _Inputs, rows: _Rows) -> None:
    """Rows (h), on CUDA: plain transformers in sorted token-budget batches, with and without a prefix cache."""
    from .plain_transformers import token_budget_scores

    for use_prefix in (False, True):
        with Stopwatch(sync=sync_of(inputs.device)) as watch:
            scores, padding = token_budget_scores(inputs.hf, inputs.prompts, inputs.task.labels,
                                                  inputs.probe.prefix_ids if use_prefix else [], budget=32768,
                                                  max_rows=512)
        rows.add(f"h transformers budget{' +prefix' if use_prefix else ''}",
                 "HF bf16, sorted token-budget batches (32k)" + (", prefix KV cache copied per batch" if use_prefix
                                                                 else ""),
                 watch.seconds, scores, padding=padding)


def _llama_cpp_row(inputs: _Inputs, rows: _Rows, gguf_path: str, log) -> None:
    """Row (f): llama.cpp on the GGUF file, when llama-cpp-python is installed."""
    with Stopwatch() as watch:
        scores = llama_cpp_scores(gguf_path, inputs.prompts, inputs.task.labels, inputs.loaded.tokenizer)
    if scores is None:
        log("  f llama.cpp: skipped (llama-cpp-python is not installed)")
        return
    rows.add("f llama.cpp per item", "llama-cpp-python, prefix reused", watch.seconds, scores)


def _ours_vs_d(report: BenchReport, loaded: LoadedModel, precision: str) -> float | None:
    """items/s of ours in `precision` over (d): 1 for d's own, a (g) row's ratio, else None."""
    if precision == loaded.backend.precision:
        return 1.0
    return next((r.vs_d for r in report.rows if r.name == f"g ours {precision}"), None)


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


def dump_json(report: BenchReport) -> str:
    """The report as the one JSON line `slmclassify bench` prints last."""
    return json_line(report.to_json(), sort_keys=True)
