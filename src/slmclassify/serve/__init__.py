"""`slmclassify serve`: an HTTP service that batches concurrent requests by length.

One loaded model is shared by every task; each task has its own `Classifier` (prefix cache,
calibration) built at start-up. A single worker thread owns the engine (`scheduler.py`); the
HTTP layer (`app.py`, FastAPI on uvicorn) only tokenizes, queues and waits. Modules:

    settings   ServeSettings: limits and scheduling knobs, validated once
    adapter    the only module that touches Classifier internals (encoded items, scores, results)
    scheduler  micro-batching: wait ≤ max_wait_ms or until the token budget fills, sort, split back
    guard      ASGI middleware: API key, request-size limit, structured access log
    metrics    Prometheus metrics (one registry per app)
    app        the FastAPI application and its endpoints
    server     build the service and run uvicorn with graceful drain on SIGTERM

The load generator behind `slmclassify loadtest` is `bench/service_load.py`. FastAPI, uvicorn,
prometheus-client and httpx come with the `serve` extra and are imported only inside these
modules (and the labelling page's, `label/`), never by the rest of the library.
"""

from .settings import ServeSettings

__all__ = ["ServeSettings"]
