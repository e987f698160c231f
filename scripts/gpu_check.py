"""GPU check: random-weight models with the SmolLM2-135M and Qwen2.5-0.5B shapes and the embedded
model's tokenizer, the article's workload, on one CUDA device; prints one table.

Needs PyTorch with CUDA and transformers (any recent version); no network. The tokenizer comes from
--tokenizer DIR, or scripts/tokenizer/ next to this file (committed: the embedded model's tokenizer), or
the embedded model's converted folder in the user cache (~/.cache/slmclassify/gguf-*).

usage: python scripts/gpu_check.py [--n 600] [--budget 32768] [--rows 512] [--json FILE]
       python scripts/gpu_check.py --device cpu --n 8 --models SmolLM2-135M   # a smoke run of this script
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from slmclassify import Classifier, EngineSettings  # noqa: E402
from slmclassify.backends.choice import cpu_name  # noqa: E402
from slmclassify.bench.compare import run_bench  # noqa: E402
from slmclassify.cache import cache_root  # noqa: E402
from slmclassify.models.loading import wrap_model  # noqa: E402
from slmclassify.models.precision import agreement  # noqa: E402
from slmclassify.core.article_tickets import ARTICLE_TASK, article_tickets  # noqa: E402

SHAPES = {  # the real models' configurations (their config.json values)
    "SmolLM2-135M": ("llama", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                                   rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True)),
    "Qwen2.5-0.5B": ("qwen2", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                                   rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True)),
}


def find_tokenizer(given: str | None) -> str:
    candidates = [Path(given)] if given else []
    candidates += [ROOT / "scripts" / "tokenizer"] + sorted(cache_root().glob("gguf-*"), reverse=True)
    for folder in candidates:
        if (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file():
            return str(folder)
    sys.exit("gpu_check: no tokenizer found; pass --tokenizer DIR (the embedded model's converted folder, "
             "e.g. ~/.cache/slmclassify/gguf-*, copied from a machine that ran `make setup`)")


def build(kind: str, config: dict, tokenizer, name: str, precision: str, device: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cls, cfg = (LlamaForCausalLM, LlamaConfig) if kind == "llama" else (Qwen2ForCausalLM, Qwen2Config)
    torch.manual_seed(0)
    with torch.device(device):
        model = cls(cfg(**config, pad_token_id=tokenizer.pad_token_id or 0))
    return wrap_model(model, tokenizer, name=f"{name} (random weights)", device=device, precision=precision)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=600)
    ap.add_argument("--budget", type=int, default=32768, help="token budget per batch on the GPU")
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--tokenizer")
    ap.add_argument("--json")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a smoke run of this script (no `h` rows; use a small --n)")
    ap.add_argument("--models", default=",".join(SHAPES), help="comma-separated, of: " + ", ".join(SHAPES))
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: PyTorch sees no CUDA device")
    unknown = set(args.models.split(",")) - set(SHAPES)
    if unknown:
        sys.exit(f"gpu_check: unknown model {sorted(unknown)[0]!r}; choose from {', '.join(SHAPES)}")
    import transformers
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(find_tokenizer(args.tokenizer))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    texts = article_tickets(args.n)
    task = ARTICLE_TASK.with_overrides(mode="first")
    settings = EngineSettings(token_budget=args.budget, max_rows=args.rows)
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU smoke run ({cpu_name()})"
    print(f"# {gpu}; torch {torch.__version__}, transformers {transformers.__version__}; "
          f"{args.n} article tickets; token budget {args.budget}, {args.rows} rows", flush=True)
    summary = []
    for name in args.models.split(","):
        kind, config = SHAPES[name]
        started = time.perf_counter()
        loaded = build(kind, config, tokenizer, name, "bf16", args.device)
        report = run_bench(loaded, texts, task, settings, log=lambda m: print(f"  {m}", flush=True))
        rows = {r.name: r for r in report.rows}
        # ours bf16 against ours fp32 (the exact path) on every item
        fp32 = Classifier(task, model=build(kind, config, tokenizer, name, "fp32", args.device), settings=settings)
        bf16 = Classifier(task, model=loaded, settings=settings)
        same = agreement(bf16.score(bf16.encode(texts)), fp32.score(fp32.encode(texts)))
        plain = max((r for r in report.rows if r.name.startswith("h ")), key=lambda r: r.items_per_s, default=None)
        ours = rows["d ours (default)"].items_per_s
        summary.append({
            "model": name, "loop": rows["a article per-item loop"].items_per_s,
            "batch32_sorted": rows["c article batch 32 sorted"].items_per_s,
            "hf_best": plain.items_per_s if plain else None, "hf_best_config": plain.name if plain else None,
            "ours_bf16": ours, "ours_fp32": rows["g ours fp32"].items_per_s,
            "x_hf_best": ours / plain.items_per_s if plain else None,
            "agree_fp32": same.share, "max_dprob": same.max_prob_diff, "engine": report.engine,
            "seconds": time.perf_counter() - started,
        })
        print(report.table(), flush=True)
        del fp32, bf16, loaded
        if args.device == "cuda":
            torch.cuda.empty_cache()
    head = (f"{'model':<14} {'loop':>7} {'c sorted32':>10} {'HF best':>8} {'ours bf16':>9} {'ours fp32':>9} "
            f"{'x HF best':>9} {'agree fp32':>10} {'max|Δp|':>8}")
    print("\n" + head + "\n" + "-" * len(head))
    for s in summary:
        hf_best = f"{s['hf_best']:>8.1f}" if s["hf_best"] is not None else f"{'-':>8}"
        x_hf = f"{s['x_hf_best']:>8.2f}x" if s["x_hf_best"] is not None else f"{'-':>9}"
        print(f"{s['model']:<14} {s['loop']:>7.1f} {s['batch32_sorted']:>10.1f} {hf_best} "
              f"{s['ours_bf16']:>9.1f} {s['ours_fp32']:>9.1f} {x_hf} "
              f"{100 * s['agree_fp32']:>9.2f}% {s['max_dprob']:>8.1e}")
    print("items/s; HF rows run in bf16 (transformers as a user would); ours bf16 agreement is with ours fp32 "
          "(exact against the per-item reference)")
    line = json.dumps({"gpu": gpu, "torch": torch.__version__,
                       "transformers": transformers.__version__, "n": args.n, "rows": summary})
    if args.json:
        Path(args.json).write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
