"""Micro-batching: one worker thread owns the engine and runs the texts of concurrent requests
together, sorted by length, in token-budget batches.

    handlers (event loop)                     worker thread
    encode → submit(ticket) ──► queue ──►  idle engine: wait while requests keep arriving
                                           (gap ≤ max_wait/4), at most max_wait, or until
                                           the pool is full (POOL_BUDGETS token budgets)
                                           take tickets of the oldest one's task (FIFO)
                                           all their texts → plan_batches (longest first)
    future ◄── results in request order ◄── per batch: score, write rows back to their tickets

Invariants: every scored text of a ticket is run exactly once, unless the ticket was cancelled
(client gone, timeout), in which case its texts that were not yet run are dropped; a ticket's
future is resolved exactly once (results, or the engine's error); the queue never holds more
than `max_queue_items` texts (`submit` raises QueueFull instead).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from ..core.batching import plan_batches
from .adapter import EncodedRequest, Runner

# One cycle takes up to this many token budgets of texts: sorting a larger pool than one batch
# cuts padding, while keeping the pool small keeps the wait of texts that arrive meanwhile short.
POOL_BUDGETS = 4
# The idle engine stops waiting for a pool to grow once no request has arrived for max_wait / this:
# a lone request on a quiet server waits a quarter of max_wait, a burst keeps the pool open.
ARRIVAL_GAP_SHARE = 4


def batch_wait(now: float, *, first: float, last: float, free_since: float, max_wait: float, gap: float,
               full: bool) -> float:
    """Seconds the idle engine should still wait before taking a pool (≤ 0: take it now).

    first, last: arrival times of the oldest and newest waiting tickets of the pool's task;
    free_since: when the engine finished its previous pool. The wait starts when the engine could
    have taken the oldest ticket (its arrival, or the engine becoming free if it was busy) and
    lasts at most `max_wait`; it ends sooner once no ticket has arrived for `gap` seconds since
    then, or once the pool is full. Measuring from the engine becoming free, not from the oldest
    arrival, is what lets the clients answered by the last batch of a pool, whose next requests
    arrive a few ms after it, join the next pool instead of waiting a whole pool for the one after.
    """
    if full:
        return 0.0
    start = max(first, free_since)
    return min(start + max_wait, max(last, free_since) + gap) - now


class QueueFull(Exception):
    """The queue holds `max_queue_items` texts already; try again after `retry_after` seconds."""

    def __init__(self, retry_after: int):
        super().__init__(f"the queue is full; retry after {retry_after} s")
        self.retry_after = retry_after


@dataclass(eq=False)
class Ticket:
    """One request waiting for the model."""

    runner: Runner
    encoded: EncodedRequest
    future: Future = field(default_factory=Future)
    """Resolved with the runner's `results` of the request: its Results in request order, a chat
    request's choice scores, a completions request's answers."""
    enqueued: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    """Set by the handler when the client is gone or timed out: pending texts are dropped."""

    def __post_init__(self) -> None:
        self.scores = self.runner.empty_scores(len(self.encoded.status))  # one row per pick, empty until scored
        self.remaining = len(self.encoded.scored)

    @property
    def size(self) -> int:
        return len(self.encoded.scored)

    @property
    def tokens(self) -> int:
        return sum(self.encoded.lengths)


class Scheduler:
    """The worker thread and its bounded queue."""

    def __init__(self, max_wait_ms: float, max_queue_items: int, metrics=None):
        self.max_wait = max_wait_ms / 1000
        self.arrival_gap = self.max_wait / ARRIVAL_GAP_SHARE
        self._free_since = time.monotonic()  # when the engine last finished a pool (or started)
        self.max_queue_items = max_queue_items
        self.metrics = metrics
        self._queue: deque[Ticket] = deque()
        self._queued_items = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._rate = 0.0  # items/s, smoothed, for Retry-After
        self._thread = threading.Thread(target=self._run, name="slmclassify-engine", daemon=True)

    # --- called from the event loop -------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    @property
    def queued_items(self) -> int:
        return self._queued_items

    def submit(self, ticket: Ticket) -> None:
        """Queue a ticket with at least one text to score, or raise QueueFull."""
        if ticket.size == 0:
            raise ValueError("a ticket without texts to score reached the queue: a bug in slmclassify, please report it")
        with self._cond:
            if self._stopping:
                raise QueueFull(retry_after=1)
            if self._queued_items + ticket.size > self.max_queue_items:
                raise QueueFull(self._retry_after())
            self._queue.append(ticket)
            self._queued_items += ticket.size
            self._set_depth()
            self._cond.notify()

    def cancel(self, ticket: Ticket) -> None:
        """Drop the ticket's texts that have not run yet (client gone or timed out)."""
        with self._cond:
            ticket.cancelled = True
            if ticket in self._queue:
                self._queue.remove(ticket)
                self._queued_items -= ticket.size
                self._set_depth()
                self._dropped(ticket.size)

    def stop(self, timeout: float | None = None) -> None:
        """Finish every queued ticket without waiting for more, then end the worker."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # --- the worker thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            pool = self._next_pool()
            if pool is None:
                return
            self._run_pool(pool)
            self._free_since = time.monotonic()

    def _next_pool(self) -> list[Ticket] | None:
        """Wait for tickets, then while `batch_wait` says more are likely to join; take the pool."""
        with self._cond:
            while True:
                if not self._queue:
                    if self._stopping:
                        return None
                    self._cond.wait()
                    continue
                if self._stopping:
                    break
                left = self._wait_left(time.monotonic())
                if left <= 0:
                    break
                self._cond.wait(left)
            runner = self._queue[0].runner
            limit = runner.token_budget or runner.max_rows
            pool, taken = [], 0
            for ticket in list(self._queue):
                if ticket.runner is not runner:
                    continue
                if pool and taken >= POOL_BUDGETS * limit:
                    break
                self._queue.remove(ticket)
                self._queued_items -= ticket.size
                pool.append(ticket)
                taken += ticket.tokens if runner.token_budget else ticket.size
            self._set_depth()
        if self.metrics is not None:
            now = time.monotonic()
            for ticket in pool:
                self.metrics.queue_wait.observe(now - ticket.enqueued)
        return pool

    def _wait_left(self, now: float) -> float:
        """Seconds to keep waiting for the oldest ticket's task's pool to grow (≤ 0: take it now)."""
        runner = self._queue[0].runner
        waiting = [t for t in self._queue if t.runner is runner]
        size = sum(t.tokens for t in waiting) if runner.token_budget else sum(t.size for t in waiting)
        return batch_wait(now, first=waiting[0].enqueued, last=max(t.enqueued for t in waiting),
                          free_since=self._free_since, max_wait=self.max_wait, gap=self.arrival_gap,
                          full=size >= POOL_BUDGETS * (runner.token_budget or runner.max_rows))

    def _run_pool(self, pool: list[Ticket]) -> None:
        """Run every text of the pool's tickets, sorted by length, and resolve each ticket."""
        if not pool:
            return
        runner = pool[0].runner
        picks = [(t, i) for t in pool for i in t.encoded.scored]
        lengths = np.array([length for t in pool for length in t.encoded.lengths])
        started = time.monotonic()
        try:
            for positions in plan_batches(lengths, runner.token_budget, runner.max_rows):
                batch = [picks[p] for p in positions if not picks[p][0].cancelled]
                if len(batch) < len(positions):
                    self._dropped(len(positions) - len(batch))
                if not batch:
                    continue
                batch_started = time.monotonic()
                scores, work = runner.score([(t.encoded, i) for t, i in batch])  # [b, L]
                for (ticket, i), row in zip(batch, scores):
                    ticket.scores[i] = row
                    ticket.remaining -= 1
                    if ticket.remaining == 0:
                        self._finish(ticket)
                if self.metrics is not None:
                    self.metrics.batch(runner.name, work, time.monotonic() - batch_started)
        except Exception as exc:  # the engine failed: every unresolved ticket of the pool gets the error
            for ticket in pool:
                if not ticket.future.done():
                    ticket.future.set_exception(exc)
            return
        elapsed = time.monotonic() - started
        done = sum(t.size for t in pool if not t.cancelled)
        if elapsed > 0 and done:
            rate = done / elapsed
            self._rate = rate if not self._rate else 0.8 * self._rate + 0.2 * rate

    def _finish(self, ticket: Ticket) -> None:
        if ticket.cancelled or ticket.future.done():
            return
        try:
            ticket.future.set_result(ticket.runner.results(ticket.scores, ticket.encoded.status))
        except Exception as exc:
            ticket.future.set_exception(exc)

    def _retry_after(self) -> int:
        """Seconds until the queue has likely drained, from the recent throughput (1..60)."""
        if not self._rate:
            return 1
        return int(min(60, max(1, math.ceil(self._queued_items / self._rate))))

    def _set_depth(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(self._queued_items)

    def _dropped(self, n: int) -> None:
        if self.metrics is not None and n:
            self.metrics.dropped.inc(n)
