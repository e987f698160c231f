"""The timing harness (`timing.py`) with fake clocks and sides: order, seconds, ratios, renderers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from slmclassify.timing import Side, Stopwatch, Timings, interleave, json_line, render_table, rotated


class FakeClock:
    """A clock that only moves when a fake side 'works' (`advance`)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def sides_costing(clock: FakeClock, costs: dict[str, float], log: list | None = None) -> list[Side]:
    """Sides that each take `costs[name]` x (unit + 1) seconds of the fake clock and log their calls."""

    def side(name: str, cost: float) -> Side:
        def run(unit):
            if log is not None:
                log.append((name, unit))
            clock.advance(cost * ((unit or 0) + 1))
            return f"{name}{unit}"

        return Side(name, run)

    return [side(name, cost) for name, cost in costs.items()]


def test_calls_rotate_per_unit_and_round_after_a_warm_up():
    clock, log = FakeClock(), []
    timings = interleave(sides_costing(clock, {"a": 1.0, "b": 2.0}, log), units=[0, 1, 2], rounds=2, clock=clock)
    # warm-up: each side once, untimed, on the last unit; then (round + unit) even: a b, odd: b a
    assert log[:2] == [("a", 2), ("b", 2)]
    assert timings.calls == [(0, 0, "a"), (0, 0, "b"), (0, 1, "b"), (0, 1, "a"), (0, 2, "a"), (0, 2, "b"),
                             (1, 0, "b"), (1, 0, "a"), (1, 1, "a"), (1, 1, "b"), (1, 2, "b"), (1, 2, "a")]
    assert [(name, unit) for name, unit in log[2:]] == [(name, unit) for _, unit, name in timings.calls]


def test_three_sides_rotate_by_one():
    assert [rotated("abc", k) for k in range(4)] == [list("abc"), list("bca"), list("cab"), list("abc")]
    clock = FakeClock()
    timings = interleave(sides_costing(clock, {"a": 1, "b": 1, "c": 1}), units=[0], rounds=3, clock=clock,
                         warmup=0)
    assert [name for _, _, name in timings.calls] == list("abcbcacab")


def test_seconds_values_and_ratios():
    clock = FakeClock()
    timings = interleave(sides_costing(clock, {"slow": 3.0, "fast": 1.0}), units=[0, 1], rounds=2, clock=clock)
    # unit u costs cost x (u + 1): slow 3 + 6 per round, fast 1 + 2
    np.testing.assert_array_equal(timings.seconds["slow"], [[3.0, 6.0], [3.0, 6.0]])
    np.testing.assert_array_equal(timings.per_round("fast"), [3.0, 3.0])
    assert timings.total("slow") == 18.0 and timings.median("slow") == 9.0 and timings.best_round("fast") == 3.0
    np.testing.assert_array_equal(timings.best_per_unit("slow"), [3.0, 6.0])
    np.testing.assert_array_equal(timings.ratios("slow", "fast"), [3.0, 3.0])
    assert timings.speedup("slow", "fast") == 3.0 and timings.speedup("fast", "slow") == pytest.approx(1 / 3)
    assert timings.last("fast") == ["fast0", "fast1"] and timings.values["slow"][0] == ["slow0", "slow1"]
    assert (timings.rounds, timings.units) == (2, 2)


def test_ratios_are_per_round_medians_not_of_totals():
    """A round that is slow for both sides (the machine drifted) does not move the median ratio."""
    seconds = {"a": np.array([[1.0], [10.0], [2.0]]), "b": np.array([[0.5], [9.0], [1.0]])}
    timings = Timings(("a", "b"), seconds, {"a": [[None]] * 3, "b": [[None]] * 3})
    np.testing.assert_allclose(timings.ratios("a", "b"), [2.0, 10 / 9, 2.0])
    assert timings.speedup("a", "b") == 2.0  # the ratio of totals would be 13 / 10.5


def test_setup_runs_untimed_before_each_call_and_sync_brackets_the_clock():
    clock, events = FakeClock(), []

    def setup(name):
        def switch():
            events.append(f"setup {name}")
            clock.advance(100.0)  # untimed: before the clock starts

        return switch

    def run(name):
        def work(unit):
            events.append(f"run {name}")
            clock.advance(1.0)

        return work

    sides = [Side(n, run(n), setup(n)) for n in ("x", "y")]
    timings = interleave(sides, rounds=1, warmup=0, clock=clock, sync=lambda: events.append("sync"))
    assert events == ["setup x", "sync", "run x", "sync", "setup y", "sync", "run y", "sync"]
    assert timings.total("x") == timings.total("y") == 1.0


def test_deadline_adds_rounds_until_the_clock_passes_it():
    clock = FakeClock()
    timings = interleave(sides_costing(clock, {"a": 1.0, "b": 1.0}), rounds=2, clock=clock, warmup=0,
                         deadline=7.0, max_rounds=50)
    assert timings.rounds == 4  # 2 s a round: rounds start at 0, 2, 4, 6
    clock = FakeClock()
    capped = interleave(sides_costing(clock, {"a": 1.0, "b": 1.0}), rounds=2, clock=clock, warmup=0,
                        deadline=1e9, max_rounds=5)
    assert capped.rounds == 5


def test_refuses_duplicate_names_and_no_units():
    with pytest.raises(ValueError, match="distinct names"):
        interleave([Side("a", lambda u: None), Side("a", lambda u: None)])
    with pytest.raises(ValueError, match="one unit"):
        interleave([Side("a", lambda u: None)], units=[])


def test_stopwatch_sums_blocks():
    clock = FakeClock()
    watch = Stopwatch(clock)
    for cost in (1.5, 2.5):
        with watch:
            clock.advance(cost)
        clock.advance(10.0)  # outside: not counted
    assert watch.seconds == 4.0


def test_table_and_json_line():
    clock = FakeClock()
    timings = interleave(sides_costing(clock, {"old": 2.0, "new": 1.0}), units=[0], rounds=3, clock=clock)
    table = render_table(timings, baseline="old")
    lines = table.splitlines()
    assert lines[0] == "3 round(s) x 1 unit(s), interleaved"
    assert lines[1].split() == ["side", "median", "s", "best", "s", "total", "s", "speed-up", "range"]
    assert lines[3].split() == ["old", "2.000", "2.000", "6.000", "1.000x", "1.000-1.000"]
    assert lines[4].split() == ["new", "1.000", "1.000", "3.000", "2.000x", "2.000-2.000"]
    line = json_line({"cpu": "fake", "n": np.int64(3), "ratio": np.float32(0.5), "per_round": np.ones(2),
                      **timings.summary("old")})
    assert "\n" not in line
    data = json.loads(line)
    assert data["n"] == 3 and data["ratio"] == 0.5 and data["per_round"] == [1.0, 1.0]
    assert data["rounds"] == 3 and data["units"] == 1
    assert data["sides"]["new"] == {"median_s": 1.0, "best_s": 1.0, "total_s": 3.0, "speedup": 2.0}
    with pytest.raises(TypeError, match="not JSON serialisable"):
        json_line({"x": object()})
