"""GPU check: random-weight models at real shapes (`real_shapes.py`) with the embedded model's tokenizer,
the article's workload, on one CUDA device. Two stages, each printing one table and one JSON line last:

  bench     per model (default Qwen2.5-0.5B, SmolLM2-135M shapes): `slmclassify bench` (ours bf16, the
            default on CUDA, with its rows a-h), then in the same process ours fp32 against the per-item
            reference path (float32, exact), ours bf16 against ours fp32 on every item, peak GPU memory of
            a run of ours, the schedule the engine measured, one run of ours under `torch.profiler` (top
            ops by CUDA time), and the Hugging Face anchor (`--anchor FILE`: shared/tools/hf_anchor.py,
            the article's recipes in plain transformers) in a subprocess, bf16
  families  per model family at a real shape (SmolLM2, Qwen2.5, Qwen3, Gemma 3, LFM2): ours fp32 against
            the reference path, bf16 and fp16 against fp32 on every item, items/s of each
  phases    what bench's row (d) times, apart: building the classifier, encoding, scoring (bf16)

Needs PyTorch with CUDA and transformers; no network. `gpu_check.sh` beside it runs the CUDA tests and both.

usage: python examples/gpu_check/gpu_check.py bench [--n 600] [--models qwen2.5-0.5b,smollm2-135m] [--anchor FILE] [--json FILE]
       python examples/gpu_check/gpu_check.py families [--n 600] [--json FILE]
       python examples/gpu_check/gpu_check.py bench --device cpu --n 8 --models smollm2-135m   # a smoke run of this script
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(HERE))

import real_shapes  # noqa: E402
from slmclassify import Classifier  # noqa: E402
from slmclassify.backends.choice import cpu_name  # noqa: E402
from slmclassify.backends.device import cpu_native  # noqa: E402
from slmclassify.backends.sync import sync_of  # noqa: E402
from slmclassify.bench.compare import bench_settings, run_bench  # noqa: E402
from slmclassify.core.article_tickets import ARTICLE_TASK, article_tickets  # noqa: E402
from slmclassify.models.engines import with_precision  # noqa: E402
from slmclassify.models.prepare import wrap_model  # noqa: E402
from slmclassify.models.precision import agreement  # noqa: E402
from slmclassify.timing import Stopwatch  # noqa: E402

ANCHOR_ARCH = {"qwen2.5-0.5b": "qwen05", "smollm2-135m": "smollm2"}
"""hf_anchor.py's name of each shape it builds (the same configurations)."""
FAMILY_SHAPES = ("smollm2-135m", "qwen2.5-0.5b", "qwen3-0.6b", "gemma3-270m", "lfm2-350m")
EXACT_ITEMS = 64
"""Items checked against the per-item reference path (one float32 Hugging Face forward each)."""
TASK = ARTICLE_TASK.with_overrides(mode="first")
SETTINGS = bench_settings()
"""The schedule measured on the device, no item-token cap: every row sees every item whole."""


def log(message: str) -> None:
    print(message, flush=True)


def load(name: str, tokenizer, precision: str, device: str):
    """Ours on a random-weight model of shape `name` in `precision` (the model itself stays float32)."""
    model = real_shapes.random_model(name, tokenizer, device)
    return wrap_model(model, tokenizer, name=f"{name} (random weights)", device=device, precision=precision)


def timed_scores(clf: Classifier, texts: list[str], device: torch.device) -> tuple[np.ndarray, float]:
    """(scores, seconds) of one whole run of `clf` on `texts` (encoding included), after one untimed run."""
    clf.score(clf.encode(texts))
    with Stopwatch(sync=sync_of(device)) as watch:
        scored = clf.score(clf.encode(texts))
    return scored.scores, watch.seconds


def exactness(clf: Classifier, texts: list[str], scores: np.ndarray, k: int = EXACT_ITEMS) -> dict:
    """Ours (float32) against the per-item reference path on the first `k` items: same labels, max |Δ|."""
    encoded = clf.encode(texts[:k])
    ref = clf.reference(encoded, range(len(encoded.ids)))
    return {"items": len(ref), "same_label": int((scores[:k].argmax(1) == ref.argmax(1)).sum()),
            "max_abs_diff": float(np.abs(scores[:k] - ref).max())}


