"""Scores shared by the actors of one run, so that an item is run through the model once in total.

Without sharing, a text that lands in blocks of two actors is run by both (the article's 600
tickets hold 335 distinct texts; two actors ran 427). `SharedScores` is the run's registry of item
scores, kept on the run's board actor (`actors.RunBoard`); `score_block` is an actor's side of it.
Items are keyed by a 16-byte digest of `EncodedItems.key` (the same identity the single process
deduplicates on: equal keys, equal token ids, equal scores).

An actor scores its block one engine batch at a time, longest items first (the order
`plan_batches` runs them), with ONE round trip to the board per batch (`exchange`): it publishes
the scores of the batch it just ran, gets the scores of any of its remaining items that another
actor has published meanwhile, and leases the next batch. A key leased by another actor is skipped
for now and taken from the board later; only when nothing else is left does the actor poll for it.

Nothing waits on an actor that may have died: a lease lasts a few times the batch's expected
time (the owner's own measured seconds per token, at least `LEASE_MIN_S`); when it runs out the
key is free again and the next actor that needs it runs it itself. So a killed actor's batch costs
at most one lease of waiting and loses nothing; the only double work is a lease that ran out on a
live, slow owner (both results agree within float rounding; the first one published is kept).

Memory: at most `SHARED_ITEMS` published keys (digest + L float64 scores: 24.4 MB for 100,000 items
of a 3-label task, measured with tracemalloc); past that the oldest are forgotten, and a later
duplicate of a forgotten item is simply run again.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..core.results import RunStats

SHARED_ITEMS = 100_000
"""Distinct items whose scores the board keeps (24 MB with 3 labels); the oldest are forgotten past this."""
LEASE_MIN_S = 5.0
"""Shortest lease on a batch being run: what a dead actor's batch can cost the others in waiting."""
LEASE_FACTOR = 4.0
"""A lease lasts this many times the owner's expected time for the batch."""
LEASE_FIRST_S = 60.0
"""Lease of an actor's first batch, before it has measured its own speed."""
POLL_S = 0.05
"""Pause between two looks at the board while every item left is being run by another actor."""


def board_key(key: bytes) -> bytes:
    """The board's key of an item (`EncodedItems.key`): 16 bytes instead of the item's token ids."""
    return hashlib.blake2b(key, digest_size=16).digest()


@dataclass(frozen=True)
class Reply:
    """What the board answers an actor's `exchange`."""

    known: dict[bytes, np.ndarray]
    """Scores published by any actor, of the keys the actor asked about."""
    granted: list[bytes]
    """Keys of the requested batch now leased to this actor: it runs them."""
    elsewhere: list[bytes]
    """Keys asked about that another actor holds a live lease on (running them now)."""


class SharedScores:
    """The registry: published scores (oldest first, at most `cap`) and leases on keys being run."""

    def __init__(self, cap: int = SHARED_ITEMS, clock: Callable[[], float] = time.monotonic):
        self.cap, self.clock = cap, clock
        self.scores: dict[bytes, np.ndarray] = {}
        self.leases: dict[bytes, tuple[str, float]] = {}  # key → (owner, lease end on `clock`)
        self.published = 0
        self.forgotten = 0

    def exchange(self, owner: str, publish: dict[bytes, np.ndarray], want: list[bytes], take: list[bytes],
                 lease_s: float) -> Reply:
        """Store `publish`; answer for `want` (the owner's items still to score); lease `take` (the
        batch it means to run next, a part of `want`) except keys known or leased by another owner."""
        now = self.clock()
        for key, scores in publish.items():
            self.leases.pop(key, None)
            if key not in self.scores:  # the first result stays: every later one agrees with it
                self.scores[key] = scores
                self.published += 1
        while len(self.scores) > self.cap:
            del self.scores[next(iter(self.scores))]
            self.forgotten += 1
        if len(self.leases) > self.cap:  # leases of owners that died before publishing
            self.leases = {k: v for k, v in self.leases.items() if v[1] > now}
        known, elsewhere = {}, []
        for key in want:
            if key in self.scores:
                known[key] = self.scores[key]
            elif self._held_by_other(key, owner, now):
                elsewhere.append(key)
        granted = [key for key in take if key not in known and not self._held_by_other(key, owner, now)]
        for key in granted:
            self.leases[key] = (owner, now + lease_s)
        return Reply(known, granted, elsewhere)

    def figures(self) -> dict:
        return {"kept": len(self.scores), "published": self.published, "forgotten": self.forgotten,
                "leased": len(self.leases)}

    def _held_by_other(self, key: bytes, owner: str, now: float) -> bool:
        lease = self.leases.get(key)
        return lease is not None and lease[0] != owner and lease[1] > now


