"""Inter-annotator agreement on nominal labels: several people label the same items; how far do they
agree, and how far beyond what chance alone would give?

The input is a table `answers` [n_items, n_annotators] of label indices, -1 where an annotator did
not answer an item (`table` builds it from per-item {annotator: label} dicts). An item with fewer
than two answers has no pair of answers to compare: every statistic ignores it and the report
counts it (`unpaired_items`); every other count in the report is over the items with 2 or more.

Where the statistics weigh items differently (only when items have different numbers of answers):

    raw                 agreeing pairs / all pairs, pooled: an item weighs its n_i(n_i-1)/2 pairs
    fleiss_kappa        P-bar is the plain mean of P_i over items (each item weighs 1), as Fleiss 1971
    krippendorff_alpha  coincidences: an item weighs its n_i answers, each pairable value once
    per_label kappa     Fleiss' per-category kappa, pooled over pairs like `raw`

With the same number of answers on every item the weightings agree and the statistics are the
textbook ones. `confusion[j][k]` counts the unordered pairs of answers to one item labelled j and k,
each added both ways: the matrix is symmetric, its diagonal is twice the agreeing pairs per label,
and it sums to twice the number of pairs.

Every statistic is a function of sums over items of per-item quantities, so one bootstrap serves
them all: a resample of the items (with replacement) is a vector of integer weights, and the
statistic of the resample is the same function of the weighted sums (`_resampled_sums`). Counts
stay integers in float64, so "undefined" (expected agreement 1, a single label used) is an exact
zero denominator; it is reported as None, and the report holds no NaN: it is JSON as it is.

Layer: numpy and the standard library only (the labelling session imports it); the project's error
type is imported where an error is raised.
"""

from __future__ import annotations

from itertools import combinations
from typing import Callable

import numpy as np

LEVEL = 0.95
"""Coverage of the bootstrap percentile intervals."""
_CHUNK = 1 << 22
"""Resample weights held in memory at once (a bound for large tables)."""


def table(answers_by_item: list[dict[str, str]], labels: tuple[str, ...],
          annotators: tuple[str, ...]) -> np.ndarray:
    """The `answers` table [n_items, n_annotators] from one {annotator: label name} dict per item;
    an annotator absent from an item's dict did not answer it (-1)."""
    _check_names(labels, annotators)
    label_of = {label: j for j, label in enumerate(labels)}
    column_of = {name: a for a, name in enumerate(annotators)}
    out = np.full((len(answers_by_item), len(annotators)), -1, dtype=np.int64)
    for i, item in enumerate(answers_by_item):
        for name, label in item.items():
            if name not in column_of:
                raise _invalid(f"item {i}: unknown annotator {name!r}; annotators are {list(annotators)}")
            if label not in label_of:
                raise _invalid(f"item {i}: {name!r} answered {label!r}, not a label; labels are {list(labels)}")
            out[i, column_of[name]] = label_of[label]
    return out


