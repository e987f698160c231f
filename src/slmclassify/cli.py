"""The `slmclassify` command line. Library errors become one-line messages and exit code 2."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .errors import SlmClassifyError, TaskError, VerificationError
from .task import MODES, Task, parse_labels, task_file_settings


def main() -> None:
    """Console-script entry point."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("slmclassify: interrupted; no output written", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2)
    except VerificationError as exc:
        click.echo(f"slmclassify: {exc}", err=True)
        sys.exit(1)
    except SlmClassifyError as exc:
        click.echo(f"slmclassify: error: {exc}", err=True)
        sys.exit(2)


@click.group()
@click.version_option(package_name="slmclassify")
def cli() -> None:
    """Label texts with a small local language model: constrained scoring, a prefix KV cache
    and length-bucketed batching, checked against the per-item path."""


def task_options(fn):
    """Options that define the task, shared by every command that scores."""
    options = [
        click.option("--task", "task_file", type=click.Path(dir_okay=False), help="TOML task file."),
        click.option("--labels", help="Comma-separated labels, e.g. billing,technical,account."),
        click.option("--instruction", help="First line of the system turn."),
        click.option("--system", help="Replace the whole system turn with TEXT."),
        click.option("--user-template", help="Wrap each item, e.g. 'Ticket: {text}\\nCategory:'."),
        click.option("--mode", type=click.Choice(MODES), help="Label scoring mode (default auto)."),
        click.option("--min-confidence", type=float, help="Below this, needs_review = true (default 0.5)."),
        click.option("--calibrate/--no-calibrate", default=None,
                     help="Remove label priors measured on content-free inputs (contextual calibration)."),
        click.option("--model", help="HF model id, local folder or .gguf file (default: embedded SmolLM2-135M)."),
        click.option("--token-budget", type=int, help="Max rows × padded tokens per batch."),
        click.option("--max-rows", type=int, help="Max rows per batch."),
        click.option("--max-tokens", type=int, help="Truncate item texts to this many tokens."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def build_task(task_file, labels, instruction, system, user_template, mode, min_confidence, calibrate=None) -> Task:
    """The task from a task file and/or flags; flags win."""
    overrides = dict(instruction=instruction, system=system, mode=mode, min_confidence=min_confidence,
                     user_template=_unescape(user_template), calibrate=calibrate)
    if task_file:
        task = Task.from_toml(task_file)
        if labels:
            overrides.update(labels=parse_labels(labels), descriptions=())
        return task.with_overrides(**overrides)
    if not labels:
        raise TaskError("give the labels with --labels a,b,c or a --task file")
    return Task(labels=parse_labels(labels)).with_overrides(**overrides)


def build_settings(task_file, token_budget, max_rows, max_tokens):
    from .classifier import EngineSettings
    from .tuning import saved_settings

    stored = {**saved_settings(), **(task_file_settings(task_file) if task_file else {})}
    values = {
        "token_budget": token_budget if token_budget is not None else stored.get("token_budget"),
        "max_rows": max_rows if max_rows is not None else stored.get("max_rows"),
        "max_text_tokens": max_tokens,
    }
    return EngineSettings(**{k: v for k, v in values.items() if v is not None})


def _unescape(template: str | None) -> str | None:
    """Let shells pass `\\n` in --user-template."""
    return None if template is None else template.replace("\\n", "\n").replace("\\t", "\t")


def head_options(fn):
    """--head and --scorer, for the commands that can apply a learned head (`slmclassify fit`)."""
    fn = click.option("--scorer", type=click.Choice(["zero-shot", "head", "combined"]),
                      help="zero-shot label scoring, the head, or their product (default: the head when given).")(fn)
    return click.option("--head", "head_path", type=click.Path(dir_okay=False),
                        help="A head fitted by `slmclassify fit` (or `head = ...` in the task file).")(fn)


def _task_and_head(head_path, scorer, task_file, labels, instruction, system, user_template, mode,
                   min_confidence, calibrate):
    """(task, head or None, scorer, head path): a head without task flags brings the task it was fitted with."""
    from .head.apply import head_path_in_task_file, resolve_scorer, task_of
    from .head.model import Head

    head_path = head_path or head_path_in_task_file(task_file)
    head = Head.load(head_path) if head_path else None
    if head is not None and not (task_file or labels):
        task = task_of(head).with_overrides(instruction=instruction, system=system, mode=mode, calibrate=calibrate,
                                            user_template=_unescape(user_template), min_confidence=min_confidence)
    else:
        task = build_task(task_file, labels, instruction, system, user_template, mode, min_confidence, calibrate)
    return task, head, resolve_scorer(head, scorer), head_path


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
@head_options
@task_options
def classify(input_path, output_path, text_column, id_column, fmt, errors, probes, no_verify, gold_column,
             result_prefix, quiet, head_path, scorer,
             task_file, labels, instruction, system, user_template, mode, min_confidence, calibrate, model,
             token_budget, max_rows, max_tokens):
    """Classify every row of INPUT (CSV, JSONL, Parquet or - for stdin) into OUTPUT."""
    from .run import classify_table

    task, head, scorer, head_path = _task_and_head(head_path, scorer, task_file, labels, instruction, system,
                                                   user_template, mode, min_confidence, calibrate)
    settings = build_settings(task_file, token_budget, max_rows, max_tokens)
    classify_table(
        input_path, output_path, task, settings, model=model, text_column=text_column, id_column=id_column,
        fmt=fmt, errors=errors, probes=0 if no_verify else probes, gold_column=gold_column, progress=not quiet,
        result_prefix=result_prefix, head=head, scorer=scorer, head_source=head_path,
    )


@cli.command()
@click.argument("input_path", metavar="INPUT")
@click.option("--text-column", default="text", show_default=True)
@click.option("--format", "fmt", type=click.Choice(["csv", "jsonl", "parquet"]), help="Format for - (stdin).")
@click.option("--errors", type=click.Choice(["strict", "replace"]), default="strict", show_default=True)
@click.option("--probes", type=int, default=16, show_default=True, help="Probe items, spread over the length range.")
@click.option("--tolerance", type=float, default=1e-3, show_default=True, help="Max allowed |Δ log-prob|.")
@task_options
def verify(input_path, text_column, fmt, errors, probes, tolerance, task_file, labels, instruction, system,
           user_template, mode, min_confidence, calibrate, model, token_budget, max_rows, max_tokens):
    """Run probe items of INPUT through the fast and the per-item path and compare them."""
    from .run import verify_table

    task = build_task(task_file, labels, instruction, system, user_template, mode, min_confidence)
    settings = build_settings(task_file, token_budget, max_rows, max_tokens)
    report = verify_table(input_path, task, settings, model=model, text_column=text_column, fmt=fmt,
                          errors=errors, probes=probes, tolerance=tolerance)
    if not report.ok:
        raise VerificationError(f"verification failed: {report.summary()}; disagreeing rows {list(report.disagreements)}")




def _bench_texts(input_path, text_column, n):
    """The user's file (first n rows) or the article's synthetic tickets."""
    from .tables import read_table, texts_of
    from .workload import article_tickets

    if input_path is None:
        return article_tickets(n)
    texts = texts_of(read_table(input_path, text_column), text_column)
    return [t for t in texts if t.strip()][:n]


def _bench_task(task_file, labels, instruction, system, user_template):
    from .workload import ARTICLE_TASK

    if not (task_file or labels):
        return ARTICLE_TASK
    return build_task(task_file, labels, instruction, system, user_template, None, None)


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
@click.option("--model", help="HF model id, local folder or .gguf file (default: embedded SmolLM2-135M).")
@click.option("--token-budget", type=int)
@click.option("--max-rows", type=int)
@click.option("--llama-cpp/--no-llama-cpp", "with_llama_cpp", default=True, show_default=True,
              help="Run (f), llama.cpp on the GGUF, when llama-cpp-python is installed.")
def bench(n_items, input_path, text_column, json_path, task_file, labels, instruction, system, user_template,
          model, token_budget, max_rows, with_llama_cpp):
    """Reproduce the article's experiment next to ours, in one process: speed, padding, agreement.

    Every configuration scores first tokens (the article's method), so predictions are comparable.
    """
    from .bench import dump_json, run_bench
    from .loading import embedded_gguf_path, load_model

    if n_items < 1:
        raise TaskError(f"--n must be positive, got {n_items}")
    task = _bench_task(task_file, labels, instruction, system, user_template).with_overrides(mode="first")
    settings = build_settings(task_file, token_budget, max_rows, None)
    texts = _bench_texts(input_path, text_column, n_items)
    loaded = load_model(model)
    gguf = str(embedded_gguf_path()) if model is None else (model if str(model).endswith(".gguf") else None)
    gguf = gguf if with_llama_cpp else None
    report = run_bench(loaded, texts, task, settings, gguf_path=gguf, log=lambda m: click.echo(m, err=True))
    click.echo(f"model: {loaded.name}; {report.machine['cpu']}, {report.machine['threads']} threads, "
               f"torch {report.machine['torch']}, transformers {report.machine['transformers']}")
    click.echo(f"float32 matmul rate on the model's shapes: {report.matmul_gflops:.1f} GFLOP/s")
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
@task_options
def sweep(input_path, text_column, n_items, budgets, row_caps, plot_path, save, save_to_task, task_file, labels,
          instruction, system, user_template, mode, min_confidence, calibrate, model, token_budget, max_rows,
          max_tokens):
    """Measure throughput and padding over token budgets and row caps on INPUT (default: the article's tickets)."""
    from . import sweep as sweeping
    from .loading import load_model
    from .tuning import save_settings, write_task_settings

    budget_list = _int_list(budgets, "--budgets")
    rows_list = _int_list(row_caps, "--row-caps")
    task = (build_task(task_file, labels, instruction, system, user_template, mode, min_confidence)
            if (task_file or labels) else _bench_task(None, None, None, None, None))
    if save_to_task and not task_file:
        raise TaskError("--save-to-task needs --task FILE")
    texts = _bench_texts(input_path, text_column, n_items)
    points = sweeping.run_sweep(load_model(model), task, texts, budget_list, rows_list,
                                log=lambda m: click.echo(m, err=True))
    top = sweeping.best(points)
    sweeping.plot(points, plot_path)
    click.echo(f"{'budget':>8} {'rows':>5} {'items/s':>8} {'padding%':>9} {'peak RSS MB':>12}")
    for p in points:
        click.echo(f"{p.token_budget:>8} {p.max_rows:>5} {p.items_per_s:>8.2f} {100 * p.padding:>9.1f} "
                   f"{p.peak_rss_mb:>12.0f}")
    click.echo(f"best: --token-budget {top.token_budget} --max-rows {top.max_rows} ({top.items_per_s:.2f} items/s); "
               f"plot: {plot_path}")
    if save:
        click.echo(f"saved as default in {save_settings(token_budget=top.token_budget, max_rows=top.max_rows)}")
    if save_to_task:
        write_task_settings(task_file, token_budget=top.token_budget, max_rows=top.max_rows)
        click.echo(f"saved into {task_file}")


def _int_list(spec: str, option: str) -> list[int]:
    try:
        values = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise TaskError(f"{option} must be comma-separated integers, got {spec!r}") from None
    if not values or min(values) < 1:
        raise TaskError(f"{option} must list positive integers, got {spec!r}")
    return values


@cli.command()
@click.argument("input_path", metavar="LABELLED_FILE")
@click.option("--text-column", default="text", show_default=True)
@click.option("--label-column", default="label", show_default=True, help="Column of gold labels (tables).")
@click.option("--compare-modes", is_flag=True, help="Also report every scoring mode, with and without calibration.")
@click.option("--fit-temperature", is_flag=True, help="Fit temperature scaling on these items.")
@click.option("--target-accuracy", type=float, help="Print the confidence threshold that reaches this accuracy.")
@click.option("--write-task", is_flag=True, help="Write min_confidence (and temperature) into the --task file.")
@click.option("--fewshot-cost", type=int, default=0, help="Also time 0 vs N examples per label in the prefix.")
@click.option("--plots", "plots_dir", help="Folder for confusion.png, reliability.png and coverage.png.")
@click.option("--json", "json_path", help="Write the summary as JSON.")
@click.option("--limit", type=int, help="Only the first N items.")
@head_options
@task_options
def evaluate(input_path, text_column, label_column, compare_modes, fit_temperature, target_accuracy, write_task,
             fewshot_cost, plots_dir, json_path, limit, head_path, scorer, task_file, labels, instruction, system,
             user_template, mode, min_confidence, calibrate, model, token_budget, max_rows, max_tokens):
    """Score a labelled file (CSV/JSONL/Parquet, or a BIG-bench task JSON) and report accuracy,
    macro-F1, calibration and the review threshold."""
    from .evaluation_run import evaluate_file

    if target_accuracy is not None and not 0 < target_accuracy <= 1:
        raise TaskError(f"--target-accuracy must be in (0, 1], got {target_accuracy}")
    if write_task and not task_file:
        raise TaskError("--write-task needs --task FILE")
    head_task, head, scorer, head_path = (_task_and_head(head_path, scorer, task_file, labels, instruction, system,
                                                         user_template, mode, min_confidence, calibrate)
                                          if head_path or task_file or scorer else (None, None, "zero-shot", None))
    evaluate_file(
        input_path, text_column=text_column, label_column=label_column, task_args=dict(
            task_file=task_file, labels=labels, instruction=instruction, system=system,
            user_template=user_template, mode=mode, min_confidence=min_confidence, calibrate=calibrate),
        settings=build_settings(task_file, token_budget, max_rows, max_tokens), model=model,
        compare_modes=compare_modes, fit_temperature=fit_temperature, target_accuracy=target_accuracy,
        write_task=write_task, fewshot_cost=fewshot_cost, plots_dir=plots_dir, json_path=json_path, limit=limit,
        head=head, scorer=scorer, head_source=head_path, task=head_task if head is not None else None,
    )


@cli.command()
@click.argument("input_path", metavar="LABELLED_FILE")
@click.option("-o", "--output", "output_path", required=True, help="The head file to write (.npz).")
@click.option("--text-column", default="text", show_default=True)
@click.option("--label-column", default="label", show_default=True, help="Column of gold labels (tables).")
@click.option("--folds", type=int, default=5, show_default=True, help="Cross-validation folds.")
@click.option("--layers", help="Comma-separated layer numbers to read (default: half, three quarters and all of the depth).")
@click.option("--scores", "use_scores", is_flag=True,
              help="Append the calibrated label log-probabilities to the features (no gain on the intent data).")
@click.option("--curve", default="4,8,16,32,64", show_default=True, help="Learning curve: items per label.")
@click.option("--plot", "plot_path", help="Learning-curve PNG (default: next to the head file).")
@click.option("--json", "json_path", help="Write the figures as JSON.")
@task_options
def fit(input_path, output_path, text_column, label_column, folds, layers, use_scores, curve, plot_path, json_path,
        task_file, labels, instruction, system, user_template, mode, min_confidence, calibrate, model, token_budget,
        max_rows, max_tokens):
    """Fit a head on LABELLED_FILE (CSV/JSONL/Parquet with a gold column, or a BIG-bench JSON): a logistic
    regression on the model's hidden states, read on the fast path. Prints cross-validated accuracy,
    macro-F1 and ECE next to zero-shot scoring, and the learning curve."""
    from .evaluate import labels_in_file, read_labelled
    from .head.job import fit_file

    if folds < 2:
        raise TaskError(f"--folds must be at least 2, got {folds}")
    if not (task_file or labels):
        found = labels_in_file(input_path) or tuple(sorted(set(read_labelled(input_path, text_column, label_column)[1])))
        labels = ",".join(found)
    task = build_task(task_file, labels, instruction, system, user_template, mode, min_confidence, calibrate)
    fit_file(input_path, output_path, task, build_settings(task_file, token_budget, max_rows, max_tokens),
             model=model, text_column=text_column, label_column=label_column, folds=folds,
             taps=tuple(_int_list(layers, "--layers")) if layers else None, use_scores=use_scores,
             curve_sizes=tuple(_int_list(curve, "--curve")), plot_path=plot_path, json_path=json_path)
