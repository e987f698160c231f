"""The batch schedule measured where it runs (`models/schedule.py`): measured on first use, cached
beside the GEMM choice, given values win, provisional measurements (a busy machine, rounds that
disagree) are measured again, measurements are serialised across processes, a resumed run keeps
the schedule it started with, and the suite keeps its choices out of the user's cache."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from slmclassify.classifier import engine_line
from slmclassify import Classifier, EngineSettings, Task
from slmclassify.backends import choice
from slmclassify.backends.choice import cpu_seconds, others_share
from slmclassify.models import schedule
from slmclassify.models.prepare import load_model

from helpers import random_texts

TASK = Task(labels=("billing", "technical", "account"), user_template="Ticket: {text}")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(choice, "machine_load", lambda: 0.0)
    monkeypatch.setattr(choice, "others_share", lambda before: 0.0)
    # rounds of the tiny models jitter on a shared machine (the suite runs beside other work): only
    # the tests of unsteady rounds below (which plant a spread) mark a measurement provisional by it
    monkeypatch.setattr(choice, "UNSTEADY", 1e9)


def _stored(tmp_path) -> dict:
    return json.loads((tmp_path / "cache" / "slmclassify" / choice.CACHE_FILE).read_text())


def test_the_schedule_is_measured_once_cached_and_given_values_win(tmp_path, llama_dir, one_torch_thread):

    loaded = load_model(str(llama_dir), device="cpu")
    clf = Classifier(TASK, model=loaded)
    measured = clf.schedule
    assert measured["cached"] is False and measured["took"] == ("token_budget", "max_rows")
    assert clf.settings.token_budget == measured["token_budget"] in schedule.BUDGETS["cpu"]
    assert clf.settings.max_rows == measured["max_rows"]
    assert set(measured["rates"]) == {str(b) for b in schedule.BUDGETS["cpu"]}
    key = schedule.schedule_key(loaded)
    assert _stored(tmp_path)[key]["token_budget"] == measured["token_budget"]
    line = engine_line(clf)
    assert f"schedule: token budget {measured['token_budget']}, max rows {measured['max_rows']} (measured here" in line
    assert "measured now" in line

    again = Classifier(TASK, model=loaded)
    assert again.schedule["cached"] is True and again.settings == clf.settings
    # a planted schedule is what the next classifier runs
    stored = _stored(tmp_path)
    stored[key].update(token_budget=3000, max_rows=7)
    (tmp_path / "cache" / "slmclassify" / choice.CACHE_FILE).write_text(json.dumps(stored))
    planted = Classifier(TASK, model=loaded)
    assert (planted.settings.token_budget, planted.settings.max_rows) == (3000, 7)
    assert engine_line(planted).endswith("; cached)")

    one = Classifier(TASK, model=loaded, settings=EngineSettings(token_budget=512))
    assert (one.settings.token_budget, one.settings.max_rows) == (512, 7) and one.schedule["took"] == ("max_rows",)
    assert "token budget given; measured here" in engine_line(one)
    both = Classifier(TASK, model=loaded, settings=EngineSettings(token_budget=512, max_rows=16))
    assert both.schedule is None and engine_line(both).endswith("schedule: token budget 512, max rows 16 (given)")
    # the scores do not depend on where the schedule came from, beyond float32 sums
    encoded = clf.encode(random_texts(12, seed=2))
    assert np.abs(both.score(encoded).scores - clf.score(encoded).scores).max() < 1e-4


def test_a_provisional_schedule_is_measured_again_at_a_later_start(tmp_path, llama_dir, monkeypatch):
    loaded = load_model(str(llama_dir), device="cpu")
    monkeypatch.setattr(choice, "machine_load", lambda: 3.0)  # busy: 3 runnable tasks per core
    busy = Classifier(TASK, model=loaded).schedule
    assert busy["cached"] is False and busy["provisional"] is True
    assert "machine busy, load 3.0 per core" in choice.provisional_reason(busy)
    assert Classifier(TASK, model=loaded).schedule["cached"] is True  # still busy: used as it is
    monkeypatch.setattr(choice, "machine_load", lambda: 0.2)
    assert Classifier(TASK, model=loaded).schedule["cached"] is True  # quiet, but this process measured it
    monkeypatch.setattr(choice, "_MEASURED_HERE", set())  # a later start
    quiet = Classifier(TASK, model=loaded).schedule
    assert quiet["cached"] is False and "provisional" not in quiet
    assert Classifier(TASK, model=loaded).schedule["cached"] is True

    # rounds that disagree (another process computing meanwhile) mark it provisional too
    monkeypatch.setattr(choice, "UNSTEADY", 0.25)
    real = schedule.measure
    monkeypatch.setattr(schedule, "measure", lambda *a: {**real(*a), "spread": 0.9})
    stored = _stored(tmp_path)
    stored.pop(schedule.schedule_key(loaded))
    (tmp_path / "cache" / "slmclassify" / choice.CACHE_FILE).write_text(json.dumps(stored))
    unsteady = Classifier(TASK, model=loaded).schedule
    assert unsteady["provisional"] is True and "repeated rounds differed by 90%" in choice.provisional_reason(unsteady)
    monkeypatch.setattr(schedule, "measure", lambda *a: {**real(*a), "spread": 0.0})
    monkeypatch.setattr(choice, "_MEASURED_HERE", set())  # a later start
    assert Classifier(TASK, model=loaded).schedule["cached"] is False  # quiet machine: measured again


def test_other_work_during_a_measurement_makes_it_provisional(tmp_path, llama_dir, monkeypatch):
    """The load average lags and counts the measuring process itself (a whole `make test` beside a
    2-core run read 1.03 per core): the CPU time other processes used while it measured counts."""
    loaded = load_model(str(llama_dir), device="cpu")
    monkeypatch.setattr(choice, "others_share", lambda before: 0.6)
    busy = Classifier(TASK, model=loaded).schedule
    assert busy["provisional"] is True and busy["others_share"] == 0.6
    assert "other work used 60% of the cores meanwhile" in choice.provisional_reason(busy)
    monkeypatch.setattr(choice, "others_share", lambda before: 0.05)
    monkeypatch.setattr(choice, "_MEASURED_HERE", set())  # a later start
    quiet = Classifier(TASK, model=loaded).schedule
    assert quiet["cached"] is False and "provisional" not in quiet


@pytest.mark.skipif(cpu_seconds() is None, reason="no /proc/stat here (not Linux): nothing to measure other work by")
def test_others_share_sees_another_process_computing():
    """A process spinning on one core is other work while it runs; this process's own computing is
    not (nor are children it has waited for: a compiler it ran counts as its own)."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 2.5\nwhile time.time() < end: pass"])
    time.sleep(0.5)  # past the child's start
    before = cpu_seconds()
    time.sleep(1.5)
    spun = others_share(before)  # measured while it still spins, before it is waited for
    child.wait()
    assert spun is not None and spun >= 0.5 / (os.cpu_count() or 1)
    before = cpu_seconds()
    end = time.monotonic() + 1.0
    while time.monotonic() < end:  # this process busy: not counted as other work
        pass
    assert others_share(before) < spun
    before = cpu_seconds()  # a child it waits for (a C compiler for its kernels) is its own work
    subprocess.run([sys.executable, "-c", "import time\nend = time.time() + 1.0\nwhile time.time() < end: pass"])
    assert others_share(before) < spun


