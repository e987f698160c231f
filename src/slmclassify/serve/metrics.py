"""Prometheus metrics of the service, in a registry of their own (one per app, so tests can
run several apps in one process)."""

from __future__ import annotations

from .adapter import BatchWork

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    """Requests by status, texts, batch sizes, padding, queue depth and latency histograms."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("slmclassify_requests", "HTTP requests by path and status code",
                                ["path", "status"], registry=r)
        self.latency = Histogram("slmclassify_request_seconds", "Time to answer /v1/classify requests",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("slmclassify_queue_wait_seconds", "Time a request waited for its batch",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.items = Counter("slmclassify_items", "Texts answered, by task and status", ["task", "status"],
                             registry=r)
        self.dropped = Counter("slmclassify_items_dropped", "Texts dropped before they ran (client gone, timeout)",
                               registry=r)
        self.batch_rows = Histogram("slmclassify_batch_rows", "Rows per engine batch", ["task"],
                                    buckets=ROW_BUCKETS, registry=r)
        self.batch_seconds = Histogram("slmclassify_batch_seconds", "Time per engine batch", ["task"],
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.real_tokens = Counter("slmclassify_real_tokens", "Non-pad tokens run by the engine", ["task"],
                                   registry=r)
        self.processed_tokens = Counter("slmclassify_processed_tokens", "Tokens run by the engine, padding included",
                                        ["task"], registry=r)
        self.padding = Gauge("slmclassify_padding_share", "Share of padding in the tokens run so far", ["task"],
                             registry=r)
        self.queue_depth = Gauge("slmclassify_queue_items", "Texts waiting for the model", registry=r)
        self.prefix_lookups = Counter("slmclassify_prefix_cache_lookups", "Chat batches' prefix cache lookups, "
                                      "by result (hit or miss)", ["result"], registry=r)
        self.prefix_tokens = Counter("slmclassify_prefix_tokens", "Chat prompts' prefix tokens: computed (a miss) or "
                                     "reused by an item from the cache", ["how"], registry=r)
        self.prefix_cache_bytes = Gauge("slmclassify_prefix_cache_bytes", "Memory held by chat prefix caches",
                                        registry=r)
        self._tokens: dict[str, list[int]] = {}

    def batch(self, task: str, work: BatchWork, seconds: float) -> None:
        self.batch_rows.labels(task).observe(work.rows)
        self.batch_seconds.labels(task).observe(seconds)
        self.real_tokens.labels(task).inc(work.real_tokens)
        self.processed_tokens.labels(task).inc(work.processed_tokens)
        totals = self._tokens.setdefault(task, [0, 0])
        totals[0] += work.real_tokens
        totals[1] += work.processed_tokens
        if totals[1]:
            self.padding.labels(task).set(1 - totals[0] / totals[1])

    def exposition(self) -> tuple[bytes, str]:
        """The metrics in the Prometheus text format, and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
