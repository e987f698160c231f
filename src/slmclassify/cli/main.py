"""The `slmclassify` commands. Library errors become one-line messages and exit code 2; an error
about a library field names the flag that set it (`options.flag_of`)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import click

from ..errors import SlmClassifyError, TaskError, VerificationError
from ..core.task import Task
from ..jobs.sources import read_task
from ..io.formats import check_writes
from . import summaries
from .options import (ModelOptions, device_options, flag_error, head_options, hidden_alias, int_list, max_rows_option,
                      max_tokens_option, merged, model_option, ray_options, task_and_head, task_options,
                      token_budget_option)


def main() -> None:
    """Console-script entry point."""
    from ..interrupts import NOTHING_WRITTEN, Interrupted, handle_sigterm, terminate_as_interrupt

    handle_sigterm()
    try:
        cli.main(standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo(NOTHING_WRITTEN, err=True)
        sys.exit(143 if terminate_as_interrupt.received else 130)
    except Interrupted as exc:
        click.echo(f"slmclassify: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2)
    except VerificationError as exc:
        click.echo(f"slmclassify: {exc}", err=True)
        sys.exit(1)
    except SlmClassifyError as exc:
        click.echo(f"slmclassify: error: {exc}", err=True)
        sys.exit(2)


class _Commands(click.Group):
    """The command group: a library error that names fields is re-raised naming the flags instead."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except SlmClassifyError as exc:
            if exc.template is None:
                raise
            raise flag_error(exc) from None


