"""Whole-file jobs behind the CLI: read → classify → verify → write, with a progress bar and summary."""

from __future__ import annotations

import sys
import time

import click
import pandas as pd

from .classifier import Classifier, EngineSettings
from .errors import InputError, VerificationError
from .labels import describe_labels
from .results import make_results
from .tables import read_table, texts_of, write_table
from .task import Task
from .verify import VerifyReport, compare, pick_probes


def _echo(message: str = "") -> None:
    click.echo(message, err=True)


def classify_table(input_path: str, output_path: str, task: Task, settings: EngineSettings, *, model=None,
                   text_column="text", id_column=None, fmt=None, errors="strict", probes=8,
                   gold_column=None, progress=True, result_prefix="", head=None, scorer="zero-shot",
                   head_source=None) -> pd.DataFrame:
    """Classify every row of a table and write it with the result columns added.

    With a `head` (`head/`) and scorer head or combined, the labels and probabilities are the head's.
    Raises VerificationError after writing when the probe check finds a mismatch.
    """
    use_head = head is not None and scorer != "zero-shot"
    labels = head.labels if use_head else task.labels
    frame = read_table(input_path, text_column, fmt=fmt if input_path == "-" else None, errors=errors,
                       id_column=id_column)
    if gold_column is not None and gold_column not in frame.columns:
        raise InputError(f"no gold column {gold_column!r}; columns are: {', '.join(map(str, frame.columns))}")
    columns = [result_prefix + c for c in result_columns(labels)]
    clash = [c for c in columns if c in frame.columns]
    if clash:
        raise InputError(f"the input already has column {clash[0]!r}; pass --result-prefix (e.g. pred_) "
                         "so the results do not overwrite it")
    texts = texts_of(frame, text_column)
    started = time.perf_counter()
    classifier = Classifier(task, model=model, settings=settings)
    load_seconds = time.perf_counter() - started
    if use_head:
        from .head.apply import check

        check(head, classifier, head_source or "the head")
        _echo(f"scorer: {scorer} ({head_source or 'head'}: {len(head.labels)} labels, layers {list(head.taps)})")
    encoded = classifier.encode(texts)
    bar = _progress_bar(len(encoded.scored), enabled=progress)
    if use_head:
        from .head.apply import score_with_head

        scores, results = score_with_head(classifier, encoded, head, scorer, progress=bar.update)
    else:
        scores = classifier.score(encoded, progress=bar.update)
        results = make_results(task.labels, scores, classifier.calibrated(scores), encoded.status, task.min_confidence)
    bar.close()
    report = compare(classifier, encoded, scores, pick_probes(encoded, probes)) if probes > 0 else None

    values = [[r.label, r.confidence, r.needs_review, *(r.probabilities.get(lab) for lab in labels), r.status]
              for r in results]
    out = frame.copy()
    for j, column in enumerate(columns):
        out[column] = [row[j] for row in values]
    assert len(out) == len(frame), "every input row must yield one output row"
    write_table(out, output_path, fmt if output_path == "-" else None)

    _print_summary(classifier, load_seconds, report, output_path)
    if gold_column is not None:
        _print_accuracy(frame[gold_column].astype(str).tolist(), results)
    if report is not None and not report.ok:
        raise VerificationError(f"the output was written, but {report.summary()}; "
                                f"disagreeing rows {list(report.disagreements)}")
    return out


def result_columns(labels) -> list[str]:
    """The columns classify adds, in order."""
    return ["label", "confidence", "needs_review", *(f"p_{label}" for label in labels), "status"]


def verify_table(input_path: str, task: Task, settings: EngineSettings, *, model=None, text_column="text",
                 fmt=None, errors="strict", probes=16, tolerance=1e-3) -> VerifyReport:
    """Run probe items through both paths; print and return the comparison."""
    frame = read_table(input_path, text_column, fmt=fmt if input_path == "-" else None, errors=errors)
    classifier = Classifier(task, model=model, settings=settings)
    encoded = classifier.encode(texts_of(frame, text_column))
    indices = pick_probes(encoded, probes)
    probe_items = encoded.subset(indices)
    fast = classifier.score(probe_items)  # the probes batched together: padded rows, the prefix cache
    report = compare(classifier, probe_items, fast, list(range(len(indices))), tolerance)
    _echo(f"model: {classifier.loaded.name}; mode: {classifier.mode} ({classifier.mode_reason})")
    lengths = [len(encoded.ids[i]) for i in indices]
    if lengths:
        _echo(f"probes: {len(indices)} rows, prompt tokens {min(lengths)}..{max(lengths)}")
    _echo(report.summary())
    return report


def _progress_bar(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="item", file=sys.stderr, disable=not (enabled and sys.stderr.isatty()), dynamic_ncols=True, leave=False)


def _print_summary(classifier: Classifier, load_seconds: float, report: VerifyReport | None, output: str) -> None:
    s = classifier.stats
    _echo(f"model: {classifier.loaded.name} (loaded in {load_seconds:.1f} s); "
          f"mode: {classifier.mode} ({classifier.mode_reason}); calibrated: {classifier.bias is not None}")
    _echo("labels: " + "; ".join(line.strip() for line in describe_labels(
        classifier.loaded.tokenizer, classifier.task.labels, classifier.label_tokens)))
    _echo(f"items: {s.items} ({s.scored} scored, {s.items - s.scored} empty) in {s.seconds:.2f} s: "
          f"{s.items_per_s:.1f} items/s, {s.tokens_per_s:.0f} tokens/s")
    _echo(f"batches: {s.batches}; padding: {100 * s.padding_share:.1f}% of processed tokens; "
          f"prefix: {s.prefix_tokens} tokens run once, {s.prefix_reused} reused; fallbacks: {s.fallbacks}")
    if report is not None:
        _echo(f"verify: {report.summary()}; per-item path {report.reference_items_per_s:.1f} items/s on the probes")
    if output != "-":
        _echo(f"wrote {output}")


def _print_accuracy(gold: list[str], results) -> None:
    predicted = [r.label for r in results]
    scored = [(g, p) for g, p in zip(gold, predicted) if p is not None]
    if not scored:
        return
    correct = sum(g == p for g, p in scored)
    counts = {str(k): int(v) for k, v in pd.Series([p for _, p in scored]).value_counts().items()}
    majority = pd.Series([g for g, _ in scored]).value_counts().iloc[0] / len(scored)
    _echo(f"accuracy vs gold: {correct}/{len(scored)} = {correct / len(scored):.3f} "
          f"(majority class {majority:.3f}); predicted: {counts}")
    confident = [(g, p) for (g, p), r in zip(scored, [r for r in results if r.label is not None]) if not r.needs_review]
    if confident:
        ok = sum(g == p for g, p in confident)
        _echo(f"  auto-labelled (not needs_review): {len(confident)}/{len(scored)}, accuracy {ok / len(confident):.3f}")
