"""The service's limits and scheduling knobs, validated once when the server starts."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.prefix_caches import check_prefix_cache_mb
from ..core.settings import check_served_names
from ..errors import FieldError, TaskError

DEFAULT_MAX_WAIT_MS = 50.0


@dataclass(frozen=True)
class ServeSettings:
    """How the service admits, queues and batches requests (engine batch shape: EngineSettings)."""

    max_wait_ms: float = DEFAULT_MAX_WAIT_MS
    """Longest the idle engine waits for more requests to join a pool (0: never wait); it stops sooner
    once no request has arrived for a quarter of this (scheduler.batch_wait)."""
    max_texts: int = 64
    """Most texts in one request (more: 413)."""
    max_body_bytes: int = 1 << 20
    """Largest request body in bytes (more: 413)."""
    max_queue_items: int = 1024
    """Most texts waiting for the model across all requests (more: 503 with Retry-After)."""
    request_timeout_s: float = 30.0
    """A request not answered within this many seconds gets 504 and its pending texts are dropped."""
    api_key: str | None = None
    """When set, every endpoint but /healthz needs `Authorization: Bearer <key>`."""
    prefix_cache_mb: float = 256.0
    """Memory for the prefix caches of chat requests' heads (least recently used dropped; 0: none kept)."""
    served_model_names: tuple[str, ...] = ()
    """The ids requests name the model by, the first listed first (none: the model's own id,
    `models.loading.model_id`)."""

    def __post_init__(self) -> None:
        if self.max_wait_ms < 0:
            raise FieldError("max_wait_ms", "{field} must be >= 0, got {value}", value=self.max_wait_ms)
        for name in ("max_texts", "max_body_bytes", "max_queue_items"):
            if getattr(self, name) < 1:
                raise FieldError(name, "{field} must be positive, got {value}", value=getattr(self, name))
        check_prefix_cache_mb(self.prefix_cache_mb)
        check_served_names(self.served_model_names)
        if not self.request_timeout_s > 0:
            raise FieldError("request_timeout_s", "{field} must be positive, got {value}", value=self.request_timeout_s)
        if self.api_key is not None and not self.api_key.strip():
            raise TaskError("the API key is empty; unset SLMCLASSIFY_API_KEY or pass a non-empty {field}",
                            names={"field": "api_key"})
