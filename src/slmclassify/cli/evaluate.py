"""`slmclassify evaluate` and `slmclassify fit`: the commands that read a labelled file.

Each command's own options arrive as one frozen bundle, made as the flags are read (old flag names
merged): evaluate's `EvaluateOptions` (the job's `EvaluateRequest` and --write-task), fit's the
job's `FitRequest` itself; next to them the head (`HeadOptions`, evaluate) and the task and model
(`ModelOptions`). The requests check their values."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..core.results import columns_for
from ..core.taps import Taps
from ..errors import TaskError
from ..io.formats import check_writes
from . import summaries
from .options import (HeadOptions, ModelOptions, bundle, head_options, hidden_alias, int_list, merged, task_and_head,
                      task_options)

if TYPE_CHECKING:  # the jobs import torch: the commands import them when they run
    from ..jobs.evaluate import EvaluateRequest
    from ..jobs.fit import FitRequest

PLOT_NAMES = ("confusion.png", "reliability.png", "coverage.png")
"""The files evaluate's --plots folder gets."""


def gold_column_of(gold_column: str | None, old_gold_column: str | None) -> str:
    """--gold-column, or its old name --label-column (not both); default: label."""
    return merged(gold_column, old_gold_column, "--gold-column", "--label-column") or "label"


def parse_gold_columns(values: tuple[str, ...]) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """evaluate's --gold-column values as typed → (the one plain COLUMN of a task of labels, or None;
    the NAME=COLUMN pairs of a task with questions). Which one the task needs is checked once the
    task is known."""
    plain = [v for v in values if "=" not in v]
    typed = [v for v in values if "=" in v]
    if plain and typed:
        raise TaskError(f"--gold-column: give one COLUMN (a task of labels) or NAME=COLUMN per question (a task with "
                        f"questions), not both (got {plain[0]!r} and {typed[0]!r})")
    if len(plain) > 1:
        raise TaskError(f"--gold-column names one column for a task of labels (got {', '.join(map(repr, plain))}); "
                        "a task with questions takes NAME=COLUMN per question")
    pairs = []
    for value in typed:
        name, _, column = value.partition("=")
        name, column = name.strip(), column.strip()
        if not name or not column:
            raise TaskError(f"--gold-column {value!r}: give a question's NAME=COLUMN, e.g. priority=gold_priority")
        if name in dict(pairs):
            raise TaskError(f"--gold-column names question {name!r} twice; give one column per question")
        pairs.append((name, column))
    return (plain[0] if plain else None), tuple(pairs)


@dataclasses.dataclass(frozen=True)
class EvaluateOptions:
    """evaluate's run options: the job's request (old flag names merged into the new ones), and
    --write-task, which gives the request the --task file to write into."""

    request: EvaluateRequest
    write_task: bool = False

    @classmethod
    def from_flags(cls, *, gold_column, old_gold_column, n_items, old_n_items, write_task, **flags) -> EvaluateOptions:
        from ..jobs.evaluate import EvaluateRequest

        plain, pairs = parse_gold_columns(gold_column)
        return cls(EvaluateRequest(label_column=gold_column_of(plain, old_gold_column), gold_columns=pairs,
                                   limit=merged(n_items, old_n_items, "--n", "--limit"), **flags), write_task)

    def plots(self) -> dict[str, str]:
        """{what: path} of the plot files, for `check_writes`."""
        if not self.request.plots_dir:
            return {}
        return {f"--plots {name}": str(Path(self.request.plots_dir) / name) for name in PLOT_NAMES}

    def single_label_flags(self) -> list[str]:
        """The flags given that only a single-label evaluation uses."""
        run = self.request
        return [flag for flag, value in (("--compare-modes", run.compare_modes),
                                         ("--fit-temperature", run.fit_temperature),
                                         ("--target-accuracy", run.target_accuracy),
                                         ("--fewshot-cost", run.fewshot_cost), ("--plots", run.plots_dir)) if value]

    def one_question_flags(self) -> list[str]:
        """The flags given that measure or write one question's settings: refused for a task with questions."""
        run = self.request
        return [flag for flag, value in (("--compare-modes", run.compare_modes),
                                         ("--fit-temperature", run.fit_temperature), ("--write-task", self.write_task),
                                         ("--fewshot-cost", run.fewshot_cost), ("--plots", run.plots_dir)) if value]


