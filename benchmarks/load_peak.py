"""Peak RSS of loading a model and arranging its engine, over the RSS before the weights are read.

    .venv/bin/python benchmarks/load_peak.py SOURCE [SOURCE ...]

Each SOURCE (a folder or a `.gguf` file) is loaded in fresh processes with an empty cache folder:
a GGUF file twice (the first run converts it, the second reads the cached folder), a folder once.
Each process loads the model (`models.loading.read_model`: no GEMM measurement, whose buffers are not
loading's) and builds an `Engine` on it (float32 `mm`, which computes with the shared weights).
*Before* is its RSS just before the first weight is read (Python, torch, transformers, the model's
code, the config and, for a folder, the tokenizer), as in the memory table's baseline.
Prints one JSON line per run: the float32 weights (tied matrices once), the RSS before, the peak
(ru_maxrss) and (peak - before) / weights, the figure of [Memory](../docs/memory.md).
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

_RUN = """
import json, resource, sys
from pathlib import Path
import torch
torch.set_num_threads(2)
from transformers import modeling_gguf_pytorch_utils as gguf_utils
from slmclassify.core.engine import Engine
from slmclassify.models import loading, weights as weight_files

def rss():
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024

first = []

def recorded(read, tensors_only=False):
    def call(*args, **kwargs):
        if not first and (kwargs.get("return_tensors") or not tensors_only):
            first.append(rss())
        return read(*args, **kwargs)
    return call

weight_files.from_safetensors = recorded(weight_files.from_safetensors)
gguf_utils.load_gguf_checkpoint = recorded(gguf_utils.load_gguf_checkpoint, tensors_only=True)
model = loading.read_model(sys.argv[1])[0]
before = first[0]
weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values()) / 2**20
Engine(model)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"weights_mib": round(weights), "before_mib": round(before), "peak_mib": round(peak),
                  "ratio": round((peak - before) / weights, 2)}))
"""


def main() -> None:
    for source in sys.argv[1:]:
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "XDG_CACHE_HOME": cache}
            phases = ("conversion", "cached") if source.endswith(".gguf") else ("folder",)
            for phase in phases:
                done = subprocess.run([sys.executable, "-c", _RUN, source], capture_output=True, text=True,
                                      env=env, check=True)
                row = json.loads(done.stdout.strip().splitlines()[-1])
                print(json.dumps({"source": Path(source).name, "run": phase, **row}), flush=True)


if __name__ == "__main__":
    main()