class Pace:
    """An actor's measured seconds per processed token, for the leases it asks for."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.tokens = 0

    def add(self, stats: RunStats) -> None:
        self.seconds += stats.seconds
        self.tokens += stats.processed_tokens

    def lease(self, padded_tokens: int) -> float:
        if not self.tokens:
            return LEASE_FIRST_S
        return max(LEASE_MIN_S, LEASE_FACTOR * self.seconds / self.tokens * padded_tokens)


@dataclass(frozen=True)
class ScoredBlock:
    """One block's raw scores and results, in input order, and what the actor did for it."""

    scores: np.ndarray
    """[n, L] raw label scores (NaN rows for empty items)."""
    results: list
    stats: RunStats
    """`scored - reused` = items this actor ran through the model for the block."""
    waited: float
    """Seconds spent waiting for items that other actors were running."""


Exchange = Callable[[dict, list, list, float], Reply]
"""(publish, want, take, lease_s) → Reply: `SharedScores.exchange` for one owner, over Ray or not."""


def score_block(classifier, texts: list[str], exchange: Exchange, pace: Pace) -> ScoredBlock:
    """Score one block, taking from the board what other actors ran and publishing what this one runs."""
    waited = 0.0

    def run(encoded, unique: list[int], item_keys: list[bytes]):
        """The distinct items' `Scored`: from the board, or run here a batch at a time and published."""
        nonlocal waited
        from ..core.scoring import Scored  # imports torch: not at module import (the actor times its imports)

        keys = [board_key(key) for key in item_keys]  # keys[j] is the board's key of unique[j]
        lengths = np.array([len(encoded.own(i)) for i in unique], dtype=np.int64)
        unique_scores = np.full((len(unique), len(classifier.trie.labels)), np.nan)
        remaining = [int(j) for j in np.argsort(-lengths, kind="stable")]  # longest first, as plan_batches
        ran, parts = 0, RunStats()
        publish: dict[bytes, np.ndarray] = {}
        take: list[int] = []  # the first exchange only looks
        while remaining or publish:
            padded = len(take) * int(lengths[take].max()) if take else 0
            reply = exchange(publish, [keys[j] for j in remaining], [keys[j] for j in take], pace.lease(padded))
            publish = {}
            granted = set(reply.granted)
            mine = [j for j in take if keys[j] in granted]
            for j in remaining:
                if keys[j] in reply.known:
                    unique_scores[j] = reply.known[keys[j]]
            remaining = [j for j in remaining if keys[j] not in reply.known and keys[j] not in granted]
            if mine:
                batch = classifier.score(encoded.subset([unique[j] for j in mine]))
                unique_scores[mine] = batch.scores  # [m, L]
                parts.add(batch.stats)
                pace.add(batch.stats)
                ran += len(mine)
                publish = {keys[j]: unique_scores[j].copy() for j in mine}
            busy = set(reply.elsewhere)
            free = [j for j in remaining if keys[j] not in busy]
            take = _first_batch(free, lengths, classifier.settings)
            if remaining and not mine and not free:  # everything left is being run by others right now
                paused = time.perf_counter()
                time.sleep(POLL_S)
                waited += time.perf_counter() - paused
        parts.scored = ran  # the items this actor ran; the others came from the board
        return Scored(scores=unique_scores, states=None, stats=parts)

    scored = classifier.score_items(texts, run=run)
    return ScoredBlock(scored.scores, scored.results, scored.stats, waited)


def _first_batch(order: list[int], lengths: np.ndarray, settings) -> list[int]:
    """The first engine batch `plan_batches` makes of these items, in this order."""
    if not order:
        return []
    from ..core.batching import plan_batches  # imports torch: not at module import (the actor times its imports)

    head = plan_batches(lengths[order], settings.token_budget, settings.max_rows, sort=False)[0]
    return [order[p] for p in head]
