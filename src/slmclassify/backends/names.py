"""The device and precision names a user may give (`--device`, `--precision`, a task file's keys).
Imports nothing, so task files and settings are checked without loading torch."""

DEVICES = ("auto", "cpu", "cuda")
"""Where the model runs (`--device`; a task file's `device`)."""
PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")
"""How the engine computes (`--precision`; a task file's `precision`)."""