@click.group(cls=_Commands)
@click.version_option(package_name="slmclassify")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Label texts with a small local language model: constrained scoring, a prefix KV cache
    and length-bucketed batching, checked against the per-item path."""
    if ctx.invoked_subcommand != "classify":  # classify starts torch itself unless it runs on Ray
        _start_torch()


def _start_torch() -> None:
    """Import torch and set its threads, once per process, before anything heavy."""
    from ..interrupts import exit_at_once_while_starting

    with exit_at_once_while_starting():  # torch's start-up cannot be interrupted by an exception
        from ..models import loading

        loading.set_threads()  # once per process, from its CPU affinity; the library never does


def _classify_on_ray(input_path, output_path, task, settings, model, text_column, result_prefix, errors, quiet,
                     unsupported, ray_address, actors, cpus_per_actor, block_rows):
    try:
        from ..ray import DEFAULT_BLOCK_ROWS, RaySettings
        from ..jobs.ray_classify import run_ray_classify
    except ImportError as exc:
        raise TaskError(f"--ray needs Ray: pip install 'slmclassify[ray]' ({exc})") from None
    if unsupported:
        raise TaskError("--ray does not support --resume, --restart or --gold-column")
    rs = RaySettings(actors=2 if actors is None else actors, cpus_per_actor=cpus_per_actor,
                     block_rows=DEFAULT_BLOCK_ROWS if block_rows is None else block_rows)
    from .progress import Progress

    summary = run_ray_classify(input_path, output_path, task, settings, rs, model=model, address=ray_address,
                               text_column=text_column, result_prefix=result_prefix, errors=errors,
                               progress=not quiet, meter=lambda rows, size, done: Progress(rows, size, not quiet))
    summaries.print_ray(summary)


@cli.command()
@click.argument("input_path", metavar="INPUT")
@click.option("-o", "--output", "output_path", required=True, help="Output file (.csv/.jsonl/.parquet, or - for stdout).")
@click.option("--text-column", default="text", show_default=True)
@click.option("--id-column", help="Column of row ids (kept; named in errors).")
@click.option("--format", "fmt", type=click.Choice(["csv", "jsonl", "parquet"]), help="Format for - (stdin/stdout).")
@click.option("--errors", type=click.Choice(["strict", "replace"]), default="strict", show_default=True,
              help="Invalid UTF-8: stop with an error naming the row, or replace the bytes.")
@click.option("--probes", type=int, default=8, show_default=True, help="Items checked against the per-item path.")
@click.option("--no-verify", is_flag=True, help="Skip the probe check.")
@click.option("--gold-column", help="Column of true labels: report accuracy.")
@click.option("--result-prefix", default="", help="Prefix for the added columns (e.g. pred_).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--resume", is_flag=True, help="Continue the unfinished run kept in OUTPUT.partial.")
@click.option("--restart", is_flag=True, help="Discard an unfinished run (OUTPUT.partial) and start over.")
@click.option("--window", type=int, help="Rows read, sorted and batched at a time; also the resume step "
              "(default 1024).")
@ray_options
@head_options
@task_options
def classify(input_path, output_path, text_column, id_column, fmt, errors, probes, no_verify, gold_column,
             result_prefix, quiet, resume, restart, window, use_ray, ray_address, actors, cpus_per_actor, block_rows,
             head_path, scorer, opts: ModelOptions):
    """Classify every row of INPUT (CSV, JSONL, Parquet or - for stdin) into OUTPUT, streaming."""
    on_ray = bool(use_ray or ray_address or actors is not None)
    if not on_ray:  # the --ray driver never imports torch (2.5 s before ray.init); its actors do
        _start_torch()
    if resume and restart:
        raise TaskError("--resume and --restart exclude each other")
    # (the input itself, and the run's partial and records beside -o, are checked by the job)
    check_writes({"--task": opts.task_file, "--head": head_path, "--model": opts.model}, {"-o": output_path})
    task, head = task_and_head(head_path, scorer, opts)
    settings = opts.settings(window=window)
    if on_ray:
        if head.used:
            raise TaskError("--ray does not apply a head yet; run without --ray, or with --scorer zero-shot")
        return _classify_on_ray(input_path, output_path, task, settings, opts.model, text_column, result_prefix,
                                errors, quiet, resume or restart or gold_column, ray_address, actors,
                                cpus_per_actor, block_rows)
    from ..jobs.classify import ClassifyRequest, run_classify

    request = ClassifyRequest(input_path, output_path, text_column=text_column, id_column=id_column, fmt=fmt,
                              errors=errors, probes=0 if no_verify else probes, gold_column=gold_column,
                              result_prefix=result_prefix, resume=resume, restart=restart)
    from .progress import Progress

    summary = run_classify(request, task, settings, model=opts.model, head=head,
                           on_loaded=lambda classifier: summaries.print_loaded(classifier, head),
                           meter=lambda rows, size, done: Progress(rows, size, enabled=not quiet, done=done))
    summaries.print_classify(summary)
    report = summary.report
    if report is not None and not report.ok:
        raise VerificationError(f"the output was written, but {report.summary()}; "
                                f"disagreeing rows {list(report.disagreements)}")


@cli.command()
@click.argument("input_path", metavar="INPUT")
@click.option("--text-column", default="text", show_default=True)
@click.option("--format", "fmt", type=click.Choice(["csv", "jsonl", "parquet"]), help="Format for - (stdin).")
@click.option("--errors", type=click.Choice(["strict", "replace"]), default="strict", show_default=True)
@click.option("--probes", type=int, help="Probe items, spread over the length range (e.g. --precision int8 "
              "--probes 200)  [default: 16]")
@hidden_alias("--n", "old_probes", type=int)
@click.option("--tolerance", type=float, default=1e-3, show_default=True, help="Max allowed |Δ log-prob|.")
@task_options
def verify(input_path, text_column, fmt, errors, probes, old_probes, tolerance, opts: ModelOptions):
    """Run probe items of INPUT through the fast and the per-item path and compare them."""
    from ..jobs.verify import verify_table

    probes = merged(probes, old_probes, "--probes", "--n")
    summary = verify_table(input_path, opts.task(), opts.settings(), model=opts.model, text_column=text_column,
                           fmt=fmt, errors=errors, probes=16 if probes is None else probes, tolerance=tolerance)
    summaries.print_verify(summary)
    report = summary.report
    if not report.ok:
        raise VerificationError(f"verification failed: {report.summary()}; disagreeing rows {list(report.disagreements)}")



def _bench_texts(input_path, text_column, n):
    """The user's file (first n rows) or the article's synthetic tickets."""
    from ..io import read_table, texts_of
    from ..core.article_tickets import article_tickets

    if input_path is None:
        return article_tickets(n)
    texts = texts_of(read_table(input_path, text_column), text_column)
    return [t for t in texts if t.strip()][:n]


def _bench_task(opts: ModelOptions) -> Task:
    """The task of the options, else the article's."""
    from ..core.article_tickets import ARTICLE_TASK

    return opts.task() if opts.has_task else ARTICLE_TASK


