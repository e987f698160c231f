"""Waiting for a device's queued work before a clock reads (`timing.interleave`, `timing.Stopwatch` take it as
`sync`): `timing.py` imports no torch, so the callable comes from here."""

from __future__ import annotations

from collections.abc import Callable

import torch


def sync_of(device: torch.device) -> Callable[[], None] | None:
    """What waits for a device's queued work before a clock reads (None: the CPU, nothing queued)."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return None
