"""Starting Ray for one run: connect to a cluster, or start a lean local Ray on this machine.

`ray.init()` without an address starts, besides the GCS and the raylet, five Python processes
(each imports Ray: ~0.8 s of CPU on a 2-core machine, all while `ray.init` waits). Three of them
do nothing for a run on one machine, and `start_ray` leaves them out when it starts Ray here:

- the autoscaler monitor: there is no cluster to scale (Ray Data's own autoscaling coordinator
  is an actor and stays). It also holds up `ray.shutdown()`: it ignores the SIGTERM for the whole
  1 s that Ray waits before it kills it, nearly all of shutdown's time;
- the log monitor: it streams the workers' logs to the driver, which `log_to_driver=False`
  turns off anyway (the logs are still written under the session's `logs/` folder);
- the API server (the dashboard's process, without the dashboard: `include_dashboard=False`),
  which serves `ray.util.state` and the `ray list`/`ray status` commands to people inspecting a
  cluster; nobody inspects a Ray that lives for one command. `ray.init` waits for it to come
  up. Ray runs without one where the dashboard cannot start (the `ray` minimal install), and
  Ray Data's only use of it, its hanging-task detector, takes a failed query as "unknown".

What leaving them out saves in `ray.init` and `ray.shutdown` is in docs/ray.md. `ray start --head`
has the same switches for the first two, `--no-monitor` and `--include-log-monitor=False`; `ray.init`
does not pass them on, so they are set on the parameters it builds, only while this call starts Ray.
Without an address `ray.init` joins the Ray that `RAY_ADDRESS` names or that `ray start` runs on
this machine, if any (Ray's rule; `address="local"` always starts a new one); a Ray that is joined
is left as it is: its processes are its own.
"""

from __future__ import annotations

import contextlib

import ray

INIT_OPTIONS = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
"""What every Ray this package starts or joins is given: no dashboard, the workers' logs kept in
their files rather than streamed to the driver, and the caller's logging left as it is."""


def start_ray(address: str | None = None, **options) -> bool:
    """Start or join Ray unless it is up already; returns whether this call did (then the caller
    shuts it down with `ray.shutdown()`, which takes ~0.2 s for a lean local Ray)."""
    if ray.is_initialized():
        return False
    with _lean_local_node():
        ray.init(address=address, **INIT_OPTIONS, **options)
    return True


@contextlib.contextmanager
def _lean_local_node():
    """While it is open, a head node started by `ray.init` has no autoscaler monitor, no log monitor
    and no API server (a connection to a running cluster starts no processes and is left as it is)."""
    from ray._private import node, parameter

    original_params, original_api = parameter.RayParams.__init__, node.Node.start_api_server

    def lean(self, *args, **kwargs):
        original_params(self, *args, **kwargs)
        self.no_monitor = True
        self.include_log_monitor = False

    def no_api_server(self, **_):
        self._webui_url = None  # as where the dashboard cannot start (Ray's minimal install)

    parameter.RayParams.__init__, node.Node.start_api_server = lean, no_api_server
    try:
        yield
    finally:
        parameter.RayParams.__init__, node.Node.start_api_server = original_params, original_api
