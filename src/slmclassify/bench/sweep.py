"""`slmclassify sweep`: throughput and padding over token budgets and row caps on the user's data.

Every setting runs the same items through the same loaded model, interleaved with the others
round after round (`timing.interleave`: the order rotates each round), so that drift of a shared
machine hits all settings alike; a setting's items/s is that of its median round. The best setting
can be saved as the user's default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .compare import peak_rss_mb, reset_peak_rss
from ..classifier import DEFAULT_MAX_TEXT_TOKENS, Classifier, EngineSettings
from ..errors import SlmClassifyError
from ..models.loading import LoadedModel
from ..models.precision import auto_line
from ..core.results import RunStats
from ..core.task import Task
from ..timing import Side, interleave

ROUNDS = 2
"""Runs of every setting: two, so that each setting runs once early and once late in the sweep."""


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
    model (`load_model`; with `--precision auto`, decided on `task`)."""
    clf = Classifier(task, model=loaded, settings=EngineSettings(max_text_tokens=max_text_tokens))
    if line := auto_line(clf.loaded):
        log(line)

    # the cached choices this sweep is compared with (provisional ones say so)
    log(f"engine: {clf.engine_line()}")
    encoded = clf.encode(texts)
    clf.score(clf.encode(texts[: min(8, len(texts))]))  # warm-up: first calls allocate
    variants = {(budget, rows): clf.with_settings(EngineSettings(token_budget=budget, max_rows=rows,
                                                                 max_text_tokens=max_text_tokens))
                for rows in row_caps for budget in budgets}

    def score(variant: Classifier) -> tuple[float, int, float]:
        stats = variant.score(encoded).stats
        return stats.padding_share, stats.batches, peak_rss_mb()

    timings = interleave([Side(f"{budget} {rows}", lambda _, v=variant: score(v), reset_peak_rss)
                          for (budget, rows), variant in variants.items()], rounds=rounds, warmup=0)
    points = []
    for budget, rows in variants:
        name = f"{budget} {rows}"
        padding, batches, _ = timings.last(name)[0]
        point = SweepPoint(budget, rows, len(texts) / timings.median(name), padding, batches,
                           max(value[0][2] for value in timings.values[name]))
        points.append(point)
        log(f"  budget {budget:>6}, rows {rows:>4}: {point.items_per_s:7.2f} items/s, "
            f"padding {100 * point.padding:5.1f}%, {point.batches} batches, peak RSS {point.peak_rss_mb:.0f} MB")
    return points


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
                     log=print, rounds: int = ROUNDS) -> list[WindowPoint]:
    """Stream `texts` through `classify_iter` `rounds` times per window size, the sizes interleaved
    (rows sorted and batched per window): a small window holds less and pads more; duplicates are
    found within a window only."""
    clf = Classifier(task, model=loaded, settings=settings)
    clf.score(clf.encode(texts[: min(8, len(texts))]))  # warm-up
    windows = list(dict.fromkeys(windows))  # each size once

    def stream(variant: Classifier) -> tuple[float, int, float]:
        stats = RunStats.total(scored.stats for scored in variant.classify_windows(texts))
        return stats.padding_share, stats.reused, peak_rss_mb()

    variants = {window: clf.with_settings(dataclasses.replace(clf.settings, window=window)) for window in windows}
    timings = interleave([Side(str(window), lambda _, v=variant: stream(v), reset_peak_rss)
                          for window, variant in variants.items()], rounds=rounds, warmup=0)
    points = []
    for window in windows:
        padding, reused, _ = timings.last(str(window))[0]
        point = WindowPoint(window, len(texts) / timings.median(str(window)), padding, reused,
                            max(value[0][2] for value in timings.values[str(window)]))
        points.append(point)
        log(f"  window {window:>6}: {point.items_per_s:7.2f} items/s, padding {100 * point.padding:5.1f}%, "
            f"{point.reused} duplicates reused, peak RSS {point.peak_rss_mb:.0f} MB")
    return points
