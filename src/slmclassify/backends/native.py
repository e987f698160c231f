"""Small C libraries compiled at first use (`int8_kernels.py`, `fp32_kernels.py`).

Each source is compiled with the system's C compiler (`cc`, else `gcc`; `SLMCLASSIFY_CC` names
another, an empty value disables them) with -O3 -march=native -fopenmp (-march=x86-64-v3 or v4
under an instruction-set cap, `isa.march`) into the user cache folder,
once per CPU (model and flags: a home folder may be shared between machines, and -march=native
code may use instructions another CPU lacks) and source, and loaded through ctypes. OpenMP resolves
to the libgomp that PyTorch has already loaded (same soname), so no second thread pool appears;
each call uses PyTorch's thread count. Where nothing builds, `Library.load` returns None and
`Library.unavailable` says why: the callers then run their torch paths.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from . import isa

VEXP = r"""
/* exp(x), Cephes' polynomial (relative error ~1e-7) in a form the compiler vectorises. */
static inline float vexp(float x)
{
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = __builtin_rintf(x * 1.44269504088896341f);
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float f;
    memcpy(&f, &e, 4);
    return p * f;
}

/* The same on GCC vectors of 8 floats (any x86-64 level; 16 where AVX-512 is there: vexpv, VEXP_W lanes).
   Loops calling the scalar vexp vectorise under AVX-512 but not under AVX2, where GCC does not
   if-convert the float clamp ("control flow in loop"): a scalar exp per element there. Here the clamp
   is a bitwise select and rint is the 1.5 * 2^23 trick (round to nearest even, as rintf). */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
#define VEXP_VECTOR(name, VF, VI)                                                                    \
static inline VF name(VF x)                                                                          \
{                                                                                                    \
    const VF zero = {0}, lo = zero - 87.0f, hi = zero + 88.0f, big = zero + 12582912.0f;             \
    const VI below = x < lo, above = x > hi;                                                         \
    x = (VF)(((VI)lo & below) | ((VI)hi & above) | ((VI)x & ~(below | above)));                     \
    const VF n = (x * 1.44269504088896341f + big) - big;                                             \
    VF r = x - n * 0.693359375f;                                                                     \
    r = r + n * 2.12194440e-4f;                                                                      \
    VF p = zero + 1.9875691500e-4f;                                                                  \
    p = p * r + 1.3981999507e-3f;                                                                    \
    p = p * r + 8.3334519073e-3f;                                                                    \
    p = p * r + 4.1665795894e-2f;                                                                    \
    p = p * r + 1.6666665459e-1f;                                                                    \
    p = p * r + 5.0000001201e-1f;                                                                    \
    p = p * r * r + r + 1.0f;                                                                        \
    return p * (VF)((__builtin_convertvector(n, VI) + 127) << 23);                                   \
}
VEXP_VECTOR(vexp8, v8f, v8i)
#ifdef __AVX512F__
#define VEXP_W 16
typedef float vexp_f __attribute__((vector_size(64)));
typedef int32_t vexp_i __attribute__((vector_size(64)));
VEXP_VECTOR(vexpv, vexp_f, vexp_i)
#else
#define VEXP_W 8
typedef v8f vexp_f;
#define vexpv vexp8
#endif

/* s[j] = exp(s[j] - shift) for j < n; returns their sum (a softmax's numerators and denominator). */
static inline float exp_shifted(float *s, int64_t n, float shift)
{
    vexp_f sums = {0};
    int64_t j = 0;
    for (; j + VEXP_W <= n; j += VEXP_W) {
        vexp_f v;
        memcpy(&v, s + j, sizeof v);
        v = vexpv(v - shift);
        memcpy(s + j, &v, sizeof v);
        sums += v;
    }
    float sum = 0.0f;
    for (int i = 0; i < VEXP_W; i++) sum += sums[i];
    for (; j < n; j++) { const float p = vexp(s[j] - shift); s[j] = p; sum += p; }
    return sum;
}

