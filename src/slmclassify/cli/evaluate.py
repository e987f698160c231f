"""`slmclassify evaluate` and `slmclassify fit`: the commands that read a labelled file.

Each command's own options arrive as one frozen bundle (`EvaluateOptions`, `FitOptions`: old flag
names merged, values checked), next to the head (`HeadOptions`, evaluate) and the task and model
(`ModelOptions`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from ..core.taps import Taps
from ..errors import TaskError
from ..io.formats import check_writes
from . import summaries
from .options import (HeadOptions, ModelOptions, bundle, head_options, hidden_alias, int_list, merged, task_and_head,
                      task_options)

PLOT_NAMES = ("confusion.png", "reliability.png", "coverage.png")
"""The files evaluate's --plots folder gets."""


@dataclasses.dataclass(frozen=True)
class EvaluateOptions:
    """What evaluate reads, reports and writes (old flag names merged into the new ones)."""

    input_path: str
    text_column: str = "text"
    label_column: str = "label"
    compare_modes: bool = False
    fit_temperature: bool = False
    target_accuracy: float | None = None
    target_precision: float | None = None
    """Multi-label: each label's threshold is the lowest reaching this precision (None: F1-optimal)."""
    write_task: bool = False
    fewshot_cost: int = 0
    plots_dir: str | None = None
    json_path: str | None = None
    limit: int | None = None
    """Only the first N items (None: all)."""

    def __post_init__(self) -> None:
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise TaskError(f"--target-accuracy must be in (0, 1], got {self.target_accuracy}")

    @classmethod
    def from_flags(cls, *, gold_column, old_gold_column, n_items, old_n_items, **flags) -> EvaluateOptions:
        return cls(label_column=merged(gold_column, old_gold_column, "--gold-column", "--label-column") or "label",
                   limit=merged(n_items, old_n_items, "--n", "--limit"), **flags)

    def plots(self) -> dict[str, str]:
        """{what: path} of the plot files, for `check_writes`."""
        if not self.plots_dir:
            return {}
        return {f"--plots {name}": str(Path(self.plots_dir) / name) for name in PLOT_NAMES}

    def single_label_flags(self) -> list[str]:
        """The flags given that only a single-label evaluation uses."""
        return [flag for flag, value in (("--compare-modes", self.compare_modes),
                                         ("--fit-temperature", self.fit_temperature),
                                         ("--target-accuracy", self.target_accuracy),
                                         ("--fewshot-cost", self.fewshot_cost), ("--plots", self.plots_dir)) if value]


evaluate_options = bundle("run", EvaluateOptions.from_flags, [
    click.argument("input_path", metavar="LABELLED_FILE"),
    click.option("--text-column", default="text", show_default=True),
    click.option("--gold-column", help="Column of gold labels (tables; default: label)."),
    hidden_alias("--label-column", "old_gold_column"),
    click.option("--compare-modes", is_flag=True, help="Also report every scoring mode, with and without calibration."),
    click.option("--fit-temperature", is_flag=True, help="Fit temperature scaling on these items."),
    click.option("--target-accuracy", type=float, help="Print the confidence threshold that reaches this accuracy."),
    click.option("--target-precision", type=float, help="Multi-label: pick each label's threshold as the lowest whose "
                                                        "precision reaches this (default: F1-optimal)."),
    click.option("--write-task", is_flag=True, help="Write min_confidence (and temperature; multi-label: the "
                                                    "thresholds) into the --task file."),
    click.option("--fewshot-cost", type=int, default=0, help="Also time 0 vs N examples per label in the prefix."),
    click.option("--plots", "plots_dir", help="Folder for confusion.png, reliability.png and coverage.png."),
    click.option("--json", "json_path", help="Write the summary as JSON."),
    click.option("--n", "n_items", type=int, help="Only the first N items."),
    hidden_alias("--limit", "old_n_items", type=int),
])


@click.command()
@evaluate_options
@head_options
@task_options
def evaluate(run: EvaluateOptions, head: HeadOptions, opts: ModelOptions):
    """Score a labelled file (CSV/JSONL/Parquet, or a BIG-bench task JSON) and report accuracy,
    macro-F1, calibration and the review threshold."""
    from ..jobs.evaluate import evaluate_file, task_for_file

    if run.write_task and not opts.task_file:
        raise TaskError("--write-task needs --task FILE")
    # --write-task writes into the task file on purpose; nothing else may be written over an input
    check_writes({"the input": run.input_path, "--task": opts.task_file, "--head": head.head_path,
                  "--model": opts.model}, {"--json": run.json_path, **run.plots()})
    if head.head_path or opts.task_file or head.scorer:
        head_task, choice = task_and_head(head, opts)
    else:
        from ..head.apply import HeadChoice

        head_task, choice = None, HeadChoice()
    task = head_task if choice.head is not None else task_for_file(
        run.input_path, run.text_column, run.label_column, task_file=opts.task_file, labels=opts.label_names(),
        limit=run.limit, **opts.overrides())
    if run.target_precision is not None and not (task.multi_label and 0 < run.target_precision <= 1):
        raise TaskError("--target-precision picks a multi-label task's thresholds: it needs --multi-label (or "
                        f"multi_label = true) and a value in (0, 1], got {run.target_precision}")
    task_file = opts.task_file if run.write_task else None
    if task.multi_label:
        from ..jobs.evaluate import evaluate_multilabel_file

        if given := run.single_label_flags():
            raise TaskError(f"{given[0]} is for single-label tasks; a multi-label evaluation reports F1, subset "
                            "accuracy and Hamming loss, and picks thresholds (--target-precision)")
        summaries.print_multilabel_evaluate(evaluate_multilabel_file(
            run.input_path, task, opts.settings(), text_column=run.text_column, label_column=run.label_column,
            model=opts.model, target_precision=run.target_precision, task_file=task_file, json_path=run.json_path,
            limit=run.limit, head=choice))
        return
    summary = evaluate_file(
        run.input_path, task, opts.settings(), text_column=run.text_column, label_column=run.label_column,
        model=opts.model, compare_modes=run.compare_modes, fit_temperature=run.fit_temperature,
        target_accuracy=run.target_accuracy, task_file=task_file, fewshot_cost=run.fewshot_cost,
        plots_dir=run.plots_dir, json_path=run.json_path, limit=run.limit, head=choice,
    )
    summaries.print_evaluate(summary)


