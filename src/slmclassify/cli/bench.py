"""`slmclassify bench`, `sweep` and `loadtest`: the measuring commands (the figures come from
`slmclassify.bench`; the tables and the JSON line are printed here).

Each command's options arrive as one frozen bundle (`BenchOptions`, `SweepOptions`,
`LoadtestOptions`); bench's holds its task and model options as a `ModelOptions` (bench has its own
help for them: its defaults are the article's), sweep takes the shared `task_options`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from ..core.task import Task
from ..jobs.sources import read_task
from ..errors import TaskError
from ..io.formats import check_writes
from .options import (ModelOptions, bundle, device_options, int_list, max_rows_option, model_option, task_options,
                      token_budget_option)
from . import startup


def bench_texts(input_path, text_column, n):
    """The user's file (first n rows) or the article's synthetic tickets."""
    from ..io import read_table, texts_of
    from ..core.article_tickets import article_tickets

    if input_path is None:
        return article_tickets(n)
    texts = texts_of(read_table(input_path, text_column), text_column)
    return [t for t in texts if t.strip()][:n]


def bench_task(opts: ModelOptions) -> Task:
    """The task of the options, else the article's."""
    from ..core.article_tickets import ARTICLE_TASK

    return opts.task() if opts.has_task else ARTICLE_TASK


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """What bench measures on, and which other engines it runs."""

    n_items: int
    input_path: str | None
    """The user's file (None: the article's tickets)."""
    text_column: str
    json_path: str | None
    with_llama_cpp: bool
    with_ctranslate2: bool
    opts: ModelOptions
    """The task (default: the article's) and how the model runs."""
    rows: frozenset[str] | None = None
    """The rows besides (a)-(d) (`compare.ROW_GROUPS`; None: all)."""

    def __post_init__(self) -> None:
        if self.n_items < 1:
            raise TaskError(f"--n must be positive, got {self.n_items}")

    @classmethod
    def from_flags(cls, *, n_items, input_path, text_column, json_path, with_llama_cpp, with_ctranslate2,
                   rows=None, **model_flags) -> BenchOptions:
        from ..bench.compare import parse_rows

        return cls(n_items, input_path, text_column, json_path, with_llama_cpp, with_ctranslate2,
                   ModelOptions(**model_flags), parse_rows(rows))


bench_options = bundle("run", BenchOptions.from_flags, [
    click.option("--n", "n_items", type=int, default=600, show_default=True, help="Number of items."),
    click.option("--input", "input_path", help="Benchmark on your own file instead of the article's tickets."),
    click.option("--text-column", default="text", show_default=True),
    click.option("--json", "json_path", help="Also save the JSON summary to this file."),
    click.option("--task", "task_file", type=click.Path(dir_okay=False),
                 help="TOML task file (default: the article's)."),
    click.option("--labels", help="Labels (default: the article's billing,technical,account)."),
    click.option("--instruction"),
    click.option("--system"),
    click.option("--user-template"),
    model_option(),
    token_budget_option(),
    max_rows_option(),
    click.option("--llama-cpp/--no-llama-cpp", "with_llama_cpp", default=True, show_default=True,
                 help="Run (f), llama.cpp on the GGUF, when llama-cpp-python is installed."),
    click.option("--ctranslate2/--no-ctranslate2", "with_ctranslate2", default=True, show_default=True,
                 help="Run (i), CTranslate2 in fp32 and int8, when ctranslate2 is installed (CPU)."),
    click.option("--rows", metavar="LETTERS", help="Only these rows besides (a)-(d), e.g. --rows e,g (e ablations, k "
                 "vendor GEMM, g other precisions, m multi-label, q questions, s structured, i CTranslate2, "
                 "t plain transformers, f llama.cpp), or none; default: all."),
    *reversed(device_options()),  # bench's help lists --precision before --device
])


