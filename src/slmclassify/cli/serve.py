"""`slmclassify serve`: the tasks over HTTP. Its options arrive as one frozen `ServeOptions`, which
builds the tasks, the service's `ServeSettings` and the engine settings."""

from __future__ import annotations

import dataclasses

import click

from ..core.task import Task
from ..jobs.sources import named_tasks
from ..errors import TaskError
from .options import (ModelOptions, bundle, hidden_alias, max_rows_option, max_tokens_option, merged,
                      model_option, served_model_name_option, token_budget_option)
from . import startup


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """serve's options, as typed (None: not given; old flag names kept apart until `engine`)."""

    task_specs: tuple[str, ...]
    """`NAME=FILE.toml` per task."""
    model: str | None
    host: str
    port: int
    max_wait_ms: float | None
    token_budget: int | None
    max_rows: int | None
    old_max_rows: int | None
    max_tokens: str | None
    old_max_tokens: str | None
    max_texts: int
    max_body_bytes: int
    max_queue: int
    request_timeout: float
    prefix_cache_mb: float
    api_key: str | None
    insecure: bool
    served_model_names: tuple[str, ...] = ()

    @property
    def open_beyond_loopback(self) -> bool:
        """Whether anyone who reaches the port may use the service: no key, and a host beyond this machine."""
        return not self.api_key and not loopback(self.host)

    def tasks(self) -> dict[str, Task]:
        """`--task NAME=FILE.toml` options → {name: Task}."""
        return named_tasks(self.task_specs)

    def settings(self):
        """The service's `ServeSettings`."""
        from ..serve import ServeSettings
        from ..serve.settings import DEFAULT_MAX_WAIT_MS

        return ServeSettings(
            max_wait_ms=DEFAULT_MAX_WAIT_MS if self.max_wait_ms is None else self.max_wait_ms,
            max_texts=self.max_texts, max_body_bytes=self.max_body_bytes, max_queue_items=self.max_queue,
            request_timeout_s=self.request_timeout, prefix_cache_mb=self.prefix_cache_mb,
            api_key=self.api_key or None, served_model_names=self.served_model_names)

    def engine(self):
        """The engine settings, under classify's flags (the old names merged in)."""
        return ModelOptions(token_budget=self.token_budget,
                            max_rows=merged(self.max_rows, self.old_max_rows, "--max-rows", "--max-batch-rows"),
                            max_tokens=merged(self.max_tokens, self.old_max_tokens, "--max-tokens",
                                              "--max-text-tokens")).settings()


serve_options = bundle("run", ServeOptions, [
    click.option("--task", "task_specs", multiple=True, metavar="NAME=FILE",
                 help="A task to serve under NAME, from a TOML task file (repeat for several). Without one, "
                      "the service answers chat completions with choices only."),
    model_option(),
    served_model_name_option(),
    click.option("--host", default="127.0.0.1", show_default=True),
    click.option("--port", type=int, default=8080, show_default=True, help="0 picks a free port (logged)."),
    click.option("--max-wait-ms", type=float, default=None, help="Longest the idle engine waits for requests to join "
                 "a batch; less once arrivals pause for a quarter of it [default: 50]."),
    token_budget_option("Max rows × padded tokens per engine batch."),
    max_rows_option("Max rows per engine batch (1 turns batching off)."),
    hidden_alias("--max-batch-rows", "old_max_rows", type=int),
    max_tokens_option("Cut longer texts to N tokens (status truncated; default 512; none: only at the model's "
                      "context)."),
    hidden_alias("--max-text-tokens", "old_max_tokens"),
    click.option("--max-texts", type=int, default=64, show_default=True, help="Most texts per request (413)."),
    click.option("--max-body-bytes", type=int, default=1 << 20, show_default=True, help="Largest request body (413)."),
    click.option("--max-queue", type=int, default=1024, show_default=True,
                 help="Most texts waiting for the model (503 with Retry-After beyond)."),
    click.option("--request-timeout", type=float, default=30.0, show_default=True, help="Seconds before 504."),
    click.option("--prefix-cache-mb", type=float, default=256.0, show_default=True,
                 help="Memory for the cached prefixes of chat requests (their shared system turn and earlier "
                      "turns); the least recently used are dropped beyond it."),
    click.option("--api-key", envvar="SLMCLASSIFY_API_KEY", help="Require 'Authorization: Bearer KEY' "
                 "(also from $SLMCLASSIFY_API_KEY); /healthz stays open. Needed off loopback unless --insecure."),
    click.option("--insecure", is_flag=True, help="Serve on a non-loopback --host without --api-key (anyone who "
                 "reaches the port can use the model and see its path)."),
])


@click.command()
@serve_options
def serve(run: ServeOptions):
    """Serve tasks, and chat completions with choices, over HTTP, batching concurrent requests by length
    (needs the 'serve' extra)."""
    if run.open_beyond_loopback:
        if not run.insecure:
            raise TaskError(f"--host {run.host} listens beyond this machine, and without --api-key anyone who "
                            "reaches the port can use the model and read its file path (/v1/tasks); set --api-key "
                            "(or $SLMCLASSIFY_API_KEY), or pass --insecure to serve it openly")
        click.echo(f"slmclassify: warning: serving on {run.host} without --api-key (--insecure): anyone who reaches "
                   "the port can use the model and read its file path", err=True)
    startup.need_serve_extra()
    tasks = run.tasks()
    settings = run.settings()
    engine = run.engine()
    from ..serve.server import bind, build_service, serve as run_server

    bind(run.host, run.port).close()  # a taken port fails now, not after the model has loaded
    run_server(build_service(tasks, run.model, engine, settings), run.host, run.port)


def loopback(host: str) -> bool:
    """Whether --host only listens on this machine (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


@click.command()
@model_option()
@click.option("-o", "--output", required=True, metavar="FOLDER",
              help="Where to write the tokenizer files (created if missing).")
def tokenizer(model: str | None, output: str):
    """Write the model's tokenizer (with its chat template) to a folder, for clients that tokenize
    themselves (lm-eval's tokenizer=FOLDER, transformers' AutoTokenizer); the service also answers
    /tokenize and /tokenizer_info."""
    from ..models.loading import write_tokenizer

    folder, name = write_tokenizer(model, output)
    click.echo(f"wrote the tokenizer of {name} to {folder}", err=True)
    click.echo(str(folder))
