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
and an answer is the tuple of the columns it chose. An item is as uncertain as its LEAST sure
question (the smallest of its questions' margins, each on the same 0..1 scale): one answer labels
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
    """Columns are each label's P(yes) (independent), not one distribution."""
    questions: tuple = ()
    """A task of questions: per question (name, its columns, multi-label, its labels)."""


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
             multi_label: bool = False, questions: tuple = ()) -> str:
    """The reason line of a pick from the scores on screen now (`probs` [L], the head's once it
    exists): so the guess it names is the guess shown, after a refit too."""
    if probs is None or np.isnan(probs).any():
        return detail
    order = np.argsort(-probs)
    if detail.startswith(("brought back", "chosen")):  # undo or the history: said as it is
        return detail
    if kind == "uncertain" and questions:
        return unsure_about(probs, questions[int(least_sure(probs[None, :], questions)[1][0])])
    if kind == "cold":
        top = int(order[0])
        what = "its likeliest label" if multi_label else "its guess"
        return f"{detail}; {what}, {labels[top]}, has {int(counts[top])} answers so far"
    if kind == "uncertain" and multi_label:
        j = int(np.argmin(np.abs(2 * probs - 1)))
        return f"the model is unsure whether {labels[j]} applies (P {probs[j]:.2f})"
    if kind == "uncertain" and len(order) > 1:
        a, b = int(order[0]), int(order[1])
        return f"the model is unsure between {labels[a]} and {labels[b]} (margin {probs[a] - probs[b]:.2f})"
    return detail


def least_sure(probs: np.ndarray, questions: tuple) -> tuple[np.ndarray, np.ndarray]:
    """[m, C] probabilities of a task of questions → ([m] each item's smallest margin over its
    questions, [m] which question has it). A question's margin: top-1 minus top-2 probability, or
    for a multi-label question |2p - 1| of its label nearest 0.5."""
    margins = []
    for _, span, multi, _ in questions:
        p = probs[:, span]
        if multi:
            margins.append(np.abs(2 * p - 1).min(axis=1))
        else:
            top = -np.partition(-p, 1, axis=1)[:, :2]  # [m, 2] the two largest, largest first
            margins.append(top[:, 0] - top[:, 1])
    margin = np.stack(margins, axis=1)  # [m, Q]
    return margin.min(axis=1), margin.argmin(axis=1)


def unsure_about(probs: np.ndarray, question: tuple) -> str:
    """The reason line of an uncertain pick of a task of questions: its least sure `question`."""
    name, span, multi, labels = question
    p = probs[span]
    if multi:
        j = int(np.argmin(np.abs(2 * p - 1)))
        return f"the model is unsure whether {labels[j]} applies ({name}, P {p[j]:.2f})"
    a, b = np.argsort(-p)[:2]
    return f"the model is unsure about {name}: {labels[a]} or {labels[b]} (margin {p[a] - p[b]:.2f})"


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
        return self._uncertain(pool, open_, per_cluster, size, names)

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
        if pool.questions:  # per item, its guess (column) of the question where that guess is rarest
            cols = np.stack([span.start + zero_shot[:, span].argmax(axis=1) for _, span, _, _ in pool.questions], 1)
            guess = cols[np.arange(len(rows)), counts[cols].argmin(axis=1)]
        else:
            guess = zero_shot.argmax(axis=1)
        rarest = counts[guess].min()
        rows, guess = rows[counts[guess] == rarest], guess[counts[guess] == rarest]
        dist = ((self.clusters.projected[rows] - self.clusters.centres[cluster]) ** 2).sum(1)
        best = int(np.argmin(dist))
        row, label = int(rows[best]), names[int(guess[best])]
        kind = "not labelled yet" if per_cluster[cluster] == 0 else f"with only {per_cluster[cluster]} answered"
        detail = f"a kind of text {kind} (cluster {cluster + 1} of {k})"
        return Pick(row, f"{detail}; the model's guess, {label}, has {int(counts[guess[best]])} answers so far",
                    "cold", detail)

    def _uncertain(self, pool, open_, per_cluster, size, names) -> Pick:
        rows = np.flatnonzero(open_)
        probs = np.nan_to_num(pool.head[rows], nan=0.0)
        if pool.questions:
            margin, which = least_sure(probs, pool.questions)
            best = self._least_sure(rows, margin, per_cluster, size)
            reason = unsure_about(probs[best], pool.questions[int(which[best])])
            return Pick(int(rows[best]), reason, "uncertain", reason)
        if pool.multi_label:  # the label nearest 0.5 decides how unsure an item is
            closeness = np.abs(2 * probs - 1)  # [m, L]
            which, margin = closeness.argmin(axis=1), closeness.min(axis=1)
            best = self._least_sure(rows, margin, per_cluster, size)
            j = int(which[best])
            reason = f"the model is unsure whether {names[j]} applies (P {probs[best, j]:.2f})"
            return Pick(int(rows[best]), reason, "uncertain", reason)
        top2 = np.argpartition(-probs, 1, axis=1)[:, :2]  # [m, 2] the two most probable labels (unordered)
        p2 = np.take_along_axis(probs, top2, axis=1)
        margin = np.abs(p2[:, 0] - p2[:, 1])
        best = self._least_sure(rows, margin, per_cluster, size)
        a, b = top2[best][np.argsort(-p2[best])]
        reason = f"the model is unsure between {names[a]} and {names[b]} (margin {margin[best]:.2f})"
        return Pick(int(rows[best]), reason, "uncertain", reason)

    def _least_sure(self, rows, margin, per_cluster, size) -> int:
        """Among the `candidates` rows of smallest margin, the one from the cluster with the fewest
        answers for its size (ties: the smaller margin, then the lower row); its index into `rows`."""
        m = min(self.candidates, len(rows))
        near = np.argpartition(margin, m - 1)[:m] if m < len(rows) else np.arange(len(rows))
        clusters = self.clusters.assign[rows[near]]
        share = per_cluster[clusters] / np.maximum(size[clusters], 1)
        return int(near[np.lexsort((rows[near], margin[near], share))[0]])