def test_one_settings_slow_first_round_is_not_a_busy_machine(tmp_path, llama_dir, monkeypatch):
    """A big budget's first rounds run slow on a quiet machine (the heap settles at its size): the
    probe's spread is the median over its settings, so one setting's slow rounds do not mark the
    schedule provisional, while rounds that disagree in most settings (other work) do."""
    from slmclassify.timing import Timings

    monkeypatch.setattr(choice, "UNSTEADY", 0.25)
    loaded = load_model(str(llama_dir), device="cpu")
    real = schedule.interleave

    def planted(slow: int):
        def timed(sides, *a, **k):
            t = real(sides, *a, **k)
            seconds = {}
            for i, name in enumerate(t.names):
                s = np.full_like(t.seconds[name], 0.1)  # steady rounds long enough to count (STEADY_ROUND_S)
                if i < slow:
                    s[:-1] *= 3.0  # all but the last round slow: its second-best round 3x its best
                seconds[name] = s
            return Timings(t.names, seconds, t.values, t.calls)
        return timed

    monkeypatch.setattr(schedule, "interleave", planted(1))
    one = schedule.measure(loaded.engine, loaded.model.config.vocab_size, loaded.backend.device)
    assert one["spread"] == 0.0
    monkeypatch.setattr(schedule, "interleave", planted(99))
    busy = schedule.measure(loaded.engine, loaded.model.config.vocab_size, loaded.backend.device)
    assert busy["spread"] == pytest.approx(2.0)
    monkeypatch.setattr(schedule, "measure", lambda *a: busy)
    assert Classifier(TASK, model=loaded).schedule["provisional"] is True


