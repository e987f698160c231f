"""`slmclassify sweep`: throughput and padding over token budgets and row caps on the user's data.

Every setting runs the same items through the same loaded model, interleaved with the others
round after round (`timing.interleave`: the order rotates each round), so that drift of a shared
machine hits all settings alike; a setting's items/s is that of its median round. The best setting
can be saved as the user's default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from .compare import peak_rss_mb, reset_peak_rss
from ..classifier import DEFAULT_MAX_TEXT_TOKENS, Classifier, EngineSettings, engine_line
from ..errors import SlmClassifyError
from ..models.loading import LoadedModel
from ..models.precision import auto_line
from ..core.results import RunStats
from ..core.task import Task
from ..timing import Side, interleave

ROUNDS = 2
"""Runs of every setting: two, so that each setting runs once early and once late in the sweep."""


@dataclass(frozen=True)
class _Run:
    """One variant's runs in `_interleaved`."""

    seconds: float
    """Of its median round."""
    figures: tuple
    """What its last run returned (its figures do not vary between runs, unlike its time)."""
    peak_rss_mb: float
    """The highest peak resident memory of its runs."""


def _interleaved(variants: dict, run: Callable[[Classifier], tuple], rounds: int) -> dict:
    """{key: `_Run`}: `run(variant)` for every variant, `rounds` times, interleaved round after round
    (the order rotates each round), the peak RSS reset before each run and read inside its timing."""
    def measured(variant: Classifier) -> tuple[tuple, float]:
        return run(variant), peak_rss_mb()

    names = {key: str(key) for key in variants}
    timings = interleave([Side(names[key], lambda _, v=variant: measured(v), reset_peak_rss)
                          for key, variant in variants.items()], rounds=rounds, warmup=0)
    return {key: _Run(timings.median(name), timings.last(name)[0][0],
                      max(value[0][1] for value in timings.values[name]))
            for key, name in names.items()}


@dataclass(frozen=True)
class SweepPoint:
    token_budget: int
    max_rows: int
    items_per_s: float
    padding: float
    batches: int
    peak_rss_mb: float
    """Peak resident memory of the process during this setting's run."""


def run_sweep(loaded: LoadedModel, task: Task, texts: list[str], budgets, row_caps,
              max_text_tokens: int | None = DEFAULT_MAX_TEXT_TOKENS, log=print,
              rounds: int = ROUNDS) -> list[SweepPoint]:
    """Score `texts` `rounds` times per (budget, row cap), the settings interleaved, items cut at
    `max_text_tokens` (None: no cap); a first run of 8 items warms the model up. `loaded`: a prepared
    model (`load_model`; with `--precision auto`, decided on `task`). `log` gets the precision and
    engine lines; the figures are returned, for the caller's table."""
    clf = Classifier(task, model=loaded, settings=EngineSettings(max_text_tokens=max_text_tokens))
    if line := auto_line(clf.loaded):
        log(line)

    # the cached choices this sweep is compared with (provisional ones say so)
    log(f"engine: {engine_line(clf)}")
    encoded = clf.encode(texts)
    clf.score(clf.encode(texts[: min(8, len(texts))]))  # warm-up: first calls allocate
    variants = {(budget, rows): clf.variant(EngineSettings(token_budget=budget, max_rows=rows,
                                                                 max_text_tokens=max_text_tokens))
                for rows in row_caps for budget in budgets}

    def score(variant: Classifier) -> tuple[float, int]:
        stats = variant.score(encoded).stats
        return stats.padding_share, stats.batches

    return [SweepPoint(budget, rows, len(texts) / run.seconds, *run.figures, run.peak_rss_mb)
            for (budget, rows), run in _interleaved(variants, score, rounds).items()]


def best(points: list[SweepPoint]) -> SweepPoint:
    return max(points, key=lambda p: p.items_per_s)


def plot(points: list[SweepPoint], path: str) -> None:
    """Items/s and padding share against the token budget, one line per row cap."""
    try:
        import matplotlib
    except ImportError:
        raise SlmClassifyError(f"plot not written: matplotlib is not installed (pip install 'slmclassify[plots]'); "
                               "the measurements are above") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for rows in sorted({p.max_rows for p in points}):
        line = sorted((p for p in points if p.max_rows == rows), key=lambda p: p.token_budget)
        xs = [p.token_budget for p in line]
        ax1.plot(xs, [p.items_per_s for p in line], marker="o", label=f"max rows {rows}")
        ax2.plot(xs, [100 * p.padding for p in line], marker="o", label=f"max rows {rows}")
    top = best(points)
    ax1.scatter([top.token_budget], [top.items_per_s], s=120, facecolors="none", edgecolors="red", label="best")
    for ax, title in ((ax1, "throughput (items/s)"), (ax2, "padding (% of processed tokens)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("token budget (rows x padded length)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@dataclass(frozen=True)
class WindowPoint:
    window: int
    items_per_s: float
    padding: float
    reused: int
    """Rows that took the scores of an identical row of their window."""
    peak_rss_mb: float


def run_window_sweep(loaded: LoadedModel, task: Task, texts: list[str], windows, settings: EngineSettings | None = None,
                     rounds: int = ROUNDS) -> list[WindowPoint]:
    """Stream `texts` through `classify_iter` `rounds` times per window size, the sizes interleaved
    (rows sorted and batched per window): a small window holds less and pads more; duplicates are
    found within a window only."""
    clf = Classifier(task, model=loaded, settings=settings)
    clf.score(clf.encode(texts[: min(8, len(texts))]))  # warm-up
    windows = list(dict.fromkeys(windows))  # each size once

    def stream(variant: Classifier) -> tuple[float, int]:
        stats = RunStats.total(scored.stats for scored in variant.classify_windows(texts))
        return stats.padding_share, stats.reused

    variants = {window: clf.variant(dataclasses.replace(clf.settings, window=window)) for window in windows}
    return [WindowPoint(window, len(texts) / run.seconds, *run.figures, run.peak_rss_mb)
            for window, run in _interleaved(variants, stream, rounds).items()]