@cli.command()
@click.option("--n", "n_items", type=int, default=600, show_default=True, help="Number of items.")
@click.option("--input", "input_path", help="Benchmark on your own file instead of the article's tickets.")
@click.option("--text-column", default="text", show_default=True)
@click.option("--json", "json_path", help="Also save the JSON summary to this file.")
@click.option("--task", "task_file", type=click.Path(dir_okay=False), help="TOML task file (default: the article's).")
@click.option("--labels", help="Labels (default: the article's billing,technical,account).")
@click.option("--instruction")
@click.option("--system")
@click.option("--user-template")
@model_option()
@token_budget_option()
@max_rows_option()
@click.option("--llama-cpp/--no-llama-cpp", "with_llama_cpp", default=True, show_default=True,
              help="Run (f), llama.cpp on the GGUF, when llama-cpp-python is installed.")
@click.option("--ctranslate2/--no-ctranslate2", "with_ctranslate2", default=True, show_default=True,
              help="Run (i), CTranslate2 in fp32 and int8, when ctranslate2 is installed (CPU).")
@device_options()[1]
@device_options()[0]
def bench(n_items, input_path, text_column, json_path, task_file, labels, instruction, system, user_template,
          model, token_budget, max_rows, with_llama_cpp, with_ctranslate2, device, precision):
    """Reproduce the article's experiment next to ours, in one process: speed, padding, agreement.

    Every configuration scores first tokens (the article's method), so predictions are comparable.
    """
    from ..bench.compare import bench_settings, dump_json, run_bench
    from ..models.loading import embedded_gguf_path
    from ..models.prepare import load_model

    if n_items < 1:
        raise TaskError(f"--n must be positive, got {n_items}")
    check_writes({"--input": input_path, "--task": task_file, "--model": model}, {"--json": json_path})
    opts = ModelOptions(task_file=task_file, labels=labels, instruction=instruction, system=system,
                        user_template=user_template, model=model, token_budget=token_budget, max_rows=max_rows,
                        device=device, precision=precision)
    task = _bench_task(opts).with_overrides(mode="first")
    settings = opts.settings()
    texts = _bench_texts(input_path, text_column, n_items)
    loaded = load_model(model, settings.device, settings.precision, task=task, sample=texts if input_path else None,
                        settings=bench_settings(settings))
    gguf = str(embedded_gguf_path()) if model is None else (model if str(model).endswith(".gguf") else None)
    gguf = gguf if with_llama_cpp else None
    report = run_bench(loaded, texts, task, settings, gguf_path=gguf, log=lambda m: click.echo(m, err=True),
                       with_ctranslate2=with_ctranslate2)
    click.echo(f"model: {loaded.name}; {report.machine['cpu']}, {report.machine['threads']} threads, "
               f"torch {report.machine['torch']}, transformers {report.machine['transformers']}")
    click.echo(f"engine: {report.engine}")
    click.echo(f"{'float32' if loaded.backend.device.type == 'cpu' else 'bf16'} matmul rate on the model's shapes "
               f"(roofline basis): {report.matmul_gflops:.1f} GFLOP/s")
    click.echo(report.table())
    line = dump_json(report)
    if json_path:
        Path(json_path).write_text(line + "\n")
    click.echo(line)