def test_gemm_rates_whose_rounds_disagree_are_provisional(tmp_path, llama_dir, monkeypatch):
    from slmclassify.backends import gemm

    monkeypatch.setattr(choice, "UNSTEADY", 0.25)
    real = gemm.time_kernels
    monkeypatch.setattr(gemm, "time_kernels", lambda *a, **k: (real(*a, **k)[0], 0.8))
    rates = load_model(str(llama_dir), device="cpu").gemm_rates
    assert rates["provisional"] is True and rates["spread"] == 0.8
    monkeypatch.setattr(gemm, "time_kernels", lambda *a, **k: (real(*a, **k)[0], 0.0))
    monkeypatch.setattr(choice, "_MEASURED_HERE", set())  # a later start
    again = load_model(str(llama_dir), device="cpu").gemm_rates
    assert again["cached"] is False and "provisional" not in again


def test_measurements_are_serialised_across_processes(tmp_path):
    """While one holder has the cache folder's measurement lock, another waits for it (the second
    process then reads what the first measured instead of timing alongside it)."""
    folder = tmp_path / "c"
    events = []

    def hold():
        with choice.measuring(folder):
            events.append(("a in", time.monotonic()))
            time.sleep(0.5)
            events.append(("a out", time.monotonic()))

    first = threading.Thread(target=hold)
    first.start()
    while not events:
        time.sleep(0.01)
    with choice.measuring(folder):
        events.append(("b in", time.monotonic()))
    first.join()
    assert [name for name, _ in events] == ["a in", "a out", "b in"]
    with choice.measuring(folder, timeout_s=0.2):  # free again: no wait
        pass


def test_a_resumed_run_keeps_the_schedule_it_started_with_only_where_batches_change_bits(llama_dir, one_torch_thread):
    """A batch-invariant backend scores an item with the same bits in any batch: a resumed run takes the
    schedule measured now. Where the backend is not (a vendor float32 kernel asked for),
    the schedule the run recorded is kept, so that its output is byte-identical."""
    import dataclasses

    from slmclassify.jobs.classify import _as_recorded
    from slmclassify.models.engines import with_backend

    loaded = load_model(str(llama_dir), device="cpu")
    assert loaded.engine.batch_invariant, loaded.engine.batch_variance()
    recorded = {"schedule": {"token_budget": 777, "max_rows": 9}}
    clf = Classifier(TASK, model=loaded)
    assert _as_recorded(recorded, clf, TASK, clf.settings) is clf
    varying = with_backend(loaded, dataclasses.replace(loaded.backend, gemm="mm"))
    clf = Classifier(TASK, model=varying)
    assert not clf.engine.batch_invariant
    kept = _as_recorded(recorded, clf, TASK, clf.settings)
    assert (kept.settings.token_budget, kept.settings.max_rows) == (777, 9)
    assert _as_recorded({"schedule": {"token_budget": clf.settings.token_budget,
                                      "max_rows": clf.settings.max_rows}}, clf, TASK, clf.settings) is clf
    assert _as_recorded(None, clf, TASK, clf.settings) is clf


