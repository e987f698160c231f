"""A `Backend`: the device, the precision, the GEMM kernel and the attention kernel of one engine.

The residual stream, the norms and the output layer always run in float32; `dtype` is the
precision of the attention inputs (and of the GEMMs for bf16/fp16). int8 keeps float32
activations and quantises only the linear layers' weights (dynamic quantisation: activations
are quantised per call).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import FieldError, TaskError
from . import attention, fp32_kernels, gemm, isa, ordered_gemm
from .names import DEVICES, PRECISIONS

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.float32}


@dataclass(frozen=True)
class Backend:
    """How one engine computes: device, precision and kernels. Built by `make_backend`."""

    device: torch.device
    """Where the weights, the batch and every index/mask tensor live."""
    precision: str
    """fp32, bf16, fp16 or int8 (never auto: resolved before a backend is built)."""
    gemm: str
    """The linear-layer kernel: one of `gemm.KERNELS` (e.g. ordered, mm, onednn, int8-onednn, bf16)."""
    invariant: tuple[tuple[str, bool], ...] = ()
    """("ordered" or "lm_head", passed) pairs: the ordered GEMM's invariance check on this CPU and the
    model's shapes (`gemm.kernel_invariance`, run with the kernel rates). Empty: not checked."""

    def __post_init__(self) -> None:
        if self.precision not in DTYPES:
            raise FieldError("precision", "{field} must be one of {choices} here, got {value!r}",
                             choices=', '.join(PRECISIONS[1:]), value=self.precision)
        if self.gemm not in gemm.KERNELS:
            raise TaskError(f"unknown GEMM kernel {self.gemm!r}; known are {', '.join(gemm.KERNELS)}")

    @property
    def dtype(self) -> torch.dtype:
        """Precision of the attention's q/k/v and of the mask."""
        return DTYPES[self.precision]

    @classmethod
    def exact(cls, device: torch.device, invariant: tuple[tuple[str, bool], ...] = ()) -> Backend:
        """float32 on the float32 weights themselves, with the ordered GEMM where it runs (else `mm`): an
        engine's default, and what a low-precision engine measures calibration with (`Engine.exact`)."""
        kernel = "ordered" if "ordered" in gemm.fp32_kernels(device) else "mm"
        return cls(device=device, precision="fp32", gemm=kernel, invariant=invariant)

    @property
    def copy_bytes_per_weight(self) -> int:
        """Bytes per linear weight that the GEMM kernel keeps beside the float32 weights the model's
        modules share: oneDNN's blocked float32 copy, or the low-precision copy a bf16, fp16 or int8
        kernel computes with; none for `mm`."""
        kernel = self.gemm
        return 4 if kernel == "onednn" else 2 if kernel in ("bf16", "fp16") else 1 if kernel.startswith("int8") else 0

    def linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None, smooth=None) -> gemm.LinearOp:
        """A linear op computing x @ weight (+ bias) for `weight` [in, out] in float32. `smooth` (a
        `smoothing.Smoothing`, int8 kernels only) rescales it: the op then computes
        (x @ weight + bias) / smooth.cols for inputs already divided upstream (see `smoothing.py`).
        """
        if smooth is None:
            return gemm.KERNELS[self.gemm](weight, bias, self.dtype)
        return gemm.KERNELS[self.gemm](weight, bias, self.dtype, smooth)

    def output_layer(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> gemm.LinearOp:
        """The output layer's op for its weight [vocab, hidden] (`gemm.output_layer`): float32 always,
        on the ordered GEMM where this backend's float32 kernel is (so an int8 engine's output layer
        is the exact engine's)."""
        return gemm.output_layer(self.float32_kernel, weight, bias)

    def log_softmax(self, logits: torch.Tensor) -> torch.Tensor:
        """The output layer's log-probabilities, each row's sum in a fixed order where the ordered GEMM
        runs (`gemm.log_softmax`)."""
        return gemm.log_softmax(self.float32_kernel, logits)

    @property
    def float32_kernel(self) -> str:
        """The output layer's kernel, float32 at every precision: the ordered GEMM where it runs, unless a
        vendor float32 kernel was asked for (`mm` then, `F.linear`)."""
        return "ordered" if self.gemm not in ("mm", "onednn") and "ordered" in gemm.fp32_kernels(self.device) else "mm"

    def gemm_variance(self) -> str | None:
        """Why this backend's GEMMs make a row's bits depend on its batch (None: they do not: the
        ordered GEMM, by construction, and its check on this CPU, where one ran, agrees)."""
        kernel = self.gemm
        if kernel == "ordered":
            failed = [k for k, passed in self.invariant if not passed]
            return (f"the ordered GEMM failed its invariance check here ({', '.join(failed)}): a bug in slmclassify, "
                    f"please report it with this CPU's name" if failed else None)
        if not gemm.KERNELS[kernel].rows_apart:
            return f"the {kernel} GEMM shares one quantisation range across a call's rows"
        if self.device.type != "cpu":
            return f"the {self.device.type} GEMMs pick their kernels, and with them each sum's order, by the call's shape"
        if kernel in ("mm", "onednn"):
            why = gemm.ordered_unavailable()
            lead = f"the {kernel} GEMM orders its sums by the call's shape on this CPU"
            return f"{lead}; the ordered GEMM cannot run here: {why}" if why else f"{lead} (asked for by SLMCLASSIFY_FP32_KERNEL)"
        if kernel.startswith("int8"):  # integer sums, exact in any order; the float passes around them unchecked
            return f"the {kernel} GEMM is not made batch-invariant (float32's ordered GEMM is)"
        return f"the {kernel} GEMM orders its sums by the call's shape on this CPU (only float32's ordered GEMM does not)"

    @property
    def smooths(self) -> bool:
        """Whether this backend's linear ops take activation smoothing (the int8 kernels)."""
        return self.gemm.startswith("int8")

    def attend(self, q, k, v, mask, causal: bool = True, lower: bool = False):
        """(out [B, Q, H, D], lse [B, Q, H] float32) for q [B, H, Q, D]; see `attention` (`lower`: the
        mask hides every key after its query)."""
        kernel = attention.attend_cuda if self.device.type == "cuda" else attention.attend_cpu
        return kernel(q, k, v, mask, causal, lower=lower)

    def packs_attention(self, head_dim: int) -> bool:
        """Whether `attend_packed` runs here: float32 attention on the CPU (fp32 and int8), heads of
        at most `fp32_kernels.MAX_HEAD_DIM`, and nothing in `fp32_kernels.attention_off`."""
        return (self.device.type == "cpu" and self.dtype == torch.float32 and head_dim <= fp32_kernels.MAX_HEAD_DIM
                and fp32_kernels.attention_off() is None)

    def attend_packed(self, qkv, n_heads, starts, lengths, ancestors, prefix, read_only: bool):
        """[Nq, H, D] attention of packed rows with their prefix and trie nodes (`fp32_kernels.attend_rows`)."""
        return fp32_kernels.attend_rows(fp32_kernels.load(), qkv, n_heads, starts, lengths, ancestors, prefix,
                                        read_only)

    def describe(self) -> str:
        line = f"{self.device.type} {self.precision} ({self.gemm} GEMM"
        if self.precision == "int8":
            line += f"; {gemm.int8_arithmetic(self.gemm)}"
            if self.gemm not in gemm.COMPILED_INT8 and (why := gemm.int8_kernels.unavailable()):
                line += f"; eager int8 passes: {why}"  # the fused passes would have been timed, and likely chosen
        if self.device.type == "cpu" and self.dtype == torch.float32:  # which attention kernel, and why
            why = fp32_kernels.attention_off()
            wide = fp32_kernels.MAX_HEAD_DIM
            line += f"; torch attention ({why})" if why else f"; C attention (heads up to {wide} wide)"
        return line + ")"


def resolve_device(name: str | torch.device | None) -> torch.device:
    """`auto` (or None) → cuda when available, else cpu; `cuda` without a GPU is an error."""
    name = "auto" if name is None else str(name)
    if name not in DEVICES and not name.startswith("cuda:"):
        raise FieldError("device", "{field} must be one of {choices}, got {value!r}",
                         choices=', '.join(DEVICES), value=name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise FieldError("device", "{field} {value}: no CUDA device is available to this PyTorch ({torch}); "
                         "use {field} cpu", value=name, torch=torch.__version__)
    return torch.device(name)


MATMUL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16", "amx_fp16")
"""The CPU flags that decide low-precision matmul speed (what a figure's machine line should name)."""


def matmul_flags() -> list[str]:
    """The `MATMUL_FLAGS` this CPU has (/proc/cpuinfo; empty elsewhere)."""
    return [flag for flag in MATMUL_FLAGS if flag in isa.cpu_flags()]


def cpu_native(precision: str) -> bool:
    """Whether this CPU multiplies `precision` matrices in hardware.

    bf16 needs AVX512-BF16 or AMX-BF16, fp16 AVX512-FP16 or AMX-FP16: without them PyTorch's
    bf16/fp16 matmuls fall back to scalar code (~1 GFLOP/s measured on an AMD EPYC, 100x slower
    than float32), so `--precision auto` never tries them there. int8 dynamic quantisation
    runs on any x86 CPU PyTorch supports (VNNI makes it faster; without it the weights have 7 bits,
    `gemm.int8_weight_levels`), unless its kernel cannot multiply exactly even then.
    """
    flags = isa.cpu_flags()
    if precision == "bf16":
        return bool({"avx512_bf16", "amx_bf16"} & flags)
    if precision == "fp16":
        return bool({"avx512_fp16", "amx_fp16"} & flags)
    if precision == "int8":
        engine = gemm.int8_engine()
        return engine is not None and gemm.int8_weight_levels(engine) is not None
    return precision == "fp32"
