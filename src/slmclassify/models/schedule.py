"""The fast path's batch schedule measured where it runs: the token budget and row cap.

Which budget is fastest depends on the CPU: a float32 GEMM that is slow at few rows (an AMD Zen 4
here) wants bigger batches than one that is not (an Intel Xeon). So on first use per machine, model
and precision (keyed like the GEMM choice, `choice.machine_key`, cached beside it in
`backends.json`), the engine's own layers are timed on synthetic batches, interleaved round by round:

    phase 1  a workload of items of lognormal lengths (`PROBE_LENGTHS`, about `PROBE_TOKENS` tokens
             in all) after a `PREFIX_TOKENS`-token cached prefix, planned into sorted batches per
             budget in `BUDGETS` exactly as a run plans real items (`plan_batches`, so each
             budget's padding, its rows' spread of lengths and its last, partly filled batch are
             timed too): items per second of each
    phase 2  items of `SHORT_TOKENS` tokens at the chosen budget, rows capped at each of `ROW_CAPS`
             (a cap binds only for short items): items per second of each

Each setting's first batch runs once before the timed rounds (the first call at a size allocates),
and each setting's best of its `ROUNDS` rounds counts. How steady the rounds were is the median
over the settings of each one's second-best round over its best: other work on the machine slows
every setting's rounds, while on a quiet machine only the big budgets' first rounds in a fresh
process run slow, as the heap settles at their sizes; so the largest setting's spread alone would
read a quiet machine as a busy one (docs/results.md, "Figures behind design comments").
Each phase takes the smallest setting within `WITHIN` of its fastest (smaller batches hold less
memory). Only the first `PROBE_LAYERS` layers run (the last as the engine runs a last layer, at the
read positions only), without the output layer: per-layer cost is what the budget changes (the
output layer takes the read states of several batches at once, `Scorer.score`, whatever the
budget), and the probe stays at seconds (on an AMD Zen 4's 2 cores 2.5 s for SmolLM2-135M, 7.5 s
at Granite 350M's shapes, 15 s at Qwen3-0.6B's). Sorting by length is not measured: it only ever
removes padding (docs/performance.md, *The schedule*).

A measurement is provisional, used and measured again at a later start, when the machine was busy
(other processes using more than `choice.OTHERS_BUSY_SHARE` of the cores while it ran, or a load
average above `choice.BUSY_LOAD_PER_CORE` per core) or its repeated rounds disagree by more
than `choice.UNSTEADY` (another process computing at the same time); measurements in progress are
serialised across processes (`choice.measuring`), so two runs starting at once do not time each other.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from pathlib import Path

import numpy as np
import torch

from ..timing import Side, interleave
from ..backends import choice
from ..backends.gemm import STEADY_ROUND_S
from ..backends.sync import sync_of

BUDGETS = {"cpu": (1024, 2048, 4096), "cuda": (8192, 16384, 32768, 65536)}
"""Token budgets timed in phase 1. 8192 is not timed on a CPU: it was never more than 3% faster than
every smaller budget where it was probed, and it cost half of the probe's time (docs/results.md)."""
ROW_CAPS = (64, 128, 256, 512)
PROBE_LENGTHS = (48, 0.8, 8, 384)
"""Phase 1's item lengths: lognormal with this median (tokens after the prefix) and sigma, clipped
to [low, high]: short texts with a long tail, as support tickets and messages are (not the
article's tickets, which the bench times)."""
PROBE_TOKENS = {"cpu": 4500, "cuda": 70000}
"""Phase 1's workload: just over the largest budget, so that every budget fills a batch."""
SHORT_TOKENS = 16
PREFIX_TOKENS = 128
PROBE_LAYERS = 2
ROUNDS = 3
"""Timed rounds per setting; its best counts, its second-best tells how steady they were (see above)."""
WITHIN = 0.03
"""A smaller budget (row cap) is taken when it is within this share of the fastest (about the
rounds' noise on a quiet machine): it holds less memory. The padding a bigger sorted batch of
items of mixed lengths adds is in phase 1's timing itself, which is why phase 1 times items of
mixed lengths rather than one batch of equal ones (docs/results.md)."""
VERSION = 6
"""Bumped when the probe changes, so that schedules measured by another probe are measured again."""


def schedule_key(loaded) -> str:
    backend = loaded.backend
    return (f"{choice.machine_key(backend.device)}|{choice.model_key(loaded.model.config)}|schedule v{VERSION}|"
            f"{backend.precision} {backend.gemm}")


def scheduled(settings, loaded):
    """(`settings` with the fields left to the measurement (`AUTO`) taken from this machine's measured
    schedule, that schedule with the fields it filled as "took"); the schedule is None when `settings`
    give both fields."""
    if not settings.measured:
        return settings, None
    from ..cache import cache_root

    schedule = {**measured_schedule(loaded, cache_root()), "took": settings.measured}
    return dataclasses.replace(settings, **{name: schedule[name] for name in settings.measured}), schedule