@cli.command()
@click.argument("input_path", metavar="[INPUT]", required=False)
@click.option("--text-column", default="text", show_default=True)
@click.option("--n", "n_items", type=int, default=200, show_default=True, help="Items to run per setting.")
@click.option("--budgets", default="512,1024,2048,4096,8192", show_default=True, help="Token budgets to try.")
@click.option("--row-caps", default="32,128", show_default=True, help="Row caps to try.")
@click.option("--plot", "plot_path", default="sweep.png", show_default=True, help="PNG of throughput and padding.")
@click.option("--save", is_flag=True, help="Save the best setting as your default (user config file).")
@click.option("--save-to-task", is_flag=True, help="Write the best setting into the --task file instead.")
@click.option("--windows", default="128,1024", show_default=True,
              help="classify's --window sizes to compare (rows sorted and batched together); '' to skip.")
@task_options
def sweep(input_path, text_column, n_items, budgets, row_caps, plot_path, save, save_to_task, windows,
          opts: ModelOptions):
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
    budget_list = int_list(budgets, "--budgets")
    rows_list = int_list(row_caps, "--row-caps")
    task = (opts.task() if opts.has_task
            else _bench_task(ModelOptions()).with_overrides(calibrate=opts.calibrate))
    if save_to_task and not opts.task_file:
        raise TaskError("--save-to-task needs --task FILE")
    settings = opts.settings(scheduling=False)
    texts = _bench_texts(input_path, text_column, n_items)
    # --precision auto: decided here, for both sweeps, as `run_sweep` scores (default batching, the item cap)
    loaded = load_model(opts.model, settings.device, settings.precision, task=task,
                        sample=texts if input_path else None,
                        settings=EngineSettings(max_text_tokens=settings.max_text_tokens))
    points = sweeping.run_sweep(loaded, task, texts, budget_list, rows_list,
                                max_text_tokens=settings.max_text_tokens, log=lambda m: click.echo(m, err=True))
    top = sweeping.best(points)
    # The measurements first: a failing plot must not lose them.
    click.echo(f"{'budget':>8} {'rows':>5} {'items/s':>8} {'padding%':>9} {'peak RSS MB':>12}")
    for p in points:
        click.echo(f"{p.token_budget:>8} {p.max_rows:>5} {p.items_per_s:>8.2f} {100 * p.padding:>9.1f} "
                   f"{p.peak_rss_mb:>12.0f}")
    click.echo(f"best: --token-budget {top.token_budget} --max-rows {top.max_rows} ({top.items_per_s:.2f} items/s)")
    if windows.strip():
        best_settings = dataclasses.replace(settings, token_budget=top.token_budget, max_rows=top.max_rows)
        window_points = sweeping.run_window_sweep(loaded, task, texts, int_list(windows, "--windows"),
                                                  best_settings, log=lambda m: click.echo(m, err=True))
        click.echo(f"{'window':>8} {'items/s':>8} {'padding%':>9} {'reused':>7} {'peak RSS MB':>12}")
        for w in window_points:
            click.echo(f"{w.window:>8} {w.items_per_s:>8.2f} {100 * w.padding:>9.1f} {w.reused:>7} {w.peak_rss_mb:>12.0f}")
    if save:
        click.echo(f"saved as default in {save_settings(token_budget=top.token_budget, max_rows=top.max_rows)}")
    if save_to_task:
        write_task_settings(opts.task_file, token_budget=top.token_budget, max_rows=top.max_rows)
        click.echo(f"saved into {opts.task_file}")
    sweeping.plot(points, plot_path)
    click.echo(f"plot: {plot_path}")


