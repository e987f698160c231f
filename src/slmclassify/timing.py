"""Timing the sides of a benchmark against each other, under the project's interleaving rule.

The machines are shared and noisy, so sides are never timed in separate runs: within each round
every side runs every unit of work (a batch, a chunk of items, a whole command) in turn, the order
rotating by one at each step (A B, then B A; with three sides A B C, B C A, C A B), after an
untimed warm-up; ratios are computed round by round, side by side, and summarised by their median.

    timings = interleave([Side("old", old), Side("new", new)], units=batches, rounds=3)
    print(render_table(timings, baseline="old"))       # the human table
    print(json_line({"cpu": ..., **timings.summary("old")}))  # one JSON line, printed last

A bottom-layer module: it imports nothing from slmclassify and no torch (a device is synchronised
through the `sync` callable the caller passes), so that every layer, backends included, can use it.
Invariants: `Timings.seconds[name]` is [rounds, units] for every side; `Timings.calls` lists every
timed call in the order it ran.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Clock = Callable[[], float]


@dataclass(frozen=True)
class Side:
    """One way of doing the work, timed against the others."""

    name: str
    run: Callable[[Any], Any]
    """Does one unit of work (its argument); what it returns is kept in `Timings.values`."""
    setup: Callable[[], None] | None = None
    """Untimed, before each of this side's calls (e.g. switching a module constant to this side's value)."""


@dataclass
class Timings:
    """Every timed call of an `interleave` run."""

    names: tuple[str, ...]
    seconds: dict[str, np.ndarray]
    """name -> [rounds, units] seconds of each call."""
    values: dict[str, list[list[Any]]]
    """name -> [round][unit] what the side's call returned."""
    calls: list[tuple[int, int, str]] = field(default_factory=list)
    """(round, unit, side) of every timed call, in the order they ran."""

    @property
    def rounds(self) -> int:
        return self.seconds[self.names[0]].shape[0]

    @property
    def units(self) -> int:
        return self.seconds[self.names[0]].shape[1]

    def per_round(self, name: str) -> np.ndarray:
        """[rounds] seconds of `name` in each round (its units summed)."""
        return self.seconds[name].sum(axis=1)

    def total(self, name: str) -> float:
        return float(self.seconds[name].sum())

    def median(self, name: str) -> float:
        """Median seconds of one round."""
        return float(np.median(self.per_round(name)))

    def best_round(self, name: str) -> float:
        """Seconds of the fastest round."""
        return float(self.per_round(name).min())

    def spread(self, name: str, shortest: float = 0.0) -> float:
        """`name`'s second-best round over its best, minus 1 (how much repeated rounds disagree: a
        machine busy with other work makes them); 0 with one round, or when its best round is
        shorter than `shortest` seconds (too short to tell other work from timer and cache jitter)."""
        rounds = np.sort(self.per_round(name))
        if len(rounds) < 2 or rounds[0] < shortest:
            return 0.0
        return float(rounds[1] / rounds[0] - 1)

    def best_per_unit(self, name: str) -> np.ndarray:
        """[units] each unit's fastest call over the rounds."""
        return self.seconds[name].min(axis=0)

    def ratios(self, base: str, other: str) -> np.ndarray:
        """[rounds] `base`'s seconds over `other`'s, round by round: how many times faster `other` is."""
        return self.per_round(base) / self.per_round(other)

    def speedup(self, base: str, other: str) -> float:
        """The median of `ratios(base, other)`."""
        return float(np.median(self.ratios(base, other)))

    def last(self, name: str) -> list[Any]:
        """[units] what `name` returned in the last round."""
        return self.values[name][-1]

    def summary(self, baseline: str | None = None) -> dict:
        """The figures as plain data (for `json_line`): rounds, units, per side median/best/total
        seconds and, with a `baseline`, each side's speed-up over it (median of the per-round ratios)."""
        sides = {name: {"median_s": round(self.median(name), 6), "best_s": round(self.best_round(name), 6),
                        "total_s": round(self.total(name), 6)} for name in self.names}
        if baseline is not None:
            for name in self.names:
                sides[name]["speedup"] = round(self.speedup(baseline, name), 4)
        return {"rounds": self.rounds, "units": self.units, "sides": sides}