/* out[j] = silu(g[j]) * u[j] = g[j] / (1 + exp(-g[j])) * u[j] for j < n (out may be g). */
static inline void silu_mul(float *out, const float *g, const float *u, int64_t n)
{
    int64_t j = 0;
    for (; j + VEXP_W <= n; j += VEXP_W) {
        vexp_f a, b;
        memcpy(&a, g + j, sizeof a);
        memcpy(&b, u + j, sizeof b);
        a = a / (1.0f + vexpv(-a)) * b;
        memcpy(out + j, &a, sizeof a);
    }
    for (; j < n; j++) out[j] = g[j] / (1.0f + vexp(-g[j])) * u[j];
}
"""
"""exp(x) for the C sources (`int8_kernels.SOURCE`, `fp32_kernels.SOURCE`), included by name: `vexp`
(scalar), `vexp8` (8 lanes), `vexpv` (VEXP_W lanes: the machine's width)."""



def compile_flags() -> list[str]:
    """The compiler flags: -march follows the instruction-set cap (`isa.march`)."""
    return ["-O3", f"-march={isa.march()}", "-fopenmp", "-shared", "-fPIC"]


COMPILER_ENV = "SLMCLASSIFY_CC"
"""Names the C compiler (default: cc, else gcc); an empty value disables every C library."""

P, I, F, C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
"""ctypes argument types of the C functions: pointer, int64, float, int."""


class Library:
    """One C source: compiled and loaded at first use per cache folder (and flags), kept for the process."""

    def __init__(self, source: str, stem: str, bind) -> None:
        self.source, self.stem, self.bind = source, stem, bind
        self._built: dict = {}

    def load(self, cache_dir: Path | None = None, flags: tuple[str, ...] | None = None):
        """The library (ctypes, signatures declared by `bind`), or None where it cannot be built.
        `flags` (tests): compile with these instead of `compile_flags()` (e.g. AVX2 only)."""
        key = (str(cache_dir), flags)
        if key not in self._built:
            self._built[key] = build(cache_dir, self.source, self.stem, self.bind,
                                     compile_flags() if flags is None else list(flags))
        return self._built[key][0]

    def unavailable(self, cache_dir: Path | None = None, flags: tuple[str, ...] | None = None) -> str | None:
        """Why the library cannot be built here (None when it can)."""
        self.load(cache_dir, flags)
        return self._built[(str(cache_dir), flags)][1]


def compiler() -> str | None:
    """The C compiler to use (COMPILER_ENV, else cc, else gcc), or None."""
    named = os.environ.get(COMPILER_ENV)
    if named is not None:
        return shutil.which(named) if named else None
    return shutil.which("cc") or shutil.which("gcc")


def build(cache_dir: Path | None, source: str, stem: str, bind, flags: list[str]):
    """(library, None) or (None, why not): `source` compiled with `flags` into
    `cache_dir`/kernels/`stem`-<digest>.so (default folder: the user cache) and loaded; `bind(lib)`
    declares its functions' signatures.

    A compiled library is trusted only as built: its SHA-256 is written beside it
    (`stem-<digest>.so.sha256`) and checked before it is loaded, and `bind` must find every symbol; a
    library that fails either (truncated, bytes changed, another library copied over it) is built
    again instead of being loaded (loading one crashed the process: a bus error, an illegal
    instruction, a segmentation fault)."""
    if os.environ.get(COMPILER_ENV) == "":
        return None, f"disabled ({COMPILER_ENV} is empty)"
    cc = compiler()
    if cc is None:
        return None, f"no C compiler found (install gcc, or name one in {COMPILER_ENV})"
    if cache_dir is None:
        from ..cache import cache_root

        cache_dir = cache_root()
    # -march=native: a library built on another CPU (a home folder shared between machines) may use
    # instructions this one lacks, so the CPU is part of the name
    digest = hashlib.sha256((source + " ".join(flags) + cc + cpu_identity()).encode()).hexdigest()[:16]
    folder = Path(cache_dir) / "kernels"
    target = folder / f"{stem}-{digest}.so"
    for attempt in (0, 1):
        if attempt or not _intact(target):
            why = _compile(cc, flags, source, stem, folder, target)
            if why:
                return None, why
        try:
            lib = ctypes.CDLL(str(target))
            bind(lib)
        except (OSError, AttributeError) as exc:
            if attempt:
                return None, f"loading {target} failed: {exc}"
            continue  # e.g. another library copied over it: built again once
        return lib, None
    return None, f"loading {target} failed"


def _compile(cc: str, flags: list[str], source: str, stem: str, folder: Path, target: Path) -> str | None:
    """Compile `source` into `target` and record its SHA-256 beside it; why not, or None."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            src = Path(tmp) / f"{stem}.c"
            src.write_text(source)
            built = Path(tmp) / f"{stem}.so"
            done = subprocess.run([cc, *flags, "-o", str(built), str(src)], capture_output=True, text=True,
                                  timeout=120)
            if done.returncode != 0:
                return f"{cc} failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
            recorded = Path(tmp) / "sha256"
            recorded.write_text(_sha256(built))
            os.replace(built, target)  # atomic: another process may be compiling the same file
            os.replace(recorded, _recorded(target))
    except (OSError, subprocess.SubprocessError) as exc:
        return f"compiling with {cc} failed: {exc}"
    return None


def _recorded(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _intact(target: Path) -> bool:
    """Whether the compiled library is byte for byte what was built (its recorded SHA-256)."""
    try:
        return _recorded(target).read_text().strip() == _sha256(target)
    except OSError:
        return False


def cpu_identity() -> str:
    """This CPU's model name and flags (/proc/cpuinfo), or the platform's name where there is none."""
    try:
        with open("/proc/cpuinfo") as fh:
            lines = [line for line in fh if line.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


def ptr(t: torch.Tensor | None):
    """A tensor's data as a C pointer (None for None)."""
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def threads() -> int:
    """Threads of a C pass: PyTorch's thread count."""
    return torch.get_num_threads()