@cli.command()
@click.argument("input_path", metavar="LABELLED_FILE")
@click.option("--text-column", default="text", show_default=True)
@click.option("--gold-column", help="Column of gold labels (tables; default: label).")
@hidden_alias("--label-column", "old_gold_column")
@click.option("--compare-modes", is_flag=True, help="Also report every scoring mode, with and without calibration.")
@click.option("--fit-temperature", is_flag=True, help="Fit temperature scaling on these items.")
@click.option("--target-accuracy", type=float, help="Print the confidence threshold that reaches this accuracy.")
@click.option("--target-precision", type=float, help="Multi-label: pick each label's threshold as the lowest whose "
                                                     "precision reaches this (default: F1-optimal).")
@click.option("--write-task", is_flag=True, help="Write min_confidence (and temperature; multi-label: the thresholds) "
                                                 "into the --task file.")
@click.option("--fewshot-cost", type=int, default=0, help="Also time 0 vs N examples per label in the prefix.")
@click.option("--plots", "plots_dir", help="Folder for confusion.png, reliability.png and coverage.png.")
@click.option("--json", "json_path", help="Write the summary as JSON.")
@click.option("--n", "n_items", type=int, help="Only the first N items.")
@hidden_alias("--limit", "old_n_items", type=int)
@head_options
@task_options
def evaluate(input_path, text_column, gold_column, old_gold_column, compare_modes, fit_temperature, target_accuracy,
             target_precision, write_task, fewshot_cost, plots_dir, json_path, n_items, old_n_items, head_path, scorer,
             opts: ModelOptions):
    """Score a labelled file (CSV/JSONL/Parquet, or a BIG-bench task JSON) and report accuracy,
    macro-F1, calibration and the review threshold."""
    from ..jobs.evaluate import evaluate_file, task_for_file

    label_column = merged(gold_column, old_gold_column, "--gold-column", "--label-column") or "label"
    limit = merged(n_items, old_n_items, "--n", "--limit")

    if target_accuracy is not None and not 0 < target_accuracy <= 1:
        raise TaskError(f"--target-accuracy must be in (0, 1], got {target_accuracy}")
    if write_task and not opts.task_file:
        raise TaskError("--write-task needs --task FILE")
    plots = {f"--plots {name}": str(Path(plots_dir) / name) for name in ("confusion.png", "reliability.png",
                                                                         "coverage.png")} if plots_dir else {}
    # --write-task writes into the task file on purpose; nothing else may be written over an input
    check_writes({"the input": input_path, "--task": opts.task_file, "--head": head_path, "--model": opts.model},
                 {"--json": json_path, **plots})
    if head_path or opts.task_file or scorer:
        head_task, choice = task_and_head(head_path, scorer, opts)
    else:
        from ..head.apply import HeadChoice

        head_task, choice = None, HeadChoice()
    task = head_task if choice.head is not None else task_for_file(
        input_path, text_column, label_column, task_file=opts.task_file, labels=opts.label_names(), limit=limit,
        **opts.overrides())
    if target_precision is not None and not (task.multi_label and 0 < target_precision <= 1):
        raise TaskError("--target-precision picks a multi-label task's thresholds: it needs --multi-label (or "
                        f"multi_label = true) and a value in (0, 1], got {target_precision}")
    if task.multi_label:
        from ..jobs.evaluate import evaluate_multilabel_file

        given = [flag for flag, value in (("--compare-modes", compare_modes), ("--fit-temperature", fit_temperature),
                                          ("--target-accuracy", target_accuracy), ("--fewshot-cost", fewshot_cost),
                                          ("--plots", plots_dir)) if value]
        if given:
            raise TaskError(f"{given[0]} is for single-label tasks; a multi-label evaluation reports F1, subset "
                            "accuracy and Hamming loss, and picks thresholds (--target-precision)")
        summaries.print_multilabel_evaluate(evaluate_multilabel_file(
            input_path, task, opts.settings(), text_column=text_column, label_column=label_column, model=opts.model,
            target_precision=target_precision, task_file=opts.task_file if write_task else None, json_path=json_path,
            limit=limit, head=choice))
        return
    summary = evaluate_file(
        input_path, task, opts.settings(), text_column=text_column, label_column=label_column, model=opts.model,
        compare_modes=compare_modes, fit_temperature=fit_temperature, target_accuracy=target_accuracy,
        task_file=opts.task_file if write_task else None, fewshot_cost=fewshot_cost, plots_dir=plots_dir,
        json_path=json_path, limit=limit, head=choice,
    )
    summaries.print_evaluate(summary)


