#!/usr/bin/env bash
# GPU check on one NVIDIA GPU, each step in turn, a failing or overrunning step not stopping the next:
#   1. the CUDA tests (pytest -k cuda)
#   2. examples/gpu_check/gpu_check.py bench: slmclassify bench at Qwen2.5-0.5B and SmolLM2-135M shapes (bf16; fp32
#      against the per-item reference path; peak memory; the schedule measured; a profile; the HF anchor)
#   3. tests/test_engine.py and tests/test_families.py with the models on the GPU (SLMCLASSIFY_TEST_DEVICE=cuda)
#   4. examples/gpu_check/gpu_check.py families: every family at a real shape, fp32 exact, bf16 and fp16 against fp32
# Needs PyTorch with CUDA, transformers and pytest (pytest-xdist used when present); no network.
# usage: examples/gpu_check/gpu_check.sh [LOG_DIR]   (PYTHON=..., ANCHOR=path/to/hf_anchor.py; default ../shared/tools/hf_anchor.py;
#        STEPS="cuda_tests bench engine_family_tests families" to run some; BENCH_MODELS=qwen2.5-0.5b,smollm2-135m)
set -uo pipefail
cd "$(dirname "$0")/../.."
LOGS=${1:-out/gpu_check}
mkdir -p "$LOGS"
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
ANCHOR=${ANCHOR:-../shared/tools/hf_anchor.py}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "gpu_check: PyTorch sees no CUDA device")' || exit 2
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; date -u; lscpu | head -15; } \
    > "$LOGS/machine.txt" 2>&1
cat "$LOGS/machine.txt"
workers=$("$PYTHON" -c 'import xdist' 2>/dev/null && echo "-n 8" || echo "")
status=0

STEPS=${STEPS:-cuda_tests bench engine_family_tests families}
BENCH_MODELS=${BENCH_MODELS:-qwen2.5-0.5b,smollm2-135m}

step() {  # step NAME SECONDS COMMAND...: run it with a time limit, its output to $LOGS/NAME.log and here
    local name=$1 limit=$2
    shift 2
    [[ " $STEPS " == *" $name "* ]] || return 0
    echo "== $name (at most ${limit} s): $*"
    local started=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$LOGS/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - started)) s"
    [ "$rc" = 0 ] || status=1
}

step cuda_tests 60 "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_backends.py -k cuda
step bench 480 "$PYTHON" examples/gpu_check/gpu_check.py bench --models "$BENCH_MODELS" --anchor "$ANCHOR" --json "$LOGS/bench.json"
step engine_family_tests 100 env SLMCLASSIFY_TEST_DEVICE=cuda "$PYTHON" -m pytest -q -p no:cacheprovider $workers \
    tests/test_engine.py tests/test_families.py
step families 100 "$PYTHON" examples/gpu_check/gpu_check.py families --json "$LOGS/families.json"
exit $status
