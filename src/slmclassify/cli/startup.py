"""What commands check or start before their work: torch's threads, once per process, and the
'serve' extra of the commands that run a web server or talk to one."""

from __future__ import annotations

from ..errors import TaskError


def start_torch() -> None:
    """Import torch and set its threads, once per process, before anything heavy."""
    from ..interrupts import exit_at_once_while_starting

    with exit_at_once_while_starting():  # torch's start-up cannot be interrupted by an exception
        from ..models import loading

        loading.set_threads()  # once per process, from its CPU affinity; the library never does


def need_serve_extra() -> None:
    """Refuse, naming the extra, when a module of the 'serve' extra is missing."""
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn", "prometheus_client", "httpx") if importlib.util.find_spec(m) is None]
    if missing:
        raise TaskError(f"serve needs the 'serve' extra ({', '.join(missing)} missing): "
                        "pip install 'slmclassify[serve]'")
