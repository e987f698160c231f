"""Tokenising N rows of a few-shot task: old encode (full prompt ids as lists) vs new (suffix arrays).
Usage: python benchmarks/tokenise_fewshot.py old|new N INTENT_JSON  -> one JSON line (seconds, peak RSS added in MB,
prefix tokens). INTENT_JSON: BIG-bench's intent_recognition.json (not part of this repository).
"old" is encode.py as it was before streaming, extracted with
    git show afa22bd:src/slmclassify/encode.py | sed 's/from .prompts/from slmclassify.core.prompts/' > /tmp/old_encode.py
Run each way in its own process (peak RSS is per process)."""
import json, resource, sys, time, importlib.util
from pathlib import Path
from transformers import AutoTokenizer
from slmclassify.core.task import Task, Example
from slmclassify.core.prompts import PromptRenderer

which, n, intent_json = sys.argv[1], int(sys.argv[2]), sys.argv[3]
tok = AutoTokenizer.from_pretrained(str(next(Path.home().joinpath(".cache/slmclassify").glob("gguf-*-v2"))))
data = json.load(open(intent_json))["examples"]
labels = tuple(data[0]["target_scores"])
gold = [max(ex["target_scores"], key=ex["target_scores"].get) for ex in data]
examples = []
for lab in labels:
    examples += [Example(ex["input"], g) for ex, g in zip(data, gold) if g == lab][:3]
task = Task(labels=labels, examples=tuple(examples))
renderer = PromptRenderer(tok, task)
texts = [f"{data[i % len(data)]['input']} (ticket {i})" for i in range(n)]
if which == "old":
    spec = importlib.util.spec_from_file_location("old_encode", "/tmp/old_encode.py")
    mod = importlib.util.module_from_spec(spec); sys.modules["old_encode"] = mod; spec.loader.exec_module(mod)
    encode_items, choose_prefix = mod.encode_items, mod.choose_prefix
else:
    from slmclassify.core.encode import encode_items, choose_prefix
prefix = choose_prefix(tok, renderer.before)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
start = time.perf_counter()
enc = encode_items(tok, renderer, texts, prefix, 8000)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"way": which, "rows": n, "prefix_tokens": len(prefix), "seconds": round(seconds, 2),
                  "peak_rss_mb": round(peak), "rss_before_mb": round(base), "delta_mb": round(peak - base),
                  "fallbacks": int(sum(1 for i in range(n) if not enc.cached[i]))}))
