#!/usr/bin/env bash
# GPU check (< 5 minutes on an H200-class GPU): the CUDA tests, then the bench on random-weight
# SmolLM2-135M- and Qwen2.5-0.5B-shaped models with the embedded tokenizer; prints one table.
# Needs one NVIDIA GPU, PyTorch with CUDA and transformers already installed; no network.
# usage: scripts/gpu_check.sh [--n 600] [--tokenizer DIR] [--json FILE]   (PYTHON=... to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "gpu_check: PyTorch sees no CUDA device")'
if "$PYTHON" -c 'import pytest' 2>/dev/null; then
    echo "# CUDA tests"
    "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_backends.py -k cuda
else
    echo "# CUDA tests skipped: pytest is not installed for $PYTHON"
fi
echo "# bench"
exec "$PYTHON" scripts/gpu_check.py "$@"