@dataclasses.dataclass(frozen=True)
class FitOptions:
    """What fit reads and writes, and how it fits (the old --label-column merged into --gold-column)."""

    input_path: str
    output_path: str
    text_column: str = "text"
    label_column: str = "label"
    folds: int = 5
    group_column: str | None = None
    layers: str | None = None
    """Comma-separated layers, as typed: 15 (last token), mean15 (mean-pooled); None: chosen by CV."""
    use_scores: bool = False
    curve: str = "4,8,16,32,64"
    """Learning-curve sizes (items per label), as typed."""
    plot_path: str | None = None
    json_path: str | None = None

    def __post_init__(self) -> None:
        if self.folds < 2:
            raise TaskError(f"--folds must be at least 2, got {self.folds}")

    @classmethod
    def from_flags(cls, *, gold_column, old_gold_column, **flags) -> FitOptions:
        return cls(label_column=merged(gold_column, old_gold_column, "--gold-column", "--label-column") or "label",
                   **flags)

    def taps(self) -> Taps | None:
        if not self.layers:
            return None
        try:
            taps = Taps.parse(x for x in self.layers.split(",") if x.strip())
        except ValueError as exc:
            raise TaskError(f"--layers: {exc}") from None
        if not taps or min(taps.last + taps.mean) < 1:
            raise TaskError(f"--layers must list positive layer numbers, got {self.layers!r}")
        return taps

    def curve_sizes(self) -> tuple[int, ...]:
        return tuple(int_list(self.curve, "--curve"))


fit_options = bundle("run", FitOptions.from_flags, [
    click.argument("input_path", metavar="LABELLED_FILE"),
    click.option("-o", "--output", "output_path", required=True, help="The head file to write (.npz)."),
    click.option("--text-column", default="text", show_default=True),
    click.option("--gold-column", help="Column of gold labels (tables; default: label)."),
    hidden_alias("--label-column", "old_gold_column"),
    click.option("--folds", type=int, default=5, show_default=True, help="Cross-validation folds."),
    click.option("--group-column", help="Column grouping near copies of one text: cross-validation keeps each "
                 "group in one fold."),
    click.option("--layers", help="Comma-separated layers to read: 15 at the last token, mean15 mean-pooled over "
                 "the item (default: chosen by cross-validation among means at 1/5..4/5 of the depth, last tokens "
                 "at 1/2, 3/4 and all of it, both, and the 4/5 mean alone)."),
    click.option("--scores", "use_scores", is_flag=True,
                 help="Append the calibrated label log-probabilities to the features (no gain on the intent data)."),
    click.option("--curve", default="4,8,16,32,64", show_default=True, help="Learning curve: items per label."),
    click.option("--plot", "plot_path", help="Learning-curve PNG (default: next to the head file)."),
    click.option("--json", "json_path", help="Write the figures as JSON."),
])


@click.command()
@fit_options
@task_options
def fit(run: FitOptions, opts: ModelOptions):
    """Fit a head on LABELLED_FILE (CSV/JSONL/Parquet with a gold column, or a BIG-bench JSON): a logistic
    regression on the model's hidden states, read on the fast path. Prints cross-validated accuracy,
    macro-F1 and ECE next to zero-shot scoring, and the learning curve."""
    from ..jobs.evaluate import task_for_file
    from ..jobs.fit import fit_file

    check_writes({"the labelled file": run.input_path, "--task": opts.task_file, "--model": opts.model},
                 {"-o": run.output_path, "--json": run.json_path, "--plot": run.plot_path})
    task = task_for_file(run.input_path, run.text_column, run.label_column, task_file=opts.task_file,
                         labels=opts.label_names(), **opts.overrides())
    summary = fit_file(run.input_path, run.output_path, task, opts.settings(), model=opts.model,
                       text_column=run.text_column, label_column=run.label_column, folds=run.folds, taps=run.taps(),
                       use_scores=run.use_scores, curve_sizes=run.curve_sizes(), plot_path=run.plot_path,
                       json_path=run.json_path, group_column=run.group_column)
    summaries.print_fit(summary)
