"""`slmclassify classify` (here, or on Ray actors with --ray) and `slmclassify verify`.

classify's options arrive as four frozen bundles: what to read and write (`ClassifyOptions`: the
job's `ClassifyRequest`, made as the flags are read, with --quiet and --window), where to run
(`RayOptions`), the head (`HeadOptions`) and the task and model (`ModelOptions`); verify's as
`VerifyOptions` and `ModelOptions`."""

from __future__ import annotations

import dataclasses

import click

from ..errors import TaskError, VerificationError
from ..io.formats import check_writes
from ..jobs.table_request import ClassifyRequest
from . import summaries
from .options import (HeadOptions, ModelOptions, bundle, head_options, hidden_alias, merged, task_and_head,
                      task_options)
from .startup import start_torch


@dataclasses.dataclass(frozen=True)
class ClassifyOptions:
    """classify's run options: the job's request, and what only the command uses."""

    request: ClassifyRequest
    quiet: bool = False
    """No progress bar."""
    window: int | None = None
    """Rows read, sorted and batched at a time (None: the settings' default)."""

    @classmethod
    def from_flags(cls, *, probes, no_verify, quiet, window, **request) -> ClassifyOptions:
        return cls(ClassifyRequest(probes=0 if no_verify else probes, **request), quiet, window)

    def check_ray(self) -> None:
        """Refuse what a run on Ray cannot do (it keeps no partial run and reports no accuracy)."""
        if self.request.resume or self.request.restart or self.request.gold_column:
            raise TaskError("--ray does not support --resume, --restart or --gold-column")


classify_options = bundle("run", ClassifyOptions.from_flags, [
    click.argument("input_path", metavar="INPUT"),
    click.option("-o", "--output", "output_path", required=True,
                 help="Output file (.csv/.jsonl/.parquet, or - for stdout)."),
    click.option("--text-column", default="text", show_default=True),
    click.option("--id-column", help="Column of row ids (kept; named in errors)."),
    click.option("--format", "fmt", type=click.Choice(["csv", "jsonl", "parquet"]),
                 help="Format for - (stdin/stdout)."),
    click.option("--errors", type=click.Choice(["strict", "replace"]), default="strict", show_default=True,
                 help="Invalid UTF-8: stop with an error naming the row, or replace the bytes."),
    click.option("--probes", type=int, default=8, show_default=True, help="Items checked against the per-item path."),
    click.option("--no-verify", is_flag=True, help="Skip the probe check."),
    click.option("--gold-column", help="Column of true labels: report accuracy."),
    click.option("--result-prefix", default="", help="Prefix for the added columns (e.g. pred_)."),
    click.option("--quiet", is_flag=True, help="No progress bar."),
    click.option("--resume", is_flag=True, help="Continue the unfinished run kept in OUTPUT.partial."),
    click.option("--restart", is_flag=True, help="Discard an unfinished run (OUTPUT.partial) and start over."),
    click.option("--window", type=int, help="Rows read, sorted and batched at a time; also the resume step "
                 "(default 1024)."),
])


@dataclasses.dataclass(frozen=True)
class RayOptions:
    """classify's --ray options, as typed (None: not given)."""

    use_ray: bool = False
    ray_address: str | None = None
    actors: int | None = None
    cpus_per_actor: float = 1
    block_rows: int | None = None

    @property
    def on(self) -> bool:
        """Whether the run goes to Ray: --ray, or an option that only means something there."""
        return bool(self.use_ray or self.ray_address or self.actors is not None)

    def settings(self):
        """The `RaySettings` (the defaults of what is not given)."""
        from ..ray import DEFAULT_BLOCK_ROWS, RaySettings

        return RaySettings(actors=2 if self.actors is None else self.actors, cpus_per_actor=self.cpus_per_actor,
                           block_rows=DEFAULT_BLOCK_ROWS if self.block_rows is None else self.block_rows)


ray_options = bundle("ray", RayOptions, [
    click.option("--ray", "use_ray", is_flag=True, help="Run on Ray actors (without --ray-address: the Ray of "
                 "RAY_ADDRESS or `ray start` on this machine, else a new local one); INPUT may be a folder, "
                 "OUTPUT a folder of Parquet parts."),
    click.option("--ray-address", help="Ray to join: auto, HOST:PORT, ray://HOST:10001, or local for a new "
                 "local Ray (implies --ray)."),
    click.option("--actors", type=int, help="Classifier actors under --ray (default 2)."),
    click.option("--cpus-per-actor", type=float, default=1, show_default=True, help="CPUs (torch threads) per actor."),
    click.option("--block-rows", type=int, help="Most rows per Ray block, sorted and batched together (default "
                 "256; one small file is cut into blocks of equal work, at least 4 per actor)."),
])
"""`classify --ray`: the run on a Ray cluster (the `slmclassify[ray]` extra)."""