def agreement(answers: np.ndarray, labels: tuple[str, ...], annotators: tuple[str, ...], *,
              bootstrap: int = 1000, seed: int = 0) -> dict:
    """The agreement report, JSON-able: `items`, `answers`, `annotators`, `labels`, `unpaired_items`,
    `bootstrap` (resamples, seed, level); `overall` {raw, fleiss_kappa, krippendorff_alpha}, each
    {value, low, high, resamples used}; `cohen_kappa` [{a, b, items, value, low, high, resamples}]
    for each pair of annotators sharing 2 items or more; `per_label` {label: {specific_agreement,
    kappa}}; `per_annotator` {name: {answers, agreement, kappa}}; `confusion` [L][L]. Intervals: 95%
    percentile, over `bootstrap` resamples of the items from a Generator seeded with `seed`."""
    answers = _checked(answers, labels, annotators, bootstrap)
    n_labels, n_annotators = len(labels), len(annotators)
    onehot = answers[:, :, None] == np.arange(n_labels)  # [n_items, A, L]: False where not answered
    pairable = onehot.sum((1, 2)) >= 2
    answers, onehot = answers[pairable], onehot[pairable]
    counts = onehot.sum(1)  # [N, L]: answers per label on each pairable item
    rng = np.random.default_rng(seed)

    # [N, A*L] -> [A, A, L, L]: pairs[a, b, x, y] is the items on which a answered x and b answered
    # y; pairs[a, a] is a's own answers (on its diagonal).
    onehot = onehot.reshape(len(answers), n_annotators * n_labels).astype(float)
    pairs = (onehot.T @ onehot).reshape(n_annotators, n_labels, n_annotators, n_labels).transpose(0, 2, 1, 3)
    own = pairs[np.arange(n_annotators), np.arange(n_annotators)]  # [A, L, L]
    with_others = pairs.sum(1) - own  # [A, L, L]: a's label x against each other's label y, pooled

    overall = _estimates(_item_features(counts), _overall, rng, bootstrap)
    cohen = []
    for a, b in combinations(range(n_annotators), 2):
        both = (answers[:, a] >= 0) & (answers[:, b] >= 0)
        if both.sum() < 2:
            continue
        cells = answers[both, a] * n_labels + answers[both, b]
        features = (cells[:, None] == np.arange(n_labels * n_labels)).astype(float)  # [m, L*L]
        kappa = _estimates(features, lambda sums: {"kappa": _cohen(sums.reshape(-1, n_labels, n_labels))},
                           rng, bootstrap)["kappa"]
        cohen.append({"a": annotators[a], "b": annotators[b], "items": int(both.sum()), **kappa})

    return {
        "items": len(answers),
        "answers": int(counts.sum()),
        "annotators": list(annotators),
        "labels": list(labels),
        "unpaired_items": int((~pairable).sum()),
        "bootstrap": {"resamples": bootstrap, "seed": seed, "level": LEVEL},
        "overall": overall,
        "cohen_kappa": cohen,
        "per_label": _per_label(counts, labels),
        "per_annotator": {
            name: {"answers": int((answers[:, a] >= 0).sum()),
                   "agreement": _number(_ratio(np.trace(with_others[a]), with_others[a].sum())),
                   "kappa": _number(_cohen(with_others[a][None])[0])}
            for a, name in enumerate(annotators)},
        "confusion": with_others.sum(0).astype(int).tolist(),
    }


def lines(report: dict) -> list[str]:
    """The report as short lines for a terminal: overall, pairs of annotators, labels, annotators."""
    boot = report["bootstrap"]
    head = (f"{report['items']} items with 2 or more answers ({report['answers']} answers), "
            f"{len(report['annotators'])} annotators, {len(report['labels'])} labels")
    if report["unpaired_items"]:
        head += f"; {_plural(report['unpaired_items'], 'item')} with fewer than 2 answers left out"
    out = [head, f"overall ({LEVEL:.0%} intervals from {boot['resamples']} bootstrap resamples of the items):"]
    overall = report["overall"]
    meanings = {"raw": ("raw agreement", lambda v: f"{v:.0%} of answer pairs agree"),
                "fleiss_kappa": ("Fleiss' kappa", lambda v: f"{_landis_koch(v)} (Landis-Koch)"),
                "krippendorff_alpha": ("Krippendorff's alpha", _krippendorff_words)}
    for key, (name, meaning) in meanings.items():
        est = overall[key]
        words = "undefined (a single label used)" if est["value"] is None else meaning(est["value"])
        out.append(f"  {name:<21}{_estimate_text(est)}  {words}{_skipped(est, boot['resamples'])}")

    out.append("pairs of annotators (Cohen's kappa):" if report["cohen_kappa"]
               else "pairs of annotators: no two annotators share 2 items")
    width = max((len(p["a"]) + len(p["b"]) for p in report["cohen_kappa"]), default=0) + 3
    for p in report["cohen_kappa"]:
        words = "undefined (one label only)" if p["value"] is None else _landis_koch(p["value"])
        out.append(f"  {p['a'] + ' - ' + p['b']:<{width}} {p['items']:>5} items  "
                   f"{_estimate_text(p)}  {words}{_skipped(p, boot['resamples'])}")

    out.append("per label (specific agreement: agreeing pairs / pairs with the label; kappa vs the rest):")
    width = max(map(len, report["labels"]), default=0)
    for label, stats in report["per_label"].items():
        out.append(f"  {label:<{width}}  specific {_text(stats['specific_agreement'])}  kappa {_text(stats['kappa'])}")

    out.append("per annotator (agreement and Cohen's kappa with the others, their pairs pooled):")
    width = max(map(len, report["annotators"]), default=0)
    for name, stats in report["per_annotator"].items():
        out.append(f"  {name:<{width}} {stats['answers']:>5} answers  agreement {_text(stats['agreement'])}"
                   f"  kappa {_text(stats['kappa'])}")
    return out


