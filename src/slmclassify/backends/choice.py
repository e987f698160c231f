"""Choosing a backend by measurement, once per machine and model, cached in the user cache folder.

For float32 on a CPU the ordered GEMM (`ordered_gemm.py`) is the kernel wherever it builds: it is
the one batch-invariant by construction, and an item's scores must not depend on its batch. The
vendor kernels (MKL `mm`, oneDNN prepacked) are timed beside it on the model's own GEMM shapes
(≤ 2 s), so the engine line shows what the invariance costs here; they run only where the ordered
GEMM cannot (no C compiler, no AVX2) or where `SLMCLASSIFY_FP32_KERNEL` asks for one. Between them
oneDNN must beat `mm` by 10% to be chosen, because its packed layout is a second copy of the
weights (`mm` computes with the ones the reference path shares). int8 times PyTorch's quantized engine (eager passes around the GEMM) against int8-fused
(the passes compiled, `int8_kernels.py`, where a C compiler is) and, on CPUs without VNNI,
int8-maddubs (this package's own GEMM), and keeps the fastest. The same measurement gives each
low precision's speed over float32, which `models/precision.py` needs before it checks agreement. Results are kept in
`<cache>/backends.json` under a key naming the machine (CPU, threads, torch) and the model's
shapes, so later runs reuse them without timing anything. A measurement taken while other work
kept the machine busy (load average above `BUSY_LOAD_PER_CORE` per core, other processes using more
than `OTHERS_BUSY_SHARE` of the cores meanwhile, or rounds of one kernel that differ by more than
`UNSTEADY`) is kept as provisional: it is used, and measured again by the
next run that finds the machine quiet. Measurements are serialised across processes (`measuring`:
a lock file in the cache folder), so two runs starting at once never time each other's work; the
second reads what the first measured. The batch schedule is measured and cached the same way
(`models/schedule.py`).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from ..cache import scratch_root, scratch_root_of, tool_version, write_root
from . import gemm, isa
from .device import DTYPES, Backend, cpu_native

CACHE_FILE = "backends.json"
MEASURE_SECONDS = 2.0
BUSY_LOAD_PER_CORE = 1.5
OTHERS_BUSY_SHARE = 0.25
"""A CPU measurement during which other processes (or, on a VM, the host: steal time) kept more than
this share of the machine's cores busy is provisional. The 1-minute load average lags and counts the
measuring process itself, so a full test suite beside a measurement could pass as quiet; the CPU
time the measurement's own process did not use does not (docs/results.md)."""
UNSTEADY = 0.25
"""Rounds of one kernel that differ by more than this share mark the measurement provisional."""
MEASURE_LOCK_S = 120.0
"""How long a process waits for another one's measurement before measuring anyway."""
MIN_COPY_SPEEDUP = 1.1
"""How much faster than `mm` a float32 kernel that copies the weights must be to be chosen."""


def cpu_name() -> str:
    """The processor's model name (/proc/cpuinfo; the platform's words elsewhere)."""
    try:
        with open("/proc/cpuinfo") as fh:
            name = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), None)
    except OSError:
        name = None
    return name or platform.processor() or platform.machine()


def machine_key(device: torch.device) -> str:
    """What the measurement depends on besides the model: the processor (and the instruction-set
    caps in force, `isa.describe_cap`), threads, torch and, on a CPU, the int8 C kernels' source (a
    changed kernel is timed again, not judged by the old one's rate)."""
    chip = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    kernels = ""
    if device.type == "cpu":
        chip += f" ({isa.describe_cap()})" if isa.describe_cap() else ""
        kernels = (f"|int8 kernels {gemm.int8_kernels.source_digest()[:8]}"
                   f"|ordered GEMM {gemm.ordered_gemm.LIBRARY.digest()[:8]}")
    return f"{device.type}|{chip}|{torch.get_num_threads()} threads|torch {torch.__version__}{kernels}"


def model_key(config) -> str:
    return (f"{config.model_type}|h{config.hidden_size}|i{config.intermediate_size}|"
            f"a{config.num_attention_heads}|kv{config.num_key_value_heads or config.num_attention_heads}|"
            f"v{config.vocab_size}")