@click.command()
@bench_options
def bench(run: BenchOptions):
    """Reproduce the article's experiment next to ours, in one process: speed, padding, agreement.

    Every configuration scores first tokens (the article's method), so predictions are comparable.
    """
    from ..bench.compare import bench_settings, dump_json, run_bench
    from ..models.loading import embedded_gguf_path
    from ..models.prepare import load_model

    opts, model = run.opts, run.opts.model
    check_writes({"--input": run.input_path, "--task": opts.task_file, "--model": model}, {"--json": run.json_path})
    task = bench_task(opts).with_overrides(mode="first")
    settings = opts.settings()
    texts = bench_texts(run.input_path, run.text_column, run.n_items)
    loaded = load_model(model, settings.device, settings.precision, task=task,
                        sample=texts if run.input_path else None, settings=bench_settings(settings))
    gguf = str(embedded_gguf_path()) if model is None else (model if str(model).endswith(".gguf") else None)
    gguf = gguf if run.with_llama_cpp else None
    report = run_bench(loaded, texts, task, settings, gguf_path=gguf, log=lambda m: click.echo(m, err=True),
                       with_ctranslate2=run.with_ctranslate2, rows=run.rows)
    click.echo(f"model: {loaded.name}; {report.machine['cpu']}, {report.machine['threads']} threads, "
               f"torch {report.machine['torch']}, transformers {report.machine['transformers']}")
    click.echo(f"engine: {report.engine}")
    click.echo(f"{'float32' if loaded.backend.device.type == 'cpu' else 'bf16'} matmul rate on the model's shapes "
               f"(roofline basis): {report.matmul_gflops:.1f} GFLOP/s")
    click.echo(report.table())
    line = dump_json(report)
    if run.json_path:
        Path(run.json_path).write_text(line + "\n")
    click.echo(line)


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    """What sweep measures on and varies, and where it writes (the lists as typed)."""

    input_path: str | None
    """The user's file (None: the article's tickets)."""
    text_column: str
    n_items: int
    budgets: str
    row_caps: str
    plot_path: str
    save: bool
    save_to_task: bool
    windows: str
    """classify's --window sizes to compare ('' : none)."""

    def budget_list(self) -> list[int]:
        return int_list(self.budgets, "--budgets")

    def rows_list(self) -> list[int]:
        return int_list(self.row_caps, "--row-caps")

    def window_list(self) -> list[int]:
        """The window sizes ([] when --windows is empty)."""
        return int_list(self.windows, "--windows") if self.windows.strip() else []


sweep_options = bundle("run", SweepOptions, [
    click.argument("input_path", metavar="[INPUT]", required=False),
    click.option("--text-column", default="text", show_default=True),
    click.option("--n", "n_items", type=int, default=200, show_default=True, help="Items to run per setting."),
    click.option("--budgets", default="512,1024,2048,4096,8192", show_default=True, help="Token budgets to try."),
    click.option("--row-caps", default="32,128", show_default=True, help="Row caps to try."),
    click.option("--plot", "plot_path", default="sweep.png", show_default=True, help="PNG of throughput and padding."),
    click.option("--save", is_flag=True, help="Save the best setting as your default (user config file)."),
    click.option("--save-to-task", is_flag=True, help="Write the best setting into the --task file instead."),
    click.option("--windows", default="128,1024", show_default=True,
                 help="classify's --window sizes to compare (rows sorted and batched together); '' to skip."),
])


@click.command()
@sweep_options
@task_options
def sweep(run: SweepOptions, opts: ModelOptions):
    """Measure throughput and padding over token budgets and row caps on INPUT (default: the article's tickets).

    --max-tokens and --calibrate apply to every setting; the budget and row cap are what it varies
    (--budgets, --row-caps), so --token-budget and --max-rows are refused.
    """
    from ..bench import sweep as sweeping
    from ..core.settings import EngineSettings
    from ..models.prepare import load_model
    from ..io.saved_settings import save_settings
    from ..io.task_files import write_task_settings

    for option, value, instead in (("--token-budget", opts.token_budget, "--budgets"),
                                   ("--max-rows", opts.max_rows, "--row-caps")):
        if value is not None:
            raise TaskError(f"sweep varies {option} itself: list the values to try with {instead} "
                            f"(e.g. {instead} {value})")
    budget_list = run.budget_list()
    rows_list = run.rows_list()
    task = (opts.task() if opts.has_task
            else bench_task(ModelOptions()).with_overrides(calibrate=opts.calibrate))
    if run.save_to_task and not opts.task_file:
        raise TaskError("--save-to-task needs --task FILE")
    settings = opts.settings(scheduling=False)
    texts = bench_texts(run.input_path, run.text_column, run.n_items)
    sample = texts if run.input_path else None
    # --precision auto: decided here, for both sweeps, as `run_sweep` scores (default batching, the item cap)
    loaded = load_model(opts.model, settings.device, settings.precision, task=task, sample=sample,
                        settings=EngineSettings(max_text_tokens=settings.max_text_tokens))
    points = sweeping.run_sweep(loaded, task, texts, budget_list, rows_list,
                                max_text_tokens=settings.max_text_tokens, log=lambda m: click.echo(m, err=True))
    top = sweeping.best(points)
    # The measurements first: a failing plot must not lose them.
    _print_points(points, top)
    if windows := run.window_list():
        best_settings = dataclasses.replace(settings, token_budget=top.token_budget, max_rows=top.max_rows)
        _print_windows(sweeping.run_window_sweep(loaded, task, texts, windows, best_settings))
    if run.save:
        click.echo(f"saved as default in {save_settings(token_budget=top.token_budget, max_rows=top.max_rows)}")
    if run.save_to_task:
        write_task_settings(opts.task_file, token_budget=top.token_budget, max_rows=top.max_rows)
        click.echo(f"saved into {opts.task_file}")
    sweeping.plot(points, run.plot_path)
    click.echo(f"plot: {run.plot_path}")