def measured_schedule(loaded, cache_dir: Path | None) -> dict:
    """{"token_budget", "max_rows", "rates", ...} for this machine, model and precision:
    cached, or measured now (and cached) when there is none or it was provisional and the machine is quiet."""
    device = loaded.backend.device
    return choice.cached_or_measured(cache_dir, schedule_key(loaded), device,
                                     lambda: measure(loaded.engine, loaded.model.config.vocab_size, device),
                                     fields={"token_budget": int, "max_rows": int})


def measure(engine, vocab_size: int, device: torch.device) -> dict:
    """Time the probe (see the module docstring); the chosen budget and row cap and the rates behind them."""
    from ..core.batching import collate, plan_batches
    from ..core.labels import build_trie

    started = time.perf_counter()
    probe = copy.copy(engine)
    probe.layers = engine.layers[:PROBE_LAYERS]
    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(10, max(11, vocab_size), (n,), generator=g).tolist()  # noqa: E731
    prefix = probe.prefill(ids(PREFIX_TOKENS))
    trie = build_trie(("a", "b", "c"), [tuple(ids(2)) for _ in range(3)], "full")
    sync = sync_of(device)

    def rates(plans: dict[int, list[list[list[int]]]]) -> tuple[dict[int, float], list[float]]:
        """{setting: items/s} of each setting's batches (each a list of items' ids), and each setting's spread."""
        batches = {k: [collate(items, torch.arange(len(items)).numpy(), 0, cached=True) for items in plan]
                   for k, plan in plans.items()}
        for planned in batches.values():  # first calls at a size allocate
            probe.read_states(planned[0], prefix, trie)
        timings = interleave([Side(str(k), lambda _, bs=bs: [probe.read_states(b, prefix, trie) for b in bs])
                              for k, bs in batches.items()], rounds=ROUNDS, warmup=0, sync=sync)
        # a setting's second-best round over its best: a busy machine makes repeated rounds disagree
        spreads = [timings.spread(str(k), STEADY_ROUND_S) for k in batches]
        return {k: sum(len(b.lengths) for b in bs) / timings.best_round(str(k)) for k, bs in batches.items()}, spreads

    budgets = BUDGETS.get(device.type, BUDGETS["cpu"])
    items = [ids(n) for n in probe_lengths(PROBE_TOKENS.get(device.type, PROBE_TOKENS["cpu"]))]
    lengths = np.array([len(item) for item in items])
    by_budget, spreads = rates({b: [[items[i] for i in rows] for rows in plan_batches(lengths, b, max(ROW_CAPS))]
                                for b in budgets})
    budget = _smallest_near_best(by_budget)
    caps = sorted({min(cap, budget // SHORT_TOKENS) for cap in ROW_CAPS})
    if len(caps) > 1:
        by_cap, spreads2 = rates({cap: [[ids(SHORT_TOKENS) for _ in range(cap)]] for cap in caps})
        max_rows, spreads = _smallest_near_best(by_cap), spreads + spreads2
    else:
        by_cap, max_rows = {}, max(caps[0], ROW_CAPS[0])
    spread = float(np.median(spreads))
    return {"token_budget": int(budget), "max_rows": int(max_rows),
            "rates": {str(k): round(v, 1) for k, v in by_budget.items()},
            "row_cap_rates": {str(k): round(v, 1) for k, v in by_cap.items()},
            "spread": round(spread, 3), "measured": time.strftime("%Y-%m-%d %H:%M"),
            "seconds": round(time.perf_counter() - started, 2)}


def probe_lengths(tokens: int) -> list[int]:
    """Phase 1's item lengths (`PROBE_LENGTHS`, seeded): drawn until they add up to `tokens`."""
    median, sigma, low, high = PROBE_LENGTHS
    rng, out, total = np.random.default_rng(0), [], 0
    while total < tokens:
        out.append(int(np.clip(rng.lognormal(np.log(median), sigma), low, high)))
        total += out[-1]
    return out


def _smallest_near_best(rates: dict[int, float]) -> int:
    best = max(rates.values())
    return min(k for k, v in rates.items() if v >= (1 - WITHIN) * best)


def describe(settings, schedule: dict | None) -> str:
    """The schedule a classifier runs with and where it came from, for the `engine:` line:
    `settings` its resolved settings, `schedule` the measurement its `AUTO` fields took (or None)."""
    values = f"token budget {settings.token_budget}, max rows {settings.max_rows}"
    if schedule is None:
        return f"{values} (given)"
    rates = ", ".join(f"{k} {v:.0f}" for k, v in schedule["rates"].items())
    when = "cached" if schedule.get("cached") else "measured now"
    if schedule.get("provisional"):
        when += f", provisional: {choice.provisional_reason(schedule)}; measured again at a later start"
    given = [name.replace("_", " ") for name in ("token_budget", "max_rows") if name not in schedule.get("took", ())]
    return (f"{values} ({' and '.join(given) + ' given; ' if given else ''}measured here: the fastest of a probe's "
            f"items/s by budget, {rates}; {when})")
