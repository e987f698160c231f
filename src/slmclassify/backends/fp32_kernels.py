"""A float32 attention kernel for the engine's packed rows, a small C function compiled at first use.

PyTorch's CPU flash-attention kernel is slow on the engine's shapes (64-wide heads, rows of
20-450 keys: a fraction of the matmuls' rate), and around it the engine copies
q/k/v into a padded layout, runs the prefix and the row as two calls and merges them by their
log-sum-exps. `attend_rows` does all of it in one pass per (row, KV head), straight from the
packed q/k/v that the projection wrote, with the cached prefix as the first keys of every row:

    keys of row b:   [ p p p p | s s s s n1 n2 ]     p = prefix (cached), s = item, n = trie node
    query s_i sees   the prefix and s_0 .. s_i (causal)
    query n_t sees   the prefix, every s of the row, and the nodes u with ancestors[t, u] (itself too)

Per (row, KV head) the keys are transposed once into [D, K] so that scores for 8 queries x 32
keys (AVX-512; 4 x 16 with AVX2's 16 registers) accumulate in registers (plain C loops that -O3
vectorises for both); softmax in float32 with a Cephes exp (relative error ~1e-7) on whole
vectors, its 1 / sum applied to the output row; the G query heads of a GQA group reuse the
transposed keys. Results equal the torch path within float32 rounding (~1e-6). 8 queries a
block rather than 4, and no scalar exp tail or separate normalising pass: each is fewer passes over
the scores (together 1.6x this kernel, docs/results.md).

The C source, `csrc/fp32_attention.c`, is compiled at first use like int8's passes (`native.py`:
same compiler, cache folder, CPU-named library, and `SLMCLASSIFY_CC=` disables it); where it
cannot be built, `load()` is None and the engine keeps the torch kernels. Heads wider than
`MAX_HEAD_DIM` are refused (the torch path runs them).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from . import native
from .native import C, I, F, P, ptr, threads

MAX_HEAD_DIM = 256

ENABLED = True
"""Whether CPU float32 engines use the kernel (where it builds); False: the torch kernels (A/B, tests)."""


def load(cache_dir: Path | None = None, flags: tuple[str, ...] | None = None):
    """The compiled library (ctypes), or None where it cannot be built (see `unavailable`).
    `flags` (tests): compile with these instead of `native.compile_flags()` (e.g. AVX2 only)."""
    return LIBRARY.load(cache_dir, flags)


def attention_pays(lib) -> bool:
    """Whether `attend_rows` beats the torch path here: where it was compiled for AVX-512 or AVX2 (both
    measured faster, docs/performance.md); below AVX2 (unmeasured) the torch kernels run."""
    return bool(lib.built_with_avx2())


def attention_off() -> str | None:
    """Why float32 attention on this CPU does not run through `attend_rows` (None: it does)."""
    if not ENABLED:
        return "switched off"
    lib = load()
    if lib is None:
        return unavailable()
    return None if attention_pays(lib) else "the C kernel needs AVX2"


def unavailable(cache_dir: Path | None = None) -> str | None:
    """Why the kernel cannot run here (None when it can)."""
    return LIBRARY.unavailable(cache_dir)


def _bind(lib) -> None:
    lib.attend_rows.argtypes = [P, I, I, I, P, P, I, I, P, P, P, I, C, P, F, C]
    lib.attend_rows.restype = None
    lib.vector_width.argtypes = []
    lib.vector_width.restype = C
    lib.built_with_avx2.argtypes = []
    lib.built_with_avx2.restype = C
    lib.rms_rows.argtypes = [P, I, I, I, F, P, C]
    lib.rms_rows.restype = None
    lib.swiglu_rows.argtypes = [P, I, I, C]
    lib.swiglu_rows.restype = None


LIBRARY = native.Library("fp32_attention.c", "fp32-attention", _bind)


def attend_rows(lib, qkv: torch.Tensor, n_heads: int, starts: torch.Tensor, lengths: torch.Tensor,
                ancestors: torch.Tensor | None, prefix: tuple[torch.Tensor, torch.Tensor] | None,
                read_only: bool) -> torch.Tensor:
    """Attention of packed rows, [Nq, H, D] float32 (see the module docstring).

    qkv [N, H + 2 H_kv, D] float32 contiguous, rotary applied; starts, lengths [B] int64 (each row's
    first packed token and its number of item tokens; its T trie nodes follow them); ancestors
    [T, T] uint8 or None (T = 0); prefix: keys and values [H_kv, P, D] contiguous, or None.
    read_only: queries only at each row's last item token and its nodes (Nq = B (1 + T)), else at
    every token (Nq = N)."""
    N, heads, D = qkv.shape
    native.check(qkv.dtype == torch.float32 and qkv.is_contiguous() and D <= MAX_HEAD_DIM,
                 f"q/k/v not contiguous float32 with heads of at most {MAX_HEAD_DIM}")
    n_kv = (heads - n_heads) // 2
    B = starts.shape[0]
    T = 0 if ancestors is None else ancestors.shape[0]
    P = 0 if prefix is None else prefix[0].shape[1]
    out = torch.empty(B * (1 + T) if read_only else N, n_heads, D)
    lib.attend_rows(ptr(qkv), n_heads, n_kv, D, ptr(starts), ptr(lengths), B, T,
                    ptr(ancestors) if T else None, ptr(prefix[0]) if P else None,
                    ptr(prefix[1]) if P else None, P, int(read_only), ptr(out), 1.0 / math.sqrt(D),
                    threads())
    return out


def elementwise():
    """The library where CPU float32 ops may use its fused passes (`rms_norm`, `swiglu_`), else None."""
    return load() if ENABLED else None


def rms_norm(lib, x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) per row, a new [N, d] tensor, for x [N, d] float32 on the CPU with unit
    stride along rows (`gemm.rms_norm` in one pass)."""
    native.check(x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1 and x.device.type == "cpu",
                 "an input not float32 [N, in] on the CPU with unit row stride")
    out = torch.empty(x.shape)
    lib.rms_rows(ptr(x), x.shape[0], x.shape[1], x.stride(0), eps, ptr(out), threads())
    return out


def swiglu_(lib, gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up [N, I] for gate_up [N, 2I] = [gate | up] float32 contiguous on the CPU, written
    over the gate half (returned as a view with row stride 2I)."""
    native.check(gate_up.dtype == torch.float32 and gate_up.is_contiguous() and gate_up.device.type == "cpu",
                 "[gate | up] not contiguous float32 on the CPU")
    m = gate_up.shape[1] // 2
    lib.swiglu_rows(ptr(gate_up), gate_up.shape[0], m, threads())
    return gate_up[:, :m]
