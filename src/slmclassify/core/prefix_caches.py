"""The engine's prefix caches of many heads (chat requests and batch lines declare no task: each
conversation's prefix is found by itself, `conversation.py`), the least recently used dropped once
they hold more than their bytes. One owner at a time: the service's worker thread, or a batch job."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from ..errors import FieldError


def check_prefix_cache_mb(value: float) -> None:
    """The memory for prefix caches (serve's and batch's --prefix-cache-mb): 0 or more MB."""
    if not value >= 0:
        raise FieldError("prefix_cache_mb", "{field} must be >= 0, got {value}", value=value)


class PrefixCaches:
    """Prefix caches by prefix ids, within `max_bytes` (0: none kept, each lookup computes its prefix).

    `observe(event, tokens)` hears `"hit"` / `"miss"` per lookup with the prefix's tokens, so a caller
    can count them (the service's /metrics)."""

    def __init__(self, engine, max_bytes: int, observe: Callable[[str, int], None] | None = None):
        self.engine = engine
        self.max_bytes = max_bytes
        self.observe = observe or (lambda event, tokens: None)
        self._caches: OrderedDict[tuple[int, ...], tuple[object, int]] = OrderedDict()
        self.bytes = 0

    @property
    def heads(self) -> list[tuple[int, ...]]:
        """The heads held, least recently used first."""
        return list(self._caches)

    def get(self, prefix_ids: tuple[int, ...]):
        """The engine's prefix cache of `prefix_ids`, computed now when it is not held."""
        if prefix_ids in self._caches:
            self._caches.move_to_end(prefix_ids)
            self.observe("hit", len(prefix_ids))
            return self._caches[prefix_ids][0]
        self.observe("miss", len(prefix_ids))
        cache = self.engine.prefill(list(prefix_ids))
        size = sum(t.numel() * t.element_size() for t in (*cache.keys, *cache.values))
        if size <= self.max_bytes:
            self._caches[prefix_ids] = (cache, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, dropped) = self._caches.popitem(last=False)
                self.bytes -= dropped
        return cache