def mlp_width(config) -> int:
    """The MLP's intermediate width as the model builds it (LFM2 derives it from `intermediate_size`)."""
    inter = config.intermediate_size
    if getattr(config, "block_auto_adjust_ff_dim", False):  # transformers' Lfm2MLP
        inter = int(2 * inter / 3)
        if config.block_ffn_dim_multiplier is not None:
            inter = int(config.block_ffn_dim_multiplier * inter)
        inter = config.block_multiple_of * ((inter + config.block_multiple_of - 1) // config.block_multiple_of)
    return inter


def gemm_shapes(config) -> list[tuple[int, int]]:
    """[in, out] of the engine's four GEMMs per layer: qkv, o, gate_up, down."""
    hidden, inter = config.hidden_size, mlp_width(config)
    heads = config.num_attention_heads
    kv = config.num_key_value_heads or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return [(hidden, (heads + 2 * kv) * head_dim), (heads * head_dim, hidden), (hidden, 2 * inter), (inter, hidden)]


def kernel_for(precision: str, device: torch.device, fp32_kernel: str = "mm", int8_kernel: str | None = None) -> str:
    """The GEMM kernel of a precision on a device (fp32, int8: the measured choice)."""
    if precision == "fp32":
        return fp32_kernel
    if precision == "int8":
        if device.type != "cpu":
            from ..errors import FieldError

            raise FieldError("precision", "{field} int8 runs on the CPU only (dynamic quantisation); "
                                          "use bf16 or fp16 on CUDA")
        if int8_kernel in gemm.COMPILED_INT8 and int8_kernel not in int8_candidates():
            int8_kernel = None  # measured where a compiler was (or on another CPU); not here
        kernel = int8_kernel or gemm.int8_engine() or "int8-onednn"
        gemm.check_int8(kernel)
        return kernel
    return precision  # bf16, fp16


def int8_candidates() -> list[str]:
    """The int8 kernels worth timing here: PyTorch's quantized engine and, where a C compiler
    builds the fused passes (`int8_kernels.py`), int8-fused; on CPUs without VNNI, where oneDNN's
    int8 needs 7-bit weights too, also int8-maddubs (the same arithmetic in this package's own GEMM)."""
    eager = gemm.int8_engine()
    if eager is None:
        return []
    lib = gemm.int8_kernels.load()
    if lib is None:
        return [eager]
    own = gemm.int8_kernels.has_maddubs(lib) and gemm.int8_weight_levels("int8-fused") != 127
    return [eager, "int8-fused"] + (["int8-maddubs"] if own else [])


def int8_choice(rates: dict) -> str | None:
    """The faster of the int8 kernels timed (None: none was)."""
    timed = [k for k in rates if k.startswith("int8")]
    return max(timed, key=lambda k: rates[k]) if timed else None


def measure(config, device: torch.device, cache_dir: Path | None, log=None, head: torch.Tensor | None = None) -> dict:
    """The machine's GEMM rates on this model's shapes: {"gemm": fp32 kernel, "rates": {kernel: GFLOP/s},
    "invariant": {"ordered", "lm_head": whether the ordered GEMM passed its invariance check}}
    (`gemm.kernel_invariance`; `head`: the model's output-layer weight [vocab, hidden], checked
    in place of a random one of its shape).

    Read from the cache when this machine and model were measured before.
    """
    key = f"{machine_key(device)}|{model_key(config)}"
    entry = cached_or_measured(cache_dir, key, device, lambda: _measure_gemm(config, device, head),
                               usable=lambda: _usable(cache_dir, key, device))
    if log and not entry["cached"]:
        rates = entry["rates"]
        log(f"GEMM kernels on this model's shapes: " + ", ".join(f"{k} {v:.0f}" for k, v in rates.items())
            + f" GFLOP/s; float32 uses {entry['gemm']}" + (f", int8 {entry['int8']}" if entry["int8"] else "")
            + (f" ({provisional_reason(entry)}: measured again next run)" if entry.get("provisional") else ""))
    return entry


def cached_or_measured(cache_dir: Path | None, key: str, device: torch.device, measure, usable=None,
                       fields: dict[str, type | tuple] | None = None) -> dict:
    """The cached entry under `key` ({..., "cached": True}) or, when there is none usable
    (`usable()`, default `cached_entry` with `fields`), `measure()`'s under the measurement lock, kept with the
    load it was taken under and marked provisional on a busy machine or when its rounds disagree
    (`spread` above `UNSTEADY`)."""
    usable = usable or (lambda: cached_entry(cache_dir, key, fields))
    entry = usable()
    if entry is not None:
        return {**entry, "cached": True}
    with measuring(cache_dir):
        entry = usable()  # another process may have measured it meanwhile
        if entry is not None:
            return {**entry, "cached": True}
        on_cpu = device.type == "cpu"  # other work on the CPU does not slow a GPU's kernels
        load, before = machine_load(), cpu_seconds() if on_cpu else None
        entry = {**measure(), "load_per_core": round(load, 2)}
        if (others := others_share(before)) is not None:
            entry["others_share"] = round(others, 2)
        busy = load > BUSY_LOAD_PER_CORE or entry.get("others_share", 0.0) > OTHERS_BUSY_SHARE
        if (on_cpu and busy) or entry.get("spread", 0.0) > UNSTEADY:
            entry["provisional"] = True
        store_entry(cache_dir, key, entry)
    return {**entry, "cached": False}


def _usable(cache_dir: Path | None, key: str, device: torch.device) -> dict | None:
    """The cached GEMM measurement, unless it is stale here now: its float32 choice cannot run here (it
    was measured where the ordered GEMM built: a compiler since removed), a kernel that runs here now is
    missing from its rates (the ordered GEMM, int8-fused, int8-maddubs: measured before one could run),
    it has no invariance check (measured by an older version), or it is provisional and the machine is quiet."""
    entry = cached_entry(cache_dir, key, GEMM_FIELDS)
    if entry is None:
        return None
    runs = gemm.fp32_kernels(device)
    if device.type == "cpu" and cpu_native("int8"):
        runs = runs + int8_candidates()
    stale = entry["gemm"] not in gemm.fp32_kernels(device) or not set(runs) <= set(entry["rates"])
    return None if stale else entry


GEMM_FIELDS = {"gemm": str, "rates": dict, "invariant": dict}
"""What a cached GEMM measurement has (`cached_entry`); one without is measured again."""


def _measure_gemm(config, device: torch.device, head: torch.Tensor | None = None) -> dict:
    kernels = gemm.fp32_kernels(device)
    if device.type == "cpu":
        kernels += [k for k in ("bf16", "fp16") if cpu_native(k)]
        if cpu_native("int8"):
            kernels += int8_candidates()
    else:
        kernels += ["bf16", "fp16"]
    weights = [torch.randn(i, o, device=device) * 0.02 for i, o in gemm_shapes(config)]
    rows = 1024 if device.type == "cpu" else 8192
    started = time.perf_counter()
    rates, spread = gemm.time_kernels(kernels, weights, _dtype_of, rows=rows, budget_s=MEASURE_SECONDS,
                                      smoothed=(True, False, True, False))  # qkv, gate_up divide their input (int8)
    fp32 = fp32_choice(rates, device)
    invariant = gemm.kernel_invariance(weights, (config.vocab_size, config.hidden_size), head)
    entry = {"gemm": fp32, "int8": int8_choice(rates), "rates": {k: round(v, 1) for k, v in rates.items()},
             "invariant": invariant, "measured": time.strftime("%Y-%m-%d %H:%M"),
             "seconds": round(time.perf_counter() - started, 2), "spread": round(spread, 3)}
    return entry


def provisional_reason(entry: dict) -> str:
    """Why a measurement is provisional, in words."""
    if entry.get("load_per_core", 0.0) > BUSY_LOAD_PER_CORE:
        return f"machine busy, load {entry['load_per_core']:.1f} per core"
    if entry.get("others_share", 0.0) > OTHERS_BUSY_SHARE:
        return f"machine busy, other work used {100 * entry['others_share']:.0f}% of the cores meanwhile"
    if "spread" in entry:
        return f"its repeated rounds differed by {100 * entry['spread']:.0f}%"
    return "measured by a version that did not record how busy the machine was"


_MEASURED_HERE: set[str] = set()
"""Keys this process measured: a provisional one is measured again at a later start, not at every
classifier a long-lived process (the service, a test session) builds."""


def cached_entry(cache_dir: Path | None, key: str, fields: dict[str, type | tuple] | None = None) -> dict | None:
    """The cached measurement under `key`, or None when there is none, it is not this key's (it records
    the key and version it was measured for: an entry moved under another key, or written by another
    version, is measured again), it is not a measurement of this kind (not an object, or without one of
    `fields` {name: type} of that type: an edited file; measured again and written over, never a
    traceback) or it is
    provisional, the machine is quiet now and this process has not measured it yet (so it is measured again)."""
    entry = _read(cache_dir).get(key)
    if not isinstance(entry, dict) or entry.get("key") != key or entry.get("version") != tool_version() or any(not isinstance(entry.get(name), kind) or isinstance(entry.get(name), bool)
                                          for name, kind in (fields or {}).items()):
        return None
    if _provisional(entry) and key not in _MEASURED_HERE and machine_load() <= BUSY_LOAD_PER_CORE:
        return None
    return {k: v for k, v in entry.items() if k not in ("key", "version")}  # what proves it is the cache's, not the entry's


def store_entry(cache_dir: Path | None, key: str, entry: dict) -> None:
    """Keep `entry` under `key` (read again first: another process may have written other keys)."""
    _MEASURED_HERE.add(key)
    entry = {**entry, "key": key, "version": tool_version()}
    cache = _read(cache_dir)
    cache[key] = entry
    _write(cache_dir, cache)


@contextlib.contextmanager
def measuring(cache_dir: Path | None, timeout_s: float = MEASURE_LOCK_S):
    """Hold the cache folder's measurement lock (`flock` on `.measure.lock`), so that no two processes
    time kernels or schedules at once; after `timeout_s` of waiting, measure anyway."""
    if cache_dir is None:
        yield
        return
    try:
        import fcntl

        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        fh = open(Path(cache_dir) / ".measure.lock", "a")
    except (ImportError, OSError):  # no flock (Windows) or a read-only cache: measure unserialised
        yield
        return
    with fh:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fh, fcntl.LOCK_UN)


