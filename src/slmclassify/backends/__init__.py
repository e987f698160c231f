"""Device and precision backends of the fast path: where tensors live, which matrix-multiply
kernel runs each linear layer, and which attention kernel returns the log-sum-exp.

The engine (`core/engine/`) knows nothing of devices or kernels beyond a `Backend`: it asks it for
one linear op per weight (`Backend.linear`) and calls `Backend.attend` for attention. Every
backend computes the same function as the Hugging Face forward; fp32 backends exactly (within
1e-4 in label log-probability), low precisions (bf16, fp16, int8) within the agreement that
`models/precision.py` measures before `--precision auto` may pick one.
"""
