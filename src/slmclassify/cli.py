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
        click.option("--model", help="HF model id, local folder or .gguf file (default: embedded SmolLM2-135M)."),
        click.option("--token-budget", type=int, help="Max rows × padded tokens per batch."),
        click.option("--max-rows", type=int, help="Max rows per batch."),
        click.option("--max-tokens", type=int, help="Truncate item texts to this many tokens."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def build_task(task_file, labels, instruction, system, user_template, mode, min_confidence) -> Task:
    """The task from a task file and/or flags; flags win."""
    overrides = dict(instruction=instruction, system=system, mode=mode, min_confidence=min_confidence,
                     user_template=_unescape(user_template))
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
@task_options
def classify(input_path, output_path, text_column, id_column, fmt, errors, probes, no_verify, gold_column,
             result_prefix, quiet,
             task_file, labels, instruction, system, user_template, mode, min_confidence, model,
             token_budget, max_rows, max_tokens):
    """Classify every row of INPUT (CSV, JSONL, Parquet or - for stdin) into OUTPUT."""
    from .run import classify_table

    task = build_task(task_file, labels, instruction, system, user_template, mode, min_confidence)
    settings = build_settings(task_file, token_budget, max_rows, max_tokens)
    classify_table(
        input_path, output_path, task, settings, model=model, text_column=text_column, id_column=id_column,
        fmt=fmt, errors=errors, probes=0 if no_verify else probes, gold_column=gold_column, progress=not quiet,
        result_prefix=result_prefix,
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
           user_template, mode, min_confidence, model, token_budget, max_rows, max_tokens):
    """Run probe items of INPUT through the fast and the per-item path and compare them."""
    from .run import verify_table

    task = build_task(task_file, labels, instruction, system, user_template, mode, min_confidence)
    settings = build_settings(task_file, token_budget, max_rows, max_tokens)
    report = verify_table(input_path, task, settings, model=model, text_column=text_column, fmt=fmt,
                          errors=errors, probes=probes, tolerance=tolerance)
    if not report.ok:
        raise VerificationError(f"verification failed: {report.summary()}; disagreeing rows {list(report.disagreements)}")


