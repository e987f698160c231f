"""Peak RSS per phase of one `slmclassify classify` run, in this process.

Usage: python benchmarks/rss_phases.py MODEL|'' INPUT.csv [classify options...]   ('' = embedded model)

A thread reads VmRSS from /proc/self/status every 2 ms; the phase is named by wrapping the
functions that make it (loading, reading the weights, the GEMM measurement, the engine,
calibration, scoring, the probes). Prints, per phase, the peak and the RSS when it ended, then
ru_maxrss. Linux only (MiB throughout).
"""

import functools
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

PHASE = ["import"]
PEAK: dict[str, list[float]] = {}


def _rss() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


def _sample() -> None:
    while True:
        phase, rss = PHASE[-1], _rss()
        peak = PEAK.setdefault(phase, [rss, rss])
        peak[0], peak[1] = max(peak[0], rss), rss
        time.sleep(0.002)


threading.Thread(target=_sample, daemon=True).start()

from slmclassify import classifier  # noqa: E402
from slmclassify.cli.main import cli  # noqa: E402
from slmclassify.core.engine import Engine  # noqa: E402
from slmclassify.jobs import classify as classify_job  # noqa: E402
from slmclassify.models import loading, weights  # noqa: E402

PHASE.append("after import")


def _wrap(owner, name: str, label: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        PHASE.append(label)
        try:
            return original(*args, **kwargs)
        finally:
            PHASE.append(f"after {label}")

    setattr(owner, name, wrapped)


_wrap(loading, "_convert_gguf", "GGUF conversion")
_wrap(loading, "_load_pretrained", "config + tokenizer + weights")
_wrap(weights, "from_safetensors", "read weights")
_wrap(loading, "_ready", "GEMM choice + Engine()")
_wrap(Engine, "__init__", "Engine()")
_wrap(classifier.Classifier, "content_free_prior", "calibration")
_wrap(classifier.Classifier, "score_window", "scoring")
_wrap(classify_job, "compare", "probes (reference path)")

args = ["classify", sys.argv[2], "-o", str(Path(tempfile.mkdtemp()) / "out.csv"), "--quiet", *sys.argv[3:]]
if sys.argv[1]:
    args += ["--model", sys.argv[1]]
cli.main(args, standalone_mode=False)
time.sleep(0.05)
print(f"{'phase':<34} {'peak MiB':>9} {'end MiB':>9}")
for phase, (peak, end) in PEAK.items():
    print(f"{phase:<34} {peak:9.0f} {end:9.0f}")
print(f"ru_maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