def _provisional(entry: dict) -> bool:
    """Measured while the machine was busy, or by a version that did not record how busy it was."""
    return entry.get("provisional", "load_per_core" not in entry)


def cpu_seconds() -> tuple[float, float, float] | None:
    """(wall clock, busy CPU seconds of the whole machine, this process's and its finished children's
    CPU seconds) now, for `others_share`; None where /proc/stat cannot be read (not Linux)."""
    try:
        with open("/proc/stat") as fh:
            ticks = [int(x) for x in fh.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
        busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    own = os.times()  # its children's too: a C compiler it ran for its kernels is its own work
    return time.monotonic(), busy, own.user + own.system + own.children_user + own.children_system


def others_share(before: tuple[float, float, float] | None) -> float | None:
    """The share of the machine's cores that other work kept busy since `before` (`cpu_seconds()`):
    the busy CPU time this process (all its threads, the children it waited for) did not use, over
    wall time × cores."""
    after = cpu_seconds()
    if before is None or after is None or after[0] - before[0] <= 0:
        return None
    others = (after[1] - before[1]) - (after[2] - before[2])
    return max(0.0, others / ((after[0] - before[0]) * (os.cpu_count() or 1)))


def machine_load() -> float:
    """The 1-minute load average per core (0 where the OS does not say)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (OSError, AttributeError):
        return 0.0


FP32_KERNEL_ENV = "SLMCLASSIFY_FP32_KERNEL"
FP32_KERNELS = ("ordered", "mm", "onednn")


def fp32_kernel_of(measured: dict) -> str:
    """The float32 kernel: the choice (`fp32_choice`: the ordered GEMM wherever it runs), or the one
    `SLMCLASSIFY_FP32_KERNEL` names (ordered, mm or onednn). All are exact, but their float32 sums round
    differently in the last digits, and only the ordered GEMM's do not depend on the batch: a vendor
    kernel is for a user who wants its speed where it is faster and accepts that (the engine line says so)."""
    pinned = os.environ.get(FP32_KERNEL_ENV)
    if not pinned:
        return measured["gemm"]  # runs here: a measurement whose choice does not is measured again (`_usable`)
    here = [k for k in FP32_KERNELS if k in measured.get("rates", {})]
    if pinned not in here:
        from ..errors import TaskError

        raise TaskError(f"{FP32_KERNEL_ENV}={pinned} is not a float32 kernel that runs here; set it to one of "
                        f"{', '.join(here)}, or unset it to use the measured choice")
    return pinned


def fp32_choice(rates: dict, device: torch.device) -> str:
    """The float32 kernel: `ordered` wherever it was timed (the batch-invariant one, whatever the vendor
    kernels' rates); else `mm` unless oneDNN is `MIN_COPY_SPEEDUP` faster. `mm` computes with
    the weights the Hugging Face modules share; oneDNN's blocked layout is a second copy of every
    linear weight (the 0.5B model: +1.4 GB for 3.5% on an Intel Xeon)."""
    here = [k for k in gemm.fp32_kernels(device) if k in rates]  # timed, and running here now
    invariant = [k for k in here if k in gemm.INVARIANT_KERNELS]
    if invariant:
        return max(invariant, key=lambda k: rates[k])  # the fastest among the invariant ones
    fastest = max(here, key=lambda k: rates[k])
    return fastest if rates[fastest] >= MIN_COPY_SPEEDUP * rates["mm"] else "mm"


def make_backend(config, device: torch.device, precision: str, cache_dir: Path | None, log=None,
                 head: torch.Tensor | None = None) -> tuple[Backend, dict]:
    """The backend for a concrete precision (not auto), with the (cached) measurement behind it
    (`head`: the model's output-layer weight, for `measure`)."""
    measured = measure(config, device, cache_dir, log, head)
    kernel = kernel_for(precision, device, fp32_kernel_of(measured), measured.get("int8"))
    invariant = tuple(sorted(measured.get("invariant", {}).items()))
    return Backend(device=device, precision=precision, gemm=kernel, invariant=invariant), measured


def speedup(measured: dict, precision: str, device: torch.device) -> float:
    """GEMM rate of a precision over the float32 choice's (0 when it was not measured: not native)."""
    rates = measured["rates"]
    kernel = kernel_for(precision, device, int8_kernel=measured.get("int8"))
    return rates.get(kernel, 0.0) / rates[measured["gemm"]]


def _dtype_of(kernel: str) -> torch.dtype:
    return DTYPES.get(kernel, torch.float32)


def _read(cache_dir: Path | None) -> dict:
    """The cached entries of `cache_dir`, and over them those this process kept in its scratch folder
    (`cache.scratch_root`), where the cache could not be written."""
    if cache_dir is None:
        return {}
    cache = {}
    for folder in (Path(cache_dir), scratch_root_of(Path(cache_dir))):
        try:
            found = json.loads((folder / CACHE_FILE).read_text()) if folder is not None else {}
        except (OSError, ValueError):
            found = {}
        if isinstance(found, dict):  # another JSON value: nothing cached (written over)
            cache.update(found)
    return cache


def _write(cache_dir: Path | None, cache: dict) -> None:
    """Atomic write (several processes may measure at once; the last one wins, all are valid); where the
    cache cannot be written, into this process's scratch folder (one warning, `cache.write_root`)."""
    if cache_dir is None:
        return
    folder = write_root(Path(cache_dir))
    for attempt in (0, 1):
        try:
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".backends-")
            try:
                with os.fdopen(fd, "w") as fh:
                    json.dump(cache, fh, indent=1, sort_keys=True)
                os.replace(tmp, folder / CACHE_FILE)
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            return
        except OSError as exc:  # e.g. a full disk
            if attempt or folder == scratch_root_of(Path(cache_dir)):
                return  # measured again by the next process
            folder = scratch_root(Path(cache_dir), exc.strerror or str(exc))