def _item_features(counts: np.ndarray) -> np.ndarray:
    """Per-item quantities the overall statistics sum: [N, 5 + L] from counts [N, L] (n_i >= 2):
    1, agreeing ordered pairs, ordered pairs, P_i, coincidences on the diagonal, then the counts."""
    n = counts.sum(1)
    agree = (counts * (counts - 1)).sum(1)
    pairs = n * (n - 1)
    return np.column_stack([np.ones(len(counts)), agree, pairs, agree / pairs, agree / (n - 1), counts]).astype(float)


def _overall(sums: np.ndarray) -> dict[str, np.ndarray]:
    """raw, fleiss_kappa and krippendorff_alpha [R] from summed `_item_features` [R, 5 + L]; NaN
    where undefined."""
    items, agree, pairs, p_sum, coincide = sums[:, :5].T
    total = sums[:, 5:].sum(1)  # answers
    squares = (sums[:, 5:] ** 2).sum(1)  # sum over labels of (answers with the label)^2
    same = squares - total  # sum_c n_c (n_c - 1)
    return {
        "raw": _ratio(agree, pairs),
        # (P-bar - P_e) / (1 - P_e) times T^2, with P_e = sum_j c_j^2 / T^2: the denominator exact
        "fleiss_kappa": _ratio(_ratio(p_sum, items) * total**2 - squares, total**2 - squares),
        # 1 - D_o / D_e on the coincidence matrix o, with n_c = sum_k o_ck and n = sum_c n_c, as
        # ((n-1) sum_c o_cc - sum_c n_c(n_c-1)) / (n(n-1) - sum_c n_c(n_c-1))
        "krippendorff_alpha": _ratio((total - 1) * coincide - same, total * (total - 1) - same),
    }


def _cohen(confusion: np.ndarray) -> np.ndarray:
    """Cohen's kappa [R] of confusion matrices [R, L, L] (one annotator's labels by rows, the other's
    by columns): (m * agreeing - chance) / (m^2 - chance), NaN where chance agreement is 1."""
    m = confusion.sum((1, 2))
    agreeing = np.trace(confusion, axis1=1, axis2=2)
    chance = (confusion.sum(2) * confusion.sum(1)).sum(1)  # m^2 * expected agreement
    return _ratio(m * agreeing - chance, m * m - chance)


def _per_label(counts: np.ndarray, labels: tuple[str, ...]) -> dict:
    """Specific agreement and Fleiss' per-category kappa of each label, from counts [N, L]."""
    n = counts.sum(1, keepdims=True)
    total, with_label = counts.sum(), counts.sum(0)
    specific = _ratio((counts * (counts - 1)).sum(0), (counts * (n - 1)).sum(0))
    # 1 - sum_i n_ij (n_i - n_ij) / (sum_i n_i(n_i - 1) * p_j (1 - p_j)), with p_j (1 - p_j) = c_j (T - c_j) / T^2
    kappa = 1 - _ratio((counts * (n - counts)).sum(0) * float(total) ** 2,
                       (n * (n - 1)).sum() * with_label * (total - with_label))
    return {label: {"specific_agreement": _number(specific[j]), "kappa": _number(kappa[j])}
            for j, label in enumerate(labels)}


def _estimates(features: np.ndarray, statistics: Callable[[np.ndarray], dict[str, np.ndarray]],
               rng: np.random.Generator, bootstrap: int) -> dict[str, dict]:
    """Each statistic of the items (rows of `features` [n, K], summed) with its percentile interval
    over `bootstrap` resamples of the rows; the resamples where it is undefined are skipped."""
    values = statistics(features.sum(0, keepdims=True))
    resampled = statistics(_resampled_sums(features, rng, bootstrap))
    out = {}
    for name, value in values.items():
        usable = resampled[name][np.isfinite(resampled[name])]
        low, high = np.percentile(usable, [50 * (1 - LEVEL), 50 * (1 + LEVEL)]) if len(usable) else (None, None)
        out[name] = {"value": _number(value[0]), "low": _number(low), "high": _number(high),
                     "resamples": len(usable)}
    return out


