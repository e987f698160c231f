"""`RunStats.total`, the one way a run's figures are summed from its parts (windows, chunks, Ray
actors): counts and seconds add up, the shared prefix is counted once."""

from __future__ import annotations

import dataclasses

from slmclassify.core.results import RunStats

SUMMED = ("items", "scored", "seconds", "real_tokens", "processed_tokens", "prefix_reused", "fallbacks", "batches",
          "reused")


def part(k: int, prefix: int = 12) -> RunStats:
    return RunStats(items=10 * k, scored=9 * k, seconds=0.5 * k, real_tokens=100 * k, processed_tokens=120 * k,
                    prefix_tokens=prefix, prefix_reused=prefix * 9 * k, fallbacks=k, batches=2 * k, reused=k - 1)


def test_total_sums_every_count_and_keeps_the_prefix_once():
    parts = [part(1), part(2), part(3)]
    total = RunStats.total(parts)
    for name in SUMMED:
        assert getattr(total, name) == sum(getattr(p, name) for p in parts), name
    assert total.prefix_tokens == 12  # one prefix per run, not 36
    assert {f.name for f in dataclasses.fields(RunStats)} == {*SUMMED, "prefix_tokens"}  # a new field is summed here


def test_total_of_nothing_is_empty_and_takes_a_generator():
    assert RunStats.total([]) == RunStats()
    assert RunStats.total(part(k) for k in (1, 2)) == RunStats.total([part(1), part(2)])


def test_a_part_that_ran_no_prefix_does_not_erase_it():
    """An empty window reports prefix_tokens 0; the run's prefix stays, whichever order the parts come in."""
    assert RunStats.total([part(1), part(1, prefix=0)]).prefix_tokens == 12
    assert RunStats.total([part(1, prefix=0), part(1)]).prefix_tokens == 12


def test_total_equals_adding_the_parts_in_turn():
    """`add` (a running total, e.g. a resumed classify run's) and `total` are the same sum."""
    running = RunStats(prefix_tokens=12)
    for k in (1, 2, 3):
        running.add(part(k))
    assert running == RunStats.total([part(1), part(2), part(3)])


def test_rates_of_the_total():
    total = RunStats.total([part(1), part(3)])
    assert total.items_per_s == 40 / 2.0
    assert total.padding_share == 1 - 400 / 480
