"""The instruction set this process computes with: the CPU's, or less where a cap says so.

oneDNN honours `ONEDNN_MAX_CPU_ISA` (its int8, bf16 and packed float32 kernels), PyTorch's own
vectorised kernels `ATEN_CPU_CAPABILITY`, MKL (float32 `mm`) `MKL_ENABLE_INSTRUCTIONS` and FBGEMM
(the x86/fbgemm int8 engines) `FBGEMM_ENABLE_INSTRUCTIONS`. The C kernels (`native.py`) follow the lower of the two
caps, so that one capped run on an AVX-512 machine computes as a CPU of that level would: `AVX2`
as an AMD Zen 2/3 or most laptops, `AVX512_CORE` as a Skylake server (AVX-512 without VNNI).
`make test` runs the kernel tests under both caps for that reason.

No imports from the rest of the package: `native.py`, `device.py` and `choice.py` all use it.
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache

LEVELS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
          "AVX512_CORE_BF16", "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16")
"""oneDNN's `ONEDNN_MAX_CPU_ISA` values, lowest first (its older names map onto them below)."""
_ALIASES = {"AVX512_CORE_FP16": "AVX10_1_512", "AVX512_CORE_AMX": "AVX10_1_512_AMX",
            "AVX512_CORE_AMX_FP16": "AVX10_1_512_AMX_FP16"}
_ATEN = {"default": "SSE41", "avx2": "AVX2", "avx512": "AVX512_CORE"}
"""`ATEN_CPU_CAPABILITY` values and the oneDNN level that has the same vector instructions."""
_FLAG_LEVEL = {"avx2": "AVX2", "fma": "AVX2", "avx_vnni": "AVX2_VNNI", "avx512_vnni": "AVX512_CORE_VNNI",
               "avx512_bf16": "AVX512_CORE_BF16", "avx512_fp16": "AVX10_1_512", "amx_tile": "AVX10_1_512_AMX",
               "amx_int8": "AVX10_1_512_AMX", "amx_bf16": "AVX10_1_512_AMX", "amx_fp16": "AVX10_1_512_AMX_FP16"}


def onednn_cap() -> str | None:
    """`ONEDNN_MAX_CPU_ISA` as one of `LEVELS` (None: unset, ALL, DEFAULT or unknown, so no cap)."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    cap = _ALIASES.get(cap, cap)
    return cap if cap in LEVELS else None


def aten_cap() -> str | None:
    """`ATEN_CPU_CAPABILITY` as one of `LEVELS` (None: unset or unknown)."""
    return _ATEN.get(os.environ.get("ATEN_CPU_CAPABILITY", "").lower())


def cap() -> str | None:
    """The lower of the two caps (None: neither is set)."""
    caps = [c for c in (onednn_cap(), aten_cap()) if c is not None]
    return min(caps, key=LEVELS.index) if caps else None


def describe_cap() -> str:
    """The caps in force, as environment assignments ('' when none): part of every cache key and
    figure that depends on the kernels."""
    parts = []
    if onednn_cap() is not None:
        parts.append(f"ONEDNN_MAX_CPU_ISA={os.environ['ONEDNN_MAX_CPU_ISA'].upper()}")
    if aten_cap() is not None:
        parts.append(f"ATEN_CPU_CAPABILITY={os.environ['ATEN_CPU_CAPABILITY'].lower()}")
    for name in ("MKL_ENABLE_INSTRUCTIONS", "FBGEMM_ENABLE_INSTRUCTIONS"):  # float32 `mm`; the x86/fbgemm int8 engines
        if os.environ.get(name):
            parts.append(f"{name}={os.environ[name].upper()}")
    return " ".join(parts)


def above_cap(flags: frozenset[str], cap: str | None) -> frozenset[str]:
    """The flags a process may not use under the level `cap` (e.g. AVX2 on an AVX-512 machine: its
    bf16 matmuls then crawl at ~1 GFLOP/s, as on a CPU without AVX512-BF16)."""
    cap = _ALIASES.get((cap or "").upper(), (cap or "").upper())
    if cap not in LEVELS:  # unset, ALL, DEFAULT or unknown: no limit
        return frozenset()
    limit = LEVELS.index(cap)

    def level(flag: str) -> int:
        if flag in _FLAG_LEVEL:
            return LEVELS.index(_FLAG_LEVEL[flag])
        return LEVELS.index("AVX512_CORE") if flag.startswith("avx512") else -1

    return frozenset(f for f in flags if level(f) > limit)


@lru_cache(maxsize=1)
def native_flags() -> frozenset[str]:
    """This CPU's flags (/proc/cpuinfo; empty where there is none), whatever the caps."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """This CPU's flags less those above the oneDNN cap (the one that decides which matmul kernels run)."""
    flags = native_flags()
    return flags - above_cap(flags, onednn_cap())


def march() -> str:
    """The `-march` for the C kernels: `native`, or the x86-64 level of the cap where one is set
    below this CPU (x86-64-v3 = AVX2 + FMA, x86-64-v4 = AVX-512 F/BW/CD/DQ/VL)."""
    level = cap()
    if level is None or platform.machine().lower() not in ("x86_64", "amd64"):
        return "native"
    index = LEVELS.index(level)
    if index < LEVELS.index("AVX2"):
        return "x86-64-v2"
    if index < LEVELS.index("AVX512_CORE"):
        return "x86-64-v3"
    if "avx512f" in native_flags() and index < LEVELS.index("AVX10_1_512_AMX_FP16"):
        return "x86-64-v4"
    return "native"