def profile_top(clf: Classifier, texts: list[str], rows: int = 15) -> dict:
    """One run of ours under torch.profiler: the top ops by device time, and the share of the run's
    wall time the GPU was busy (kernel time over wall time: low means launch-bound)."""
    from torch.profiler import ProfilerActivity, profile

    encoded = clf.encode(texts)
    clf.score(encoded)
    torch.cuda.synchronize()
    started = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        clf.score(encoded)
        torch.cuda.synchronize()
    wall = time.perf_counter() - started
    events = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    table = events.table(sort_by="self_device_time_total", row_limit=rows)
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"))
    return {"wall_s": round(wall, 4), "gpu_busy_s": round(device_us / 1e6, 4),
            "gpu_busy_share": round(device_us / 1e6 / wall, 3), "kernel_launches": launches, "table": table}


def phases(loaded, texts: list[str], device: torch.device, rounds: int = 3) -> dict:
    """Seconds of what bench's row (d) times, apart, best of `rounds` (no profiler): building the
    classifier (prefix prefill, calibration), encoding the items, scoring them."""
    sync = sync_of(device)
    best = {"build": float("inf"), "encode": float("inf"), "score": float("inf")}
    for _ in range(rounds):
        with Stopwatch(sync=sync) as build:
            clf = Classifier(TASK, model=loaded, settings=SETTINGS)
        with Stopwatch(sync=sync) as encode:
            encoded = clf.encode(texts)
        with Stopwatch(sync=sync) as score:
            clf.score(encoded)
        for name, watch in (("build", build), ("encode", encode), ("score", score)):
            best[name] = min(best[name], watch.seconds)
    return {name: round(seconds, 4) for name, seconds in best.items()}


