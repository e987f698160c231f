"""Build the service (one model load, one Classifier per task) and run it under uvicorn.

SIGTERM / Ctrl-C: uvicorn stops accepting connections, waits for the requests in flight (their
texts are already queued and keep running on the worker), then the app's shutdown finishes the
queue and ends the worker; the process exits 0. No accepted request is lost.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import time

from ..classifier import Classifier, EngineSettings
from ..errors import TaskError
from ..models.loading import LoadedModel, model_id
from ..models.prepare import load_model
from ..models.schedule import scheduled
from ..core.task import Task
from ..web.bind import bind as web_bind
from .adapter import TaskRunner
from .settings import ServeSettings

log = logging.getLogger("slmclassify.serve")


def build_service(tasks: dict[str, Task], model: str | LoadedModel | None, engine: EngineSettings,
                  settings: ServeSettings):
    """Load the model once and build every task's classifier (prefix cache, calibration). Without a
    task, the service answers chat requests with choices only."""
    from .app import Service

    # --precision auto: decided once, on the first task, with article tickets (a service has no data yet)
    first = next(iter(tasks.values()), None)
    loaded = load_model(model, engine.device, engine.precision, task=first, settings=engine)
    runners = {name: TaskRunner(name, Classifier(task, model=loaded, settings=engine)) for name, task in tasks.items()}
    # chat requests are batched as the tasks are (their measured schedule), or by the defaults without one
    chat = next(iter(runners.values())).classifier.settings if runners else scheduled(engine, loaded)[0]
    names = settings.served_model_names or (model_id(loaded.name),)
    return Service(runners=runners, settings=settings, model_names=names, loaded=loaded, chat_settings=chat)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0: an ephemeral one), inheritable; errors name the address."""
    try:
        sock = web_bind(host, port, backlog=2048)
    except OSError as exc:
        raise TaskError("cannot listen on {address}:{number}: {reason}; pick another {host}/{port}",
                        names={"host": "host", "port": "port"}, address=host, number=port,
                        reason=exc.strerror) from None
    sock.set_inheritable(True)
    return sock


def make_server(app, settings: ServeSettings):
    """A uvicorn server for `app`; run it with `server.run(sockets=[bound socket])`."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """uvicorn re-raises SIGTERM/SIGINT once it has shut down; after a complete drain we
        exit 0 instead (the `stopped` log line says so)."""

        def handle_exit(self, sig, frame):
            super().handle_exit(sig, frame)
            self._captured_signals.clear()

    config = uvicorn.Config(app, lifespan="on", access_log=False, log_level="warning",
                            timeout_graceful_shutdown=int(settings.request_timeout_s) + 5)
    return DrainingServer(config)


def serve(service, host: str, port: int) -> None:
    """Run until SIGTERM/SIGINT; logs one JSON line per request on stderr."""
    from .app import create_app

    configure_logging()
    sock = bind(host, port)
    server = make_server(create_app(service), service.settings)
    actual = sock.getsockname()[1]
    log.info(json.dumps({"ts": _now(), "event": "listening", "url": f"http://{host}:{actual}",
                         "model": service.model_name, "model_path": service.loaded.name, "tasks": sorted(service.runners),
                         "max_wait_ms": service.settings.max_wait_ms}))
    server.run(sockets=[sock])
    log.info(json.dumps({"ts": _now(), "event": "stopped"}))


def configure_logging() -> None:
    """JSON lines on stderr for the access log and the service's own events."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    for name in ("slmclassify.access", "slmclassify.serve"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(logging.INFO)
        logger.propagate = False


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z"