def _named_tasks(specs) -> dict:
    """`--task NAME=FILE.toml` options → {name: Task}."""
    tasks = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise TaskError(f"--task must be NAME=FILE.toml, got {spec!r}")
        if name.strip() in tasks:
            raise TaskError(f"task name {name.strip()!r} is given twice")
        tasks[name.strip()] = read_task(path.strip())
    return tasks


@cli.command()
@click.option("--task", "task_specs", multiple=True, required=True, metavar="NAME=FILE",
              help="A task to serve under NAME, from a TOML task file (repeat for several).")
@click.option("--model", help="HF model id, local folder or .gguf file (default: embedded SmolLM2-135M).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8080, show_default=True, help="0 picks a free port (logged).")
@click.option("--max-wait-ms", type=float, default=None, help="Longest the idle engine waits for requests to join a batch; "
              "less once arrivals pause for a quarter of it [default: 50].")
@token_budget_option("Max rows × padded tokens per engine batch.")
@max_rows_option("Max rows per engine batch (1 turns batching off).")
@hidden_alias("--max-batch-rows", "old_max_rows", type=int)
@max_tokens_option("Cut longer texts to N tokens (status truncated; default 512; none: only at the model's context).")
@hidden_alias("--max-text-tokens", "old_max_tokens")
@click.option("--max-texts", type=int, default=64, show_default=True, help="Most texts per request (413).")
@click.option("--max-body-bytes", type=int, default=1 << 20, show_default=True, help="Largest request body (413).")
@click.option("--max-queue", type=int, default=1024, show_default=True,
              help="Most texts waiting for the model (503 with Retry-After beyond).")
@click.option("--request-timeout", type=float, default=30.0, show_default=True, help="Seconds before 504.")
@click.option("--api-key", envvar="SLMCLASSIFY_API_KEY", help="Require 'Authorization: Bearer KEY' "
              "(also from $SLMCLASSIFY_API_KEY); /healthz stays open. Needed off loopback unless --insecure.")
@click.option("--insecure", is_flag=True, help="Serve on a non-loopback --host without --api-key (anyone who "
              "reaches the port can use the model and see its path).")
def serve(task_specs, model, host, port, max_wait_ms, token_budget, max_rows, old_max_rows, max_tokens, old_max_tokens,
          max_texts, max_body_bytes, max_queue, request_timeout, api_key, insecure):
    """Serve tasks over HTTP, batching concurrent requests by length (needs the 'serve' extra)."""
    from ..serve import ServeSettings
    from ..serve.settings import DEFAULT_MAX_WAIT_MS

    if not api_key and not _loopback(host):
        if not insecure:
            raise TaskError(f"--host {host} listens beyond this machine, and without --api-key anyone who reaches "
                            "the port can use the model and read its file path (/v1/tasks); set --api-key (or "
                            "$SLMCLASSIFY_API_KEY), or pass --insecure to serve it openly")
        click.echo(f"slmclassify: warning: serving on {host} without --api-key (--insecure): anyone who reaches "
                   "the port can use the model and read its file path", err=True)
    _need_serve_extra()
    tasks = _named_tasks(task_specs)
    settings = ServeSettings(
        max_wait_ms=DEFAULT_MAX_WAIT_MS if max_wait_ms is None else max_wait_ms, max_texts=max_texts,
        max_body_bytes=max_body_bytes, max_queue_items=max_queue, request_timeout_s=request_timeout,
        api_key=api_key or None)
    engine = ModelOptions(token_budget=token_budget,
                          max_rows=merged(max_rows, old_max_rows, "--max-rows", "--max-batch-rows"),
                          max_tokens=merged(max_tokens, old_max_tokens, "--max-tokens", "--max-text-tokens")).settings()
    from ..serve.server import bind, build_service, serve as run_server

    bind(host, port).close()  # a taken port fails now, not after the model has loaded
    run_server(build_service(tasks, model, engine, settings), host, port)


@cli.command()
@click.argument("url", default="http://127.0.0.1:8080")
@click.option("--concurrency", type=int, default=32, show_default=True, help="Concurrent clients.")
@click.option("--duration", type=float, default=30.0, show_default=True, help="Seconds to run (at most 600).")
@click.option("--requests", "max_requests", type=int, help="Stop after this many requests.")
@click.option("--input", "input_path", help="File of texts (default: the article's 600 tickets).")
@click.option("--text-column", default="text", show_default=True)
@click.option("--task", "task_name", help="Task name on the server (default: its only task).")
@click.option("--check", "check_task", type=click.Path(dir_okay=False),
              help="Task file the server uses: check every response against offline classify results.")
@click.option("--model", help="Model for --check (the one the server uses).")
@click.option("--api-key", envvar="SLMCLASSIFY_API_KEY")
@click.option("--json", "json_path", help="Also save the JSON line to this file.")
def loadtest(url, concurrency, duration, max_requests, input_path, text_column, task_name, check_task, model,
             api_key, json_path):
    """Send single texts from N concurrent clients to a local `slmclassify serve` (loopback only)
    and print throughput, p50/p95/p99 latency and errors."""
    from ..bench.service_load import offline_expected, report_lines, run_load, server_info

    _need_serve_extra()
    info = server_info(url, api_key)
    names = [t["name"] for t in info["tasks"]]
    if task_name is None:
        if len(names) != 1:
            raise TaskError(f"the server has tasks {names}; pick one with --task")
        task_name = names[0]
    elif task_name not in names:
        raise TaskError(f"the server has no task {task_name!r}; tasks are {names}")
    texts = _bench_texts(input_path, text_column, 1 << 30) if input_path else _bench_texts(None, None, 600)
    expected = None
    if check_task:
        expected, offline_rate = offline_expected(texts, read_task(check_task), model,
                                                  info["limits"].get("max_text_tokens"))
        click.echo(f"offline classify: {len(texts)} texts at {offline_rate:.2f} items/s", err=True)
    report = run_load(url, task_name, texts, concurrency=concurrency, duration=duration, max_requests=max_requests,
                      api_key=api_key, expected=expected, tolerance=1e-4)
    lines = report_lines([report])
    click.echo("\n".join(lines))
    if json_path:
        Path(json_path).write_text(lines[-1] + "\n")


def _loopback(host: str) -> bool:
    """Whether --host only listens on this machine (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def _need_serve_extra() -> None:
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn", "prometheus_client", "httpx") if importlib.util.find_spec(m) is None]
    if missing:
        raise TaskError(f"serve needs the 'serve' extra ({', '.join(missing)} missing): "
                        "pip install 'slmclassify[serve]'")


@cli.command()
@click.argument("input_path", metavar="LABELLED_FILE")
@click.option("-o", "--output", "output_path", required=True, help="The head file to write (.npz).")
@click.option("--text-column", default="text", show_default=True)
@click.option("--gold-column", help="Column of gold labels (tables; default: label).")
@hidden_alias("--label-column", "old_gold_column")
@click.option("--folds", type=int, default=5, show_default=True, help="Cross-validation folds.")
@click.option("--layers", help="Comma-separated layer numbers to read (default: half, three quarters and all of the depth).")
@click.option("--scores", "use_scores", is_flag=True,
              help="Append the calibrated label log-probabilities to the features (no gain on the intent data).")
@click.option("--curve", default="4,8,16,32,64", show_default=True, help="Learning curve: items per label.")
@click.option("--plot", "plot_path", help="Learning-curve PNG (default: next to the head file).")
@click.option("--json", "json_path", help="Write the figures as JSON.")
@task_options
def fit(input_path, output_path, text_column, gold_column, old_gold_column, folds, layers, use_scores, curve, plot_path,
        json_path, opts: ModelOptions):
    """Fit a head on LABELLED_FILE (CSV/JSONL/Parquet with a gold column, or a BIG-bench JSON): a logistic
    regression on the model's hidden states, read on the fast path. Prints cross-validated accuracy,
    macro-F1 and ECE next to zero-shot scoring, and the learning curve."""
    from ..jobs.evaluate import task_for_file
    from ..jobs.fit import fit_file

    label_column = merged(gold_column, old_gold_column, "--gold-column", "--label-column") or "label"

    if folds < 2:
        raise TaskError(f"--folds must be at least 2, got {folds}")
    check_writes({"the labelled file": input_path, "--task": opts.task_file, "--model": opts.model},
                 {"-o": output_path, "--json": json_path, "--plot": plot_path})
    task = task_for_file(input_path, text_column, label_column, task_file=opts.task_file, labels=opts.label_names(),
                         **opts.overrides())
    summary = fit_file(input_path, output_path, task, opts.settings(), model=opts.model, text_column=text_column,
                       label_column=label_column, folds=folds,
                       taps=tuple(int_list(layers, "--layers")) if layers else None, use_scores=use_scores,
                       curve_sizes=tuple(int_list(curve, "--curve")), plot_path=plot_path, json_path=json_path)
    summaries.print_fit(summary)



@cli.command()
@click.argument("input_path", metavar="INPUT")
@click.option("--store", "store_path", help="SQLite file of the answers (default: INPUT's name + .labels.sqlite, "
              "here); starting again with it continues where it stopped.")
@click.option("--port", type=int, default=0, show_default=True, help="Port on 127.0.0.1 (0: a free one).")
@click.option("--api-key", envvar="SLMCLASSIFY_API_KEY",
              help="The page's token (also from $SLMCLASSIFY_API_KEY; default: a random one, in the printed URL).")
@click.option("--export", "export_path", help="Write the labelled input rows with a gold column to this file "
              "and exit (no page).")
@click.option("--fit", "fit_path", help="Fit a head (.npz, for `classify --head`) on the answers and exit (no page).")
@click.option("--sample", type=int, default=20000, show_default=True, help="Work on a seeded sample of this many rows.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--text-column", default="text", show_default=True)
@click.option("--id-column", help="A column of row ids, shown on the page next to each item.")
@click.option("--review-first", is_flag=True, help="INPUT is a `classify` output: offer its needs_review rows first.")
@click.option("--target-accuracy", type=float, default=0.9, show_default=True,
              help="Accuracy the automatic share must reach (its threshold from the cross-validated predictions).")
@task_options
def label(input_path, store_path, port, api_key, export_path, fit_path, sample, seed, text_column, id_column,
          review_first, target_accuracy, opts: ModelOptions):
    """Label INPUT by hand on a local web page, one item at a time, picked by active learning; a head
    is refitted as you go (needs the 'serve' and 'head' extras)."""
    from .label import run_label

    _need_serve_extra()
    run_label(input_path, opts.task(), opts.settings(), model=opts.model,
              store_path=store_path, port=port, api_key=api_key, export_path=export_path, fit_path=fit_path,
              sample=sample, seed=seed, text_column=text_column, review_first=review_first,
              target_accuracy=target_accuracy, task_file=opts.task_file, id_column=id_column)