evaluate_options = bundle("run", EvaluateOptions.from_flags, [
    click.argument("input_path", metavar="LABELLED_FILE"),
    click.option("--text-column", default="text", show_default=True),
    click.option("--gold-column", multiple=True,
                 help="Column of gold labels (tables; default: label). A task with questions: NAME=COLUMN, once per "
                      "question to report (e.g. --gold-column priority=gold_priority)."),
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
    request = dataclasses.replace(run.request, task_file=opts.task_file if run.write_task else None)
    # --write-task writes into the task file on purpose; nothing else may be written over an input
    check_writes({"the input": request.input_path, "--task": opts.task_file, "--head": head.head_path,
                  "--model": opts.model}, {"--json": request.json_path, **run.plots()})
    if head.head_path or opts.task_file or head.scorer:
        head_task, choice = task_and_head(head, opts)
    else:
        from ..head.apply import HeadChoice

        head_task, choice = None, HeadChoice()
    task = head_task if choice.head is not None else task_for_file(
        request.input_path, request.text_column, request.label_column, task_file=opts.task_file,
        labels=opts.label_names(), limit=request.limit, **opts.overrides())
    thresholded = any(q.readout.thresholded for q in task.asked)  # an answer of labels each against a threshold
    if request.target_precision is not None and not (thresholded and 0 < request.target_precision <= 1):
        raise TaskError("--target-precision picks a multi-label task's thresholds: it needs --multi-label (or "
                        f"multi_label = true, or a multi-label question) and a value in (0, 1], got "
                        f"{request.target_precision}")
    if columns_for(task).named:  # a gold column per question, each reported in a row of its own
        _evaluate_questions(run, request, task, choice, opts)
        return
    if request.gold_columns:
        raise TaskError(f"--gold-column {'='.join(request.gold_columns[0])}: NAME=COLUMN is for a task with questions, "
                        "and this task has none; give its gold column alone, --gold-column COLUMN")
    summaries.print_evaluation(evaluate_file(request, task, opts.settings(), model=opts.model, head=choice))


def _evaluate_questions(run: EvaluateOptions, request: EvaluateRequest, task, choice, opts: ModelOptions) -> None:
    """A task with questions: its one pass, each question with a gold column measured and reported."""
    from ..jobs.evaluate import evaluate_questions_file

    names = [q.name for q in task.asked]
    if not request.gold_columns:  # a plain COLUMN, or none: this task's answers are in a column per question
        raise TaskError(f"this task asks questions ({', '.join(names)}): give each one's gold column as --gold-column "
                        f"NAME=COLUMN, e.g. --gold-column {names[0]}=COLUMN")
    if given := run.one_question_flags():
        raise TaskError(f"{given[0]} measures a task of one question; a task with questions is reported per question: "
                        "run without it, or evaluate that question with a task file of its own")
    if choice.head is not None:
        raise TaskError("--head and --scorer apply a head fitted on a task of labels; a task with questions is scored "
                        "zero-shot: run without them")
    summaries.print_questions_evaluate(evaluate_questions_file(request, task, opts.settings(), model=opts.model))


def fit_request(*, gold_column, old_gold_column, layers, curve, **flags) -> FitRequest:
    """The job's `FitRequest` from fit's flags: the old --label-column merged into --gold-column
    (one COLUMN, or NAME=COLUMN per question of a task with questions), --layers and --curve parsed."""
    from ..jobs.fit import FitRequest

    plain, pairs = parse_gold_columns(gold_column)
    return FitRequest(label_column=gold_column_of(plain, old_gold_column), gold_columns=pairs,
                      taps=parse_layers(layers), curve_sizes=tuple(int_list(curve, "--curve")), **flags)


def parse_layers(layers: str | None) -> Taps | None:
    """--layers as typed (comma-separated: 15 at the last token, mean15 mean-pooled) → the taps; None: not given."""
    if not layers:
        return None
    try:
        taps = Taps.parse(x for x in layers.split(",") if x.strip())
    except ValueError as exc:
        raise TaskError(f"--layers: {exc}") from None
    if not taps or min(taps.last + taps.mean) < 1:
        raise TaskError(f"--layers must list positive layer numbers, got {layers!r}")
    return taps


fit_options = bundle("run", fit_request, [
    click.argument("input_path", metavar="LABELLED_FILE"),
    click.option("-o", "--output", "output_path", required=True,
                 help="The head file to write (.npz; a task with questions: one file of a head per question)."),
    click.option("--text-column", default="text", show_default=True),
    click.option("--gold-column", multiple=True,
                 help="Column of gold labels (tables; default: label). A task with questions: NAME=COLUMN, once per "
                      "question to fit a head for (e.g. --gold-column priority=gold_priority)."),
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
    click.option("--echo/--no-echo", default=None,
                 help="Read each text twice (the text, a newline, the text again) for the features: every token's "
                      "state then has seen the whole text. Default: read the texts once and twice, and let "
                      "cross-validation choose (one pass with --layers or --scores). An echo head's passes take up "
                      "to twice as long; `classify --head` reads the texts as the head was fitted."),
    click.option("--from-descriptions", is_flag=True,
                 help="No gold column: a head from the labels' descriptions (or names) against the file's items, "
                      "by cosine similarity of their states (give the labels with --task or --labels)."),
])


@click.command()
@fit_options
@task_options
def fit(run: FitRequest, opts: ModelOptions):
    """Fit a head on LABELLED_FILE (CSV/JSONL/Parquet with a gold column, or a BIG-bench JSON): a logistic
    regression on the model's hidden states, read on the fast path. Prints cross-validated accuracy,
    macro-F1 and ECE next to zero-shot scoring, and the learning curve. A task with questions: one pass,
    a head per question given a gold column (NAME=COLUMN), all in one file, a row per question."""
    from ..jobs.evaluate import task_for_file
    from ..jobs.fit import fit_file
    from ..jobs.sources import build_task

    check_writes({"the labelled file": run.input_path, "--task": opts.task_file, "--model": opts.model},
                 {"-o": run.output_path, "--json": run.json_path, "--plot": run.plot_path})
    if run.from_descriptions:
        if not (opts.task_file or opts.label_names()):
            raise TaskError("--from-descriptions reads the labels' descriptions: give them with --task FILE (or the "
                            "labels with --labels)")
        task = build_task(opts.task_file, opts.label_names(), **opts.overrides())
        summaries.print_descriptions_fit(fit_file(run, task, opts.settings(), model=opts.model))
        return
    task = task_for_file(run.input_path, run.text_column, run.label_column, task_file=opts.task_file,
                         labels=opts.label_names(), **opts.overrides())
    summary = fit_file(run, task, opts.settings(), model=opts.model)
    task.shaped(lambda t: summaries.print_fit, lambda t: summaries.print_questions_fit)(summary)