def test_the_suite_keeps_its_choices_out_of_the_users_cache():
    import os

    from slmclassify.cache import cache_root

    assert os.environ["XDG_CACHE_HOME"] != str(Path.home() / ".cache")
    assert Path.home() / ".cache" not in cache_root().parents


def test_a_spread_counts_only_on_rounds_long_enough_to_tell():
    from slmclassify.timing import Timings

    t = Timings(("a",), {"a": np.array([[0.002], [0.004]])}, {"a": [[None], [None]]})
    assert t.spread("a") == pytest.approx(1.0) and t.spread("a", shortest=0.005) == 0.0


def test_the_probe_times_a_workload_of_mixed_lengths_planned_as_real_items_are():
    """Phase 1's items span short and long texts (so each budget's padding and partly filled last
    batch are timed), are the same at every start, and fill more than the largest budget."""
    from slmclassify.core.batching import plan_batches

    lengths = schedule.probe_lengths(schedule.PROBE_TOKENS["cpu"])
    assert lengths == schedule.probe_lengths(schedule.PROBE_TOKENS["cpu"])
    median, _, low, high = schedule.PROBE_LENGTHS
    assert sum(lengths) >= schedule.PROBE_TOKENS["cpu"] > max(schedule.BUDGETS["cpu"])
    assert low <= min(lengths) < median < max(lengths) <= high
    for budget in schedule.BUDGETS["cpu"]:
        batches = plan_batches(np.array(lengths), budget, max(schedule.ROW_CAPS))
        assert len(batches) >= 2 and sorted(np.concatenate(batches)) == list(range(len(lengths)))


def test_a_foreign_or_edited_cache_entry_is_measured_again_not_a_traceback(tmp_path, llama_dir, one_torch_thread):
    """Before: the GEMM and schedule entries swapped between their keys (the issue's sweep rotated them
    between models' keys) gave `KeyError: 'token_budget'`. Now an entry without its fields, of the wrong
    types, not an object, or a cache file that is not a JSON object, is a miss: measured again and
    written over."""
    loaded = load_model(str(llama_dir), device="cpu")
    clf = Classifier(TASK, model=loaded)
    assert clf.schedule["cached"] is False
    stored = _stored(tmp_path)
    import torch

    gemm_key = f"{choice.machine_key(torch.device('cpu'))}|{choice.model_key(loaded.model.config)}"
    path = tmp_path / "cache" / "slmclassify" / choice.CACHE_FILE
    schedule_key = schedule.schedule_key(loaded)
    assert {gemm_key, schedule_key} <= set(stored)
    plantings = [{gemm_key: stored[schedule_key], schedule_key: stored[gemm_key]},  # swapped
                 {gemm_key: "x", schedule_key: [1, 2]},
                 {gemm_key: {**stored[gemm_key], "gemm": "no-such-kernel"},
                  schedule_key: {**stored[schedule_key], "token_budget": "1024", "max_rows": True}},
                 [stored]]
    for planted in plantings:
        path.write_text(json.dumps(planted))
        again = Classifier(TASK, model=load_model(str(llama_dir), device="cpu"))
        assert again.schedule["cached"] is False and again.loaded.gemm_rates["cached"] is False, planted
        assert again.loaded.backend.gemm == loaded.backend.gemm
        assert again.settings.token_budget in schedule.BUDGETS["cpu"] and isinstance(again.settings.max_rows, int)
        rewritten = _stored(tmp_path)
        assert rewritten[schedule_key]["token_budget"] == again.settings.token_budget
        assert set(choice.GEMM_FIELDS) <= set(rewritten[gemm_key])
