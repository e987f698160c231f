"""Which item a person labels next, and a line saying why: active learning in plain numpy.

Two phases:

    cold  (no head yet, or a label with fewer than `cold_per_label` answers, up to `cold_limit`
          answers): diversity over the hidden states. The scored pool is clustered (k-means on a
          seeded random projection of the standardised features); the next item comes from the
          cluster with the fewest answers for its size, and within it from the items the zero-shot
          scorer guesses as the label with the fewest answers, nearest the cluster's centre. So the
          person does not label ten near-duplicates, and every label gets its first examples early.
    warm  (a head): the head's uncertainty mixed with diversity: among the `candidates` items of
          smallest margin (top-1 minus top-2 probability; in a multi-label task the label whose
          P(yes) is nearest 0.5, |2p - 1|), the one from the cluster with the fewest answers for
          its size; and with probability `random_share` a uniform random item, so a share of the
          answers is an unbiased sample of the pool (an honest accuracy check).

In a multi-label task an answer is a set of labels (a tuple of label indices, maybe empty); a
label's count is the answers that include it.

A task of questions (`PoolView.questions`): the columns are every question's labels side by side
and an answer is the tuple of the columns it chose (a task of labels is its one question; each
question's readout says how unsure an item is of it and words the reason, `core/readout.py`). An
item is as uncertain as its LEAST sure question (the smallest of its questions' margins, each on the same 0..1 scale): one answer labels
every question of the item, so the pick goes to an item where some head learns most, rather than
where the heads are unsure on average (an item every head half knows teaches none of them much).
The cold phase prefers, within a cluster, items whose guess for some question is that question's
rarest label so far.

Invariants: a pick never returns a labelled, excluded or unscored row; `pick` is a pure function
of its arguments and the seed (its random draws are seeded by the seed and the number of answers
and exclusions, not by how often it was called), so a reload that asks again gets the same item;
it is vectorised over the pool (a pool of 20,000 items costs a few numpy passes per pick: the
clusters are kept and only newly scored rows are projected and assigned).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.readout import ONE_LABEL, of_flag

PROJECTION = 32
"""Width of the random projection the clusters are computed in."""
KMEANS_SAMPLE = 2000
"""At most this many scored rows fit the cluster centres (all rows are then assigned)."""
COLD_EXTRA = 3
"""Cold-start picks beyond `cold_per_label` x labels before the warm phase starts anyway."""
REFIT_GROWTH = 1.5
"""The centres are refitted when the scored pool has grown by this factor since the last fit."""


@dataclass(frozen=True)
class PoolView:
    """What the picker sees of the pool (row i is the i-th item of the session's sample)."""

    zero_shot: np.ndarray
    """[n, L] zero-shot probabilities (rows not scored yet are ignored)."""
    features: np.ndarray
    """[n, d] hidden-state features (rows not scored yet are ignored)."""
    scored: np.ndarray
    """[n] bool: rows scored so far (and not empty)."""
    head: np.ndarray | None = None
    """[n, L] the latest head's probabilities, columns as `zero_shot`, or None before the first fit."""
    labels: tuple[str, ...] = ()
    """Label names for the reasons (default: label 1, label 2, ...)."""
    priority: np.ndarray | None = None
    """[n] bool: rows offered before any other while some are left (a classify output's needs_review)."""
    multi_label: bool = False
    """Without `questions`: whether the columns are each label's P(yes) (an older caller's flag)."""
    questions: tuple = ()
    """What each item is asked: per question (its name, None for a task of labels; its columns; its
    readout, `core/readout.py`, or an older caller's multi-label flag; its labels). Empty: the one
    unnamed question over every column."""

    @property
    def asked(self) -> tuple:
        """`questions` with each question's readout (a task of labels: its one question)."""
        width = self.zero_shot.shape[1]
        asked = self.questions or ((None, slice(0, width), self.multi_label,
                                    self.labels or tuple(f"label {i + 1}" for i in range(width))),)
        return tuple((name, span, of_flag(how) if isinstance(how, bool) else how, labels)
                     for name, span, how, labels in asked)


@dataclass(frozen=True)
class Pick:
    """The next item and why it was picked."""

    row: int
    reason: str
    kind: str = ""
    """cold, uncertain, random, priority or last (the reason's category, for counting)."""
    detail: str = ""
    """The part of the reason that does not depend on the scores (a cold pick's cluster): `describe`
    completes it from the scores shown next to it."""


def label_counts(labelled: dict, n_labels: int) -> np.ndarray:
    """[L] answers per label: values are label indices, or (multi-label) tuples of them."""
    counts = np.zeros(n_labels, np.int64)
    for value in labelled.values():
        counts[list(value) if isinstance(value, tuple) else value] += 1
    return counts


def describe(kind: str, detail: str, probs: np.ndarray | None, labels: tuple[str, ...], counts: np.ndarray,
             asked: tuple = ()) -> str:
    """The reason line of a pick from the scores on screen now (`probs` [L], the head's once it
    exists): so the guess it names is the guess shown, after a refit too. `asked`: as
    `PoolView.asked` (empty: a task of labels with one answer each)."""
    if probs is None or np.isnan(probs).any():
        return detail
    if detail.startswith(("brought back", "chosen")):  # undo or the history: said as it is
        return detail
    asked = asked or ((None, slice(0, len(labels)), ONE_LABEL, labels),)
    if kind == "cold":  # the guess of the question where it is rarest, as the pick chose it
        tops = [(span.start + int(np.argmax(probs[span])), how) for _, span, how, _ in asked]
        top, how = min(tops, key=lambda t: counts[t[0]])
        return f"{detail}; {how.guess_named}, {labels[top]}, has {int(counts[top])} answers so far"
    if kind == "uncertain":
        name, span, how, own = asked[int(least_sure(probs[None, :], asked)[1][0])]
        return how.unsure(name, own, probs[span])
    return detail


def least_sure(probs: np.ndarray, asked: tuple) -> tuple[np.ndarray, np.ndarray]:
    """[m, C] probabilities → ([m] each item's smallest margin over its questions, [m] which question
    has it), each question's margin as its readout gives it (`asked`: as `PoolView.asked`)."""
    margin = np.stack([how.margin(probs[:, span]) for _, span, how, _ in asked], axis=1)  # [m, Q]
    return margin.min(axis=1), margin.argmin(axis=1)


class Clusters:
    """k-means clusters of the scored pool, updated as more rows are scored."""

    def __init__(self, k: int, seed: int):
        self.k, self.seed = k, seed
        self.projected: np.ndarray | None = None  # [n, PROJECTION], valid where `done`
        self.done: np.ndarray | None = None  # [n] bool
        self.assign: np.ndarray | None = None  # [n] cluster index, -1 where not done
        self.centres: np.ndarray | None = None  # [k', PROJECTION]
        self.fitted_on = 0
        self._mean = self._scale = self._matrix = None

    def update(self, features: np.ndarray, scored: np.ndarray) -> None:
        n = len(features)
        if self.done is None or len(self.done) != n:
            self.projected = np.zeros((n, PROJECTION), np.float32)
            self.done, self.assign = np.zeros(n, bool), np.full(n, -1, np.int64)
            self.centres, self.fitted_on = None, 0
        new = np.flatnonzero(scored & ~self.done)
        if not len(new):
            return
        if self._matrix is None:  # standardise on the first rows seen: LLM states have a few huge dimensions
            first = features[new].astype(np.float64)
            self._mean = first.mean(axis=0).astype(np.float32)
            scale = first.std(axis=0)
            self._scale = np.where(scale < 1e-6, 1.0, scale).astype(np.float32)
            rng = np.random.default_rng([self.seed, 7])
            self._matrix = (rng.standard_normal((features.shape[1], PROJECTION)) / np.sqrt(PROJECTION)).astype(np.float32)
        # float32: the session projects each newly scored slice under its lock, so this must be cheap
        self.projected[new] = ((features[new] - self._mean) / self._scale) @ self._matrix
        self.done[new] = True
        total = int(self.done.sum())
        if self.centres is None or total >= REFIT_GROWTH * self.fitted_on:
            self._fit(np.flatnonzero(self.done))
            self.fitted_on = total
            rows = np.flatnonzero(self.done)
        else:
            rows = new
        self.assign[rows] = _nearest(self.projected[rows], self.centres)

    def _fit(self, rows: np.ndarray) -> None:
        rng = np.random.default_rng([self.seed, 11, len(rows)])
        sample = self.projected[rng.permutation(rows)[:KMEANS_SAMPLE]]
        k = max(1, min(self.k, len(sample) // 2))
        centres = _kmeans_pp(sample, k, rng)
        for _ in range(15):
            which = _nearest(sample, centres)
            moved = np.stack([sample[which == c].mean(axis=0) if (which == c).any() else centres[c] for c in range(k)])
            if np.allclose(moved, centres):
                break
            centres = moved
        self.centres = centres


def _nearest(points: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """[m] index of the nearest centre of each of [m, p] points."""
    d = (points ** 2).sum(1)[:, None] - 2 * points @ centres.T + (centres ** 2).sum(1)[None, :]
    return d.argmin(axis=1)


def _kmeans_pp(points: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    centres = [points[rng.integers(len(points))]]
    dist = ((points - centres[0]) ** 2).sum(1)
    for _ in range(1, k):
        total = dist.sum()
        pick = rng.integers(len(points)) if total <= 0 else rng.choice(len(points), p=dist / total)
        centres.append(points[pick])
        dist = np.minimum(dist, ((points - points[pick]) ** 2).sum(1))
    return np.stack(centres).astype(np.float64)


class Picker:
    """Chooses the next item to label; see the module docstring."""

    def __init__(self, n_labels: int, seed: int = 0, *, random_share: float = 0.3, clusters: int | None = None,
                 cold_per_label: int = 2, cold_limit: int | None = None, candidates: int = 32):
        if not 0.0 <= random_share <= 1.0:
            raise ValueError(f"random_share must be in [0, 1], got {random_share}")
        self.n_labels, self.seed, self.random_share = n_labels, seed, random_share
        self.cold_per_label = cold_per_label
        # the cold start gives every label its first answers, and stops hunting a label that does not
        # turn up after a few extra picks (a label that never occurs cost 4 x L picks before)
        self.cold_limit = cold_limit if cold_limit is not None else cold_per_label * n_labels + COLD_EXTRA
        self.candidates = candidates
        self.clusters = Clusters(clusters or max(24, 3 * n_labels), seed)

    def pick(self, pool: PoolView, labelled: dict[int, int], excluded: set[int]) -> Pick | None:
        """The next row (None when every scored row is labelled or excluded).

        `labelled`: {row: label index} of the answers so far; `excluded`: rows never to offer
        (skipped, or shown and waiting elsewhere)."""
        n = len(pool.scored)
        open_ = pool.scored.copy()  # [n] rows that may be offered
        done = np.fromiter(labelled, np.int64, len(labelled)) if labelled else np.zeros(0, np.int64)
        open_[done[done < n]] = False
        if excluded:
            ex = np.fromiter(excluded, np.int64, len(excluded))
            open_[ex[ex < n]] = False
        if not open_.any():
            return None
        self.clusters.update(pool.features, pool.scored)
        names = pool.labels or tuple(f"label {i + 1}" for i in range(self.n_labels))
        rng = np.random.default_rng([self.seed, len(labelled), len(excluded)])
        if pool.priority is not None and (open_ & pool.priority).any():
            row = int(np.flatnonzero(open_ & pool.priority)[0])
            why = "flagged for review by the classify run this session started from"
            return Pick(row, why, "priority", why)
        counts = label_counts(labelled, self.n_labels)
        cold = pool.head is None or (counts.min() < self.cold_per_label and len(labelled) < self.cold_limit)
        if not cold and rng.random() < self.random_share:
            row = int(rng.choice(np.flatnonzero(open_)))
            why = "a random pick that keeps the accuracy estimate honest"
            return Pick(row, why, "random", why)
        per_cluster, size = self._coverage(done, open_)
        if cold:
            return self._cold(pool, open_, counts, per_cluster, size, names)
        return self._uncertain(pool, open_, per_cluster, size)

    def _coverage(self, done: np.ndarray, open_: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """([k] answers per cluster, [k] open rows per cluster)."""
        k = len(self.clusters.centres)
        assign = self.clusters.assign
        answered = assign[done[done < len(assign)]]
        per_cluster = np.bincount(answered[answered >= 0], minlength=k)
        size = np.bincount(assign[open_], minlength=k)
        return per_cluster, size

    def _cold(self, pool, open_, counts, per_cluster, size, names) -> Pick:
        k = len(per_cluster)
        # the cluster with the fewest answers for its size; ties: the biggest, then the lowest number
        need = np.where(size > 0, per_cluster / np.maximum(size, 1), np.inf)
        order = np.lexsort((np.arange(k), -size, need))
        cluster = int(order[0])
        rows = np.flatnonzero(open_ & (self.clusters.assign == cluster))
        zero_shot = np.nan_to_num(pool.zero_shot[rows], nan=0.0)
        # per item, its guess (column) of the question where that guess is rarest (a task of labels: its guess)
        cols = np.stack([span.start + zero_shot[:, span].argmax(axis=1) for _, span, _, _ in pool.asked], 1)
        guess = cols[np.arange(len(rows)), counts[cols].argmin(axis=1)]
        rarest = counts[guess].min()
        rows, guess = rows[counts[guess] == rarest], guess[counts[guess] == rarest]
        dist = ((self.clusters.projected[rows] - self.clusters.centres[cluster]) ** 2).sum(1)
        best = int(np.argmin(dist))
        row, label = int(rows[best]), names[int(guess[best])]
        kind = "not labelled yet" if per_cluster[cluster] == 0 else f"with only {per_cluster[cluster]} answered"
        detail = f"a kind of text {kind} (cluster {cluster + 1} of {k})"
        return Pick(row, f"{detail}; the model's guess, {label}, has {int(counts[guess[best]])} answers so far",
                    "cold", detail)

    def _uncertain(self, pool, open_, per_cluster, size) -> Pick:
        rows = np.flatnonzero(open_)
        probs = np.nan_to_num(pool.head[rows], nan=0.0)
        asked = pool.asked
        margin, which = least_sure(probs, asked)
        best = self._least_sure(rows, margin, per_cluster, size)
        name, span, how, labels = asked[int(which[best])]
        reason = how.unsure(name, labels, probs[best, span])
        return Pick(int(rows[best]), reason, "uncertain", reason)

    def _least_sure(self, rows, margin, per_cluster, size) -> int:
        """Among the `candidates` rows of smallest margin, the one from the cluster with the fewest
        answers for its size (ties: the smaller margin, then the lower row); its index into `rows`."""
        m = min(self.candidates, len(rows))
        near = np.argpartition(margin, m - 1)[:m] if m < len(rows) else np.arange(len(rows))
        clusters = self.clusters.assign[rows[near]]
        share = per_cluster[clusters] / np.maximum(size[clusters], 1)
        return int(near[np.lexsort((rows[near], margin[near], share))[0]])