def _print_points(points, top) -> None:
    """sweep's table of (budget, row cap) settings and the best one; the only place its figures are shown."""
    click.echo(f"{'budget':>8} {'rows':>5} {'items/s':>8} {'padding%':>9} {'peak RSS MB':>12}")
    for p in points:
        click.echo(f"{p.token_budget:>8} {p.max_rows:>5} {p.items_per_s:>8.2f} {100 * p.padding:>9.1f} "
                   f"{p.peak_rss_mb:>12.0f}")
    click.echo(f"best: --token-budget {top.token_budget} --max-rows {top.max_rows} ({top.items_per_s:.2f} items/s)")


def _print_windows(window_points) -> None:
    """sweep's table of --window sizes."""
    click.echo(f"{'window':>8} {'items/s':>8} {'padding%':>9} {'reused':>7} {'peak RSS MB':>12}")
    for w in window_points:
        click.echo(f"{w.window:>8} {w.items_per_s:>8.2f} {100 * w.padding:>9.1f} {w.reused:>7} {w.peak_rss_mb:>12.0f}")


@dataclasses.dataclass(frozen=True)
class LoadtestOptions:
    """Which server loadtest sends to, how hard and for how long, and what it checks and writes."""

    url: str
    concurrency: int
    duration: float
    max_requests: int | None
    input_path: str | None
    """File of texts (None: the article's 600 tickets)."""
    text_column: str
    task_name: str | None
    """Task name on the server (None: its only task)."""
    check_task: str | None
    """The task file the server uses: every response is checked against offline results."""
    model: str | None
    api_key: str | None
    json_path: str | None

    def texts(self) -> list[str]:
        """All the file's texts, else the article's 600 tickets."""
        if self.input_path:
            return bench_texts(self.input_path, self.text_column, 1 << 30)
        return bench_texts(None, None, 600)


loadtest_options = bundle("run", LoadtestOptions, [
    click.argument("url", default="http://127.0.0.1:8080"),
    click.option("--concurrency", type=int, default=32, show_default=True, help="Concurrent clients."),
    click.option("--duration", type=float, default=30.0, show_default=True, help="Seconds to run (at most 600)."),
    click.option("--requests", "max_requests", type=int, help="Stop after this many requests."),
    click.option("--input", "input_path", help="File of texts (default: the article's 600 tickets)."),
    click.option("--text-column", default="text", show_default=True),
    click.option("--task", "task_name", help="Task name on the server (default: its only task)."),
    click.option("--check", "check_task", type=click.Path(dir_okay=False),
                 help="Task file the server uses: check every response against offline classify results."),
    click.option("--model", help="Model for --check (the one the server uses)."),
    click.option("--api-key", envvar="SLMCLASSIFY_API_KEY"),
    click.option("--json", "json_path", help="Also save the JSON line to this file."),
])


@click.command()
@loadtest_options
def loadtest(run: LoadtestOptions):
    """Send single texts from N concurrent clients to a local `slmclassify serve` (loopback only)
    and print throughput, p50/p95/p99 latency and errors."""
    from ..bench.service_load import offline_expected, report_lines, run_load, server_info

    startup.need_serve_extra()
    info = server_info(run.url, run.api_key)
    names = [t["name"] for t in info["tasks"]]
    task_name = run.task_name
    if task_name is None:
        if len(names) != 1:
            raise TaskError(f"the server has tasks {names}; pick one with --task")
        task_name = names[0]
    elif task_name not in names:
        raise TaskError(f"the server has no task {task_name!r}; tasks are {names}")
    texts = run.texts()
    expected = None
    if run.check_task:
        expected, offline_rate = offline_expected(texts, read_task(run.check_task), run.model,
                                                  info["limits"].get("max_text_tokens"))
        click.echo(f"offline classify: {len(texts)} texts at {offline_rate:.2f} items/s", err=True)
    report = run_load(run.url, task_name, texts, concurrency=run.concurrency, duration=run.duration,
                      max_requests=run.max_requests, api_key=run.api_key, expected=expected, tolerance=1e-4)
    lines = report_lines([report])
    click.echo("\n".join(lines))
    if run.json_path:
        Path(run.json_path).write_text(lines[-1] + "\n")