def anchor(script: str, name: str, n: int, dtype: str = "bf16") -> list[dict]:
    """hf_anchor.py's JSON rows (per-item loop, sorted batches of 32, prefix + token budget, ...) for
    shape `name`, run in a subprocess on this GPU (no rows when it fails: its error is printed)."""
    cmd = [sys.executable, script, "--tok", str(HERE / "tokenizer"), "--arch", ANCHOR_ARCH[name],
           "--dtype", dtype, "--n", str(n), "--skip", "b"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        log(f"  anchor failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        return []
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    for row in rows:
        log(f"  anchor {json.dumps(row)}")
    return [r for r in rows if "config" in r]


def peak_memory(clf: Classifier, texts: list[str]) -> dict:
    """GPU memory held before a run of ours (the weights, the prefix cache, the other copies in
    this process) and the peak during it, MiB."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    clf.score(clf.encode(texts))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return {"held_mib": round(before / 2**20), "peak_mib": round(peak / 2**20),
            "run_mib": round((peak - before) / 2**20)}


def bench(args, tokenizer, save) -> list[dict]:
    device = torch.device(args.device)
    texts = article_tickets(args.n)
    summary = []
    for name in args.models.split(","):
        started = time.perf_counter()
        log(f"\n## {name}: slmclassify bench, ours bf16" if args.device == "cuda" else f"\n## {name}: smoke run")
        precision = "bf16" if args.device == "cuda" else "fp32"
        loaded = load(name, tokenizer, precision, args.device)
        report = run_bench(loaded, texts, TASK, SETTINGS, log=log, with_ctranslate2=False)
        log(report.table())
        rows = {r.name: r for r in report.rows}
        ours = Classifier(TASK, model=loaded, settings=SETTINGS)
        fp32 = Classifier(TASK, model=with_precision(loaded, "fp32"), settings=SETTINGS)
        fp32_scores, fp32_s = timed_scores(fp32, texts, device)
        ours_scores, ours_s = timed_scores(ours, texts, device)
        same = agreement(ours_scores, fp32_scores)
        entry = {
            "model": name, "engine": report.engine, "prompt_lengths": report.prompt_lengths,
            "rows": {r.name: {"items_per_s": round(r.items_per_s, 1), "padding": r.padding, "agree_a": r.agree,
                              "max_abs_diff_a": r.max_abs_diff} for r in report.rows},
            "ours_bf16_items_per_s": round(len(texts) / ours_s, 1), "ours_fp32_items_per_s": round(len(texts) / fp32_s, 1),
            "fp32_vs_reference": exactness(fp32, texts, fp32_scores),
            "bf16_vs_fp32": {"agree": same.agree, "n": same.n, "max_prob_diff": same.max_prob_diff},
            "schedule": {"token_budget": ours.settings.token_budget, "max_rows": ours.settings.max_rows},
        }
        entry["phases_s"] = phases(loaded, texts, device)
        log(f"  row d's phases apart, best of 3 (s): {entry['phases_s']}")
        if args.device == "cuda":
            entry["memory"] = peak_memory(ours, texts)
            entry["profile"] = profile_top(ours, texts)
            log(f"  profile of one run of ours (bf16): {entry['profile']['wall_s']} s wall, GPU busy "
                f"{entry['profile']['gpu_busy_s']} s ({100 * entry['profile']['gpu_busy_share']:.0f}%), "
                f"{entry['profile']['kernel_launches']} kernel launches\n{entry['profile']['table']}")
        del ours, fp32, loaded, report
        if args.device == "cuda":
            torch.cuda.empty_cache()
            if args.anchor and name in ANCHOR_ARCH:
                entry["anchor"] = anchor(args.anchor, name, args.n)
        best = max(entry.get("anchor", []), key=lambda r: r["items_per_s"], default=None)
        d = entry["rows"]["d ours (default)"]["items_per_s"]
        entry["anchor_best"] = None if best is None else {"config": best["config"], "items_per_s": best["items_per_s"]}
        entry["x_anchor_best"] = None if best is None else round(d / best["items_per_s"], 2)
        entry["seconds"] = round(time.perf_counter() - started, 1)
        log(f"  {name}: d {d:.0f} items/s; " + (f"{entry['x_anchor_best']}x the anchor's best "
            f"({best['config']} {best['items_per_s']:.0f} items/s); " if best else "")
            + f"fp32 vs reference {entry['fp32_vs_reference']}; bf16 vs fp32 {entry['bf16_vs_fp32']}; "
            f"memory {entry.get('memory')}; schedule {entry['schedule']}")
        summary.append(entry)
        save(summary)
    head = (f"{'model':<14} {'loop':>7} {'c sorted32':>10} {'HF h best':>9} {'anchor best':>11} {'ours bf16':>9} "
            f"{'ours fp32':>9} {'x anchor':>8} {'fp32=ref':>9} {'bf16~fp32':>9} {'peak MiB':>8}")
    log("\n" + head + "\n" + "-" * len(head))
    for s in summary:
        r = s["rows"]
        h = max((v["items_per_s"] for k, v in r.items() if k.startswith("h ")), default=float("nan"))
        best = s["anchor_best"]["items_per_s"] if s["anchor_best"] else float("nan")
        x = f"{s['x_anchor_best']:.2f}x" if s["x_anchor_best"] else "-"
        exact = s["fp32_vs_reference"]
        log(f"{s['model']:<14} {r['a article per-item loop']['items_per_s']:>7.1f} "
            f"{r['c article batch 32 sorted']['items_per_s']:>10.1f} {h:>9.1f} {best:>11.1f} "
            f"{r['d ours (default)']['items_per_s']:>9.1f} {s['ours_fp32_items_per_s']:>9.1f} {x:>8} "
            f"{exact['same_label']:>4}/{exact['items']:<4} {s['bf16_vs_fp32']['agree']:>4}/{s['bf16_vs_fp32']['n']:<4} "
            f"{s.get('memory', {}).get('peak_mib', float('nan')):>8}")
    log("items/s, 600 article tickets; loop, c and h: Hugging Face bf16 in our bench; anchor: hf_anchor.py bf16; "
        "ours bf16 = row d; fp32=ref: same label as the float32 per-item reference path")
    return summary


def families(args, tokenizer, save) -> list[dict]:
    device = torch.device(args.device)
    texts = article_tickets(args.n)
    summary = []
    for name in args.models.split(","):
        log(f"\n## {name}")
        fp32_loaded = load(name, tokenizer, "fp32", args.device)
        fp32 = Classifier(TASK, model=fp32_loaded, settings=SETTINGS)
        scores, seconds = timed_scores(fp32, texts, device)
        entry = {"model": name, "fp32_items_per_s": round(len(texts) / seconds, 1),
                 "fp32_vs_reference": exactness(fp32, texts, scores)}
        for precision in [p for p in ("bf16", "fp16") if args.device == "cuda" or cpu_native(p)]:
            low = Classifier(TASK, model=with_precision(fp32_loaded, precision), settings=SETTINGS)
            low_scores, low_s = timed_scores(low, texts, device)
            same = agreement(low_scores, scores)
            entry[precision] = {"items_per_s": round(len(texts) / low_s, 1), "agree": same.agree, "n": same.n,
                                "max_prob_diff": same.max_prob_diff,
                                "finite": bool(np.isfinite(low_scores).all())}
            del low
        log(f"  {json.dumps(entry)}")
        summary.append(entry)
        save(summary)
        del fp32, fp32_loaded
        if args.device == "cuda":
            torch.cuda.empty_cache()
    head = (f"{'family (shape)':<14} {'fp32 items/s':>12} {'fp32 = ref':>10} {'max|Δ| ref':>10} "
            f"{'bf16 items/s':>12} {'bf16~fp32':>9} {'max|Δp|':>8} {'fp16 items/s':>12} {'fp16~fp32':>9} {'max|Δp|':>8}")
    log("\n" + head + "\n" + "-" * len(head))
    missing = {"items_per_s": float("nan"), "agree": 0, "n": 0, "max_prob_diff": float("nan")}
    for s in summary:
        e, b, f = s["fp32_vs_reference"], s.get("bf16", missing), s.get("fp16", missing)
        log(f"{s['model']:<14} {s['fp32_items_per_s']:>12.1f} {e['same_label']:>5}/{e['items']:<4} "
            f"{e['max_abs_diff']:>10.1e} {b['items_per_s']:>12.1f} {b['agree']:>4}/{b['n']:<4} {b['max_prob_diff']:>8.3f} "
            f"{f['items_per_s']:>12.1f} {f['agree']:>4}/{f['n']:<4} {f['max_prob_diff']:>8.3f}")
    log("random weights at each model's real shape; fp32 = ref: same label as the float32 per-item reference path "
        f"on {EXACT_ITEMS} items; bf16~fp32, fp16~fp32: same label as ours fp32 on every item")
    return summary


def phase_stage(args, tokenizer, save) -> list[dict]:
    """Row (d)'s phases apart (`phases`) for each model in bf16, without the rest of the bench."""
    summary = []
    for name in args.models.split(","):
        loaded = load(name, tokenizer, "bf16" if args.device == "cuda" else "fp32", args.device)
        texts = article_tickets(args.n)
        entry = {"model": name, "phases_s": phases(loaded, texts, torch.device(args.device))}
        log(f"  {json.dumps(entry)}")
        summary.append(entry)
        save(summary)
    return summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=["bench", "families", "phases"])
    ap.add_argument("--n", type=int, default=600)
    ap.add_argument("--models", help="comma-separated, of: " + ", ".join(real_shapes.SHAPES))
    ap.add_argument("--anchor", help="shared/tools/hf_anchor.py (bench: the plain-transformers anchor rows)")
    ap.add_argument("--json")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a smoke run of this script (no h, anchor, memory or profile; use a small --n)")
    args = ap.parse_args()
    args.models = args.models or (",".join(FAMILY_SHAPES) if args.stage == "families" else ",".join(ANCHOR_ARCH))
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: PyTorch sees no CUDA device")
    unknown = set(args.models.split(",")) - set(real_shapes.SHAPES)
    if unknown:
        sys.exit(f"gpu_check: unknown model {sorted(unknown)[0]!r}; choose from {', '.join(real_shapes.SHAPES)}")
    import transformers

    tokenizer = real_shapes.tokenizer()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU smoke run ({cpu_name()})"
    log(f"# {args.stage}: {gpu}; torch {torch.__version__}, transformers {transformers.__version__}; "
        f"{args.n} article tickets; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    def line(summary: list[dict]) -> str:
        return json.dumps({"stage": args.stage, "gpu": gpu, "torch": torch.__version__,
                           "transformers": transformers.__version__, "n": args.n,
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": summary})

    def save(summary: list[dict]) -> None:  # after every model: a run cut short keeps what it measured
        if args.json:
            Path(args.json).write_text(line(summary) + "\n")

    stage = {"bench": bench, "families": families, "phases": phase_stage}[args.stage]
    summary = stage(args, tokenizer, save)
    print(line(summary))


if __name__ == "__main__":
    main()
