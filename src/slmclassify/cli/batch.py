"""`slmclassify batch`: an OpenAI Batch API file of chat completions with choices (and completions
with the prompt's log-probabilities), answered offline
(the job: `jobs/batch.py`). Its options arrive as `BatchOptions` (the job's request, with --quiet and
--window) and `ModelOptions` (the model and how it runs)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import click

from .options import (ModelOptions, bundle, device_options, max_rows_option, model_option, served_model_name_option,
                      token_budget_option)
from .progress import Progress

if TYPE_CHECKING:  # the job imports torch: the CLI (and a --ray driver) imports it only to run it
    from ..jobs.batch import BatchRequest


@dataclasses.dataclass(frozen=True)
class BatchOptions:
    request: BatchRequest
    task_specs: tuple[str, ...] = ()
    """`NAME=FILE.toml` per task, for `/v1/classify` lines."""
    quiet: bool = False
    window: int | None = None

    @classmethod
    def from_flags(cls, *, task_specs, quiet, window, **request) -> BatchOptions:
        from ..jobs.batch import BatchRequest

        return cls(BatchRequest(**request), task_specs, quiet, window)


batch_options = bundle("run", BatchOptions.from_flags, [
    click.argument("input_path", metavar="REQUESTS.jsonl"),
    click.option("-o", "--output", "output_path", required=True, help="The answers (JSON Lines), one per request."),
    click.option("--prefix-cache-mb", type=float, default=256.0, show_default=True,
                 help="Memory for the cached heads of the conversations (their shared system turn and earlier "
                      "turns); the least recently used are dropped beyond it."),
    served_model_name_option(),
    click.option("--task", "task_specs", multiple=True, metavar="NAME=FILE",
                 help="A task for /v1/classify lines whose model is NAME, from a TOML task file (repeat for several)."),
    click.option("--resume", is_flag=True, help="Continue the unfinished run kept in OUTPUT.partial."),
    click.option("--restart", is_flag=True, help="Discard an unfinished run (OUTPUT.partial) and start over."),
    click.option("--window", type=int, help="Request lines read, grouped and batched at a time; also the resume "
                                            "step."),
    click.option("--quiet", is_flag=True, help="No progress bar."),
])
model_options = bundle("opts", ModelOptions, [model_option(), token_budget_option(), max_rows_option(),
                                              *device_options()])


@click.command()
@batch_options
@model_options
def batch(run: BatchOptions, opts: ModelOptions):
    """Answer an OpenAI Batch API file of chat completions with choices (each choice scored whole, the
    conversations' shared heads computed once), completions with the prompt's log-probabilities, and
    classify requests (vLLM's pooling shape) for the tasks given with --task.
    One answer line per request line, in order; a bad line gets its error, never the whole file."""
    from ..jobs.batch import run_batch
    from ..jobs.sources import named_tasks

    summary = run_batch(run.request, opts.settings(window=run.window), named_tasks(run.task_specs), model=opts.model,
                        meter=lambda rows, size, done: Progress(rows, size, enabled=not run.quiet, done=done))
    refused = sum(summary.refused.values())
    resumed = f", resumed at line {summary.resumed_at + 1}" if summary.resumed_at else ""
    click.echo(f"model: {summary.model} (id {', '.join(summary.model_ids)})", err=True)
    click.echo(f"lines: {summary.lines} ({summary.answered} answered, {refused} refused{resumed}); "
               f"{summary.items_per_s:.1f} answers/s", err=True)
    computed, reused = summary.head_tokens["computed"], summary.head_tokens["reused"]
    if computed + reused:
        click.echo(f"prefix tokens read from the prefix cache: {reused / (computed + reused):.1%} "
                   f"({reused} reused, {computed} computed)", err=True)
    click.echo(f"wrote {summary.output}", err=True)