def _resampled_sums(features: np.ndarray, rng: np.random.Generator, bootstrap: int) -> np.ndarray:
    """Column sums of `features` [n, K] over `bootstrap` resamples of its rows with replacement:
    [bootstrap, K] (none when there are no rows)."""
    n, k = features.shape
    if n == 0:
        return np.zeros((0, k))
    out = np.empty((bootstrap, k))
    step = max(1, _CHUNK // n)
    for start in range(0, bootstrap, step):
        rows = min(step, bootstrap - start)
        drawn = rng.integers(0, n, size=(rows, n)) + n * np.arange(rows)[:, None]  # [rows, n] flat indices
        weights = np.bincount(drawn.ravel(), minlength=rows * n).reshape(rows, n)  # times each item was drawn
        out[start:start + rows] = weights @ features
    return out


def _ratio(num, den):
    """num / den, NaN where den is 0 (no warning)."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den != 0, num / np.where(den != 0, den, 1), np.nan)


def _number(x) -> float | None:
    """A plain float for the report, None for an undefined (NaN or missing) value."""
    return None if x is None or not np.isfinite(x) else float(x)


def _landis_koch(kappa: float) -> str:
    """Landis and Koch's (1977) words for a kappa."""
    if kappa < 0:
        return "poor (below chance)"
    for bound, words in ((0.20, "slight"), (0.40, "fair"), (0.60, "moderate"), (0.80, "substantial")):
        if kappa <= bound:
            return words
    return "almost perfect"


def _krippendorff_words(alpha: float) -> str:
    """Krippendorff's (2004) reading of an alpha."""
    if alpha >= 0.800:
        return "reliable (alpha >= 0.800)"
    if alpha >= 0.667:
        return "tentative conclusions only (0.667 <= alpha < 0.800)"
    return "unreliable (alpha < 0.667)"


def _text(x: float | None) -> str:
    return "  -  " if x is None else f"{x:5.2f}"


def _estimate_text(est: dict) -> str:
    """'0.74 [0.55, 1.00]', or the value alone without an interval."""
    if est["value"] is None:
        return f"{_text(None):<19}"
    interval = "" if est["low"] is None else f"[{est['low']:5.2f}, {est['high']:5.2f}]"
    return f"{est['value']:5.2f} {interval:<14}"


def _skipped(est: dict, requested: int) -> str:
    """How many resamples the interval used, when some were skipped as undefined."""
    return "" if est["resamples"] in (0, requested) else f" ({est['resamples']} of {requested} resamples usable)"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _check_names(labels: tuple[str, ...], annotators: tuple[str, ...]) -> None:
    if not labels:
        raise _invalid("pass at least one label")
    for kind, names in (("label", labels), ("annotator", annotators)):
        if len(set(names)) != len(names):
            raise _invalid(f"each {kind} must appear once; got {list(names)}")


def _checked(answers: np.ndarray, labels: tuple[str, ...], annotators: tuple[str, ...], bootstrap: int) -> np.ndarray:
    """`answers` as an int64 table, after checking it against the labels and annotators."""
    _check_names(labels, annotators)
    answers = np.asarray(answers)
    if answers.ndim != 2 or answers.shape[1] != len(annotators):
        raise _invalid(f"answers must be a table [items, {len(annotators)} annotators]; got shape {answers.shape}")
    if answers.dtype.kind not in "iu":
        raise _invalid(f"answers must hold label indices (integers, -1 for no answer); got {answers.dtype}")
    if answers.size and (answers.min() < -1 or answers.max() >= len(labels)):
        raise _invalid(f"answers must be label indices 0..{len(labels) - 1} or -1 (no answer); "
                       f"got values from {answers.min()} to {answers.max()}")
    if isinstance(bootstrap, bool) or not isinstance(bootstrap, int) or bootstrap < 0:
        raise _invalid(f"bootstrap must be a number of resamples (0 or more); got {bootstrap!r}")
    return answers.astype(np.int64)


def _invalid(message: str) -> Exception:
    from ..errors import InputError  # here, so the module's own imports stay numpy and the standard library

    return InputError(message)