def rotated(names: Sequence[str], step: int) -> list[str]:
    """`names` rotated left by `step`: the order of the sides at one step of the interleaving."""
    k = step % len(names)
    return [*names[k:], *names[:k]]


def interleave(sides: Sequence[Side], units: Sequence[Any] = (None,), rounds: int = 1, *, warmup: int = 1,
               warmup_unit: int = -1, clock: Clock = time.perf_counter, sync: Callable[[], None] | None = None,
               deadline: float | None = None, max_rounds: int | None = None) -> Timings:
    """Time every side on every unit, `rounds` times, in interleaved order.

    Before the first round each side runs `warmup` untimed calls on `units[warmup_unit]` (first calls
    allocate, compile and fill caches). Round r, unit j runs the sides in their given order rotated
    by r + j. `sync` (e.g. a CUDA synchronise) is called before a call's clock starts and before it
    stops. With a `deadline` (a `clock` value), rounds go on after the first `rounds` until the
    clock passes it, at most `max_rounds` in all (default: `rounds`).
    """
    names = tuple(side.name for side in sides)
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"sides need distinct names, got {list(names)}")
    if rounds < 1 or not units:
        raise ValueError(f"need at least one round and one unit, got {rounds} rounds, {len(units)} units")
    by_name = {side.name: side for side in sides}
    for side in sides:
        for _ in range(warmup):
            if side.setup is not None:
                side.setup()
            side.run(units[warmup_unit])
    limit = max(rounds, max_rounds or rounds)
    seconds: dict[str, list[list[float]]] = {name: [] for name in names}
    values: dict[str, list[list[Any]]] = {name: [] for name in names}
    calls: list[tuple[int, int, str]] = []
    r = 0
    while r < rounds or (deadline is not None and r < limit and clock() < deadline):
        for name in names:
            seconds[name].append([0.0] * len(units))
            values[name].append([None] * len(units))
        for j, unit in enumerate(units):
            for name in rotated(names, r + j):
                side = by_name[name]
                if side.setup is not None:
                    side.setup()
                if sync is not None:
                    sync()
                start = clock()
                value = side.run(unit)
                if sync is not None:
                    sync()
                seconds[name][r][j] = clock() - start
                values[name][r][j] = value
                calls.append((r, j, name))
        r += 1
    return Timings(names, {name: np.array(s) for name, s in seconds.items()}, values, calls)


class Stopwatch:
    """Seconds summed over `with` blocks: one measurement, or a side timed inside another side's run
    (e.g. a loop advanced by a progress callback, whose seconds are then taken out of the outer run's)."""

    def __init__(self, clock: Clock = time.perf_counter, sync: Callable[[], None] | None = None):
        self.clock, self.sync = clock, sync
        self.seconds = 0.0
        self._start: float | None = None

    def __enter__(self) -> Stopwatch:
        if self.sync is not None:
            self.sync()
        self._start = self.clock()
        return self

    def __exit__(self, *exc) -> None:
        if self.sync is not None:
            self.sync()
        self.seconds += self.clock() - self._start
        self._start = None


def render_table(timings: Timings, baseline: str | None = None) -> str:
    """The human table: per side, the median and best seconds of a round and the total; with a
    `baseline`, the speed-up over it (median of the per-round ratios) and its range over the rounds."""
    width = max(8, *(len(name) for name in timings.names))
    head = f"{'side':<{width}} {'median s':>9} {'best s':>9} {'total s':>9}"
    if baseline is not None:
        head += f" {'speed-up':>9} {'range':>15}"
    lines = [f"{timings.rounds} round(s) x {timings.units} unit(s), interleaved", head, "-" * len(head)]
    for name in timings.names:
        line = (f"{name:<{width}} {timings.median(name):>9.3f} {timings.best_round(name):>9.3f} "
                f"{timings.total(name):>9.3f}")
        if baseline is not None:
            ratios = timings.ratios(baseline, name)
            line += f" {timings.speedup(baseline, name):>8.3f}x {f'{ratios.min():.3f}-{ratios.max():.3f}':>15}"
        lines.append(line)
    return "\n".join(lines)


def json_line(data: Mapping[str, Any], **dumps) -> str:
    """`data` as one line of JSON (numpy numbers and arrays as plain ones): a benchmark's last line."""
    return json.dumps(data, default=_plain, **dumps)


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