@click.command()
@classify_options
@ray_options
@head_options
@task_options
def classify(run: ClassifyOptions, ray: RayOptions, head: HeadOptions, opts: ModelOptions):
    """Classify every row of INPUT (CSV, JSONL, Parquet or - for stdin) into OUTPUT, streaming."""
    if not ray.on:  # the --ray driver never imports torch (2.5 s before ray.init); its actors do
        start_torch()
    # (the input itself, and the run's partial and records beside -o, are checked by the job)
    check_writes({"--task": opts.task_file, "--head": head.head_path, "--model": opts.model},
                 {"-o": run.request.output_path})
    task, choice = task_and_head(head, opts)
    settings = opts.settings(window=run.window)
    if ray.on:
        if choice.used:
            raise TaskError("--ray does not apply a head yet; run without --ray, or with --scorer zero-shot")
        return _classify_on_ray(run, ray, task, settings, opts.model)
    from ..jobs.classify import run_classify
    from .progress import Progress

    summary = run_classify(run.request, task, settings, model=opts.model, head=choice,
                           on_loaded=lambda classifier: summaries.print_loaded(classifier, choice),
                           meter=lambda rows, size, done: Progress(rows, size, enabled=not run.quiet, done=done))
    summaries.print_classify(summary)
    report = summary.report
    if report is not None and not report.ok:
        raise VerificationError(f"the output was written, but {report.summary()}; "
                                f"disagreeing rows {list(report.disagreements)}")


def _classify_on_ray(run: ClassifyOptions, ray: RayOptions, task, settings, model) -> None:
    try:
        from ..jobs.ray_classify import RayClassifyRequest, run_ray_classify  # imports Ray, and ..ray, first
    except ImportError as exc:
        raise TaskError(f"--ray needs Ray: pip install 'slmclassify[ray]' ({exc})") from None
    run.check_ray()
    rs = ray.settings()
    from .progress import Progress

    request = RayClassifyRequest(**run.request.table(), address=ray.ray_address, progress=not run.quiet)
    summary = run_ray_classify(request, task, settings, rs, model=model,
                               meter=lambda rows, size, done: Progress(rows, size, not run.quiet))
    summaries.print_ray(summary)


@dataclasses.dataclass(frozen=True)
class VerifyOptions:
    """What verify reads and how closely the paths must agree (the old --n merged into --probes)."""

    input_path: str
    text_column: str = "text"
    fmt: str | None = None
    errors: str = "strict"
    probes: int = 16
    tolerance: float = 1e-3
    """Largest allowed |Δ log-prob| between the fast and the per-item path."""

    @classmethod
    def from_flags(cls, *, probes, old_probes, **flags) -> VerifyOptions:
        probes = merged(probes, old_probes, "--probes", "--n")
        return cls(probes=16 if probes is None else probes, **flags)


verify_options = bundle("run", VerifyOptions.from_flags, [
    click.argument("input_path", metavar="INPUT"),
    click.option("--text-column", default="text", show_default=True),
    click.option("--format", "fmt", type=click.Choice(["csv", "jsonl", "parquet"]), help="Format for - (stdin)."),
    click.option("--errors", type=click.Choice(["strict", "replace"]), default="strict", show_default=True),
    click.option("--probes", type=int, help="Probe items, spread over the length range (e.g. --precision int8 "
                 "--probes 200)  [default: 16]"),
    hidden_alias("--n", "old_probes", type=int),
    click.option("--tolerance", type=float, default=1e-3, show_default=True, help="Max allowed |Δ log-prob|."),
])


@click.command()
@verify_options
@task_options
def verify(run: VerifyOptions, opts: ModelOptions):
    """Run probe items of INPUT through the fast and the per-item path and compare them."""
    from ..jobs.verify import verify_table

    summary = verify_table(run.input_path, opts.task(), opts.settings(), model=opts.model, text_column=run.text_column,
                           fmt=run.fmt, errors=run.errors, probes=run.probes, tolerance=run.tolerance)
    summaries.print_verify(summary)
    report = summary.report
    if not report.ok:
        raise VerificationError(f"verification failed: {report.summary()}; "
                                f"disagreeing rows {list(report.disagreements)}")
