"""Jobs behind the CLI: classify (streaming, see `classify_job`) and verify, with their summaries."""

from __future__ import annotations


import click

from ..classifier import Classifier, EngineSettings
from ..errors import VerificationError
from ..core.labels import describe_labels
from .classify import run_classify
from ..models.precision import auto_line
from ..io import read_table, texts_of
from ..core.results import RunStats
from ..core.task import Task
from ..core.verify import VerifyReport, compare, pick_probes


def _echo(message: str = "") -> None:
    click.echo(message, err=True)


def classify_table(input_path: str, output_path: str, task: Task, settings: EngineSettings, *, model=None,
                   text_column="text", id_column=None, fmt=None, errors="strict", probes=8,
                   gold_column=None, progress=True, result_prefix="", resume=False, restart=False, head=None,
                   scorer="zero-shot", head_source=None) -> None:
    """Classify every row of a table, streaming, into OUTPUT (see `classify_job`); print the summary.

    With a `head` (`head/`) and scorer head or combined, the labels and probabilities are the head's.
    Raises VerificationError after writing when the probe check finds a mismatch.
    """
    outcome = run_classify(input_path, output_path, task, settings, model=model, text_column=text_column,
                           id_column=id_column, fmt=fmt, errors=errors, probes=probes, gold_column=gold_column,
                           progress=progress, result_prefix=result_prefix, resume=resume, restart=restart,
                           head=head, scorer=scorer, head_source=head_source)
    report = outcome.report
    _print_summary(outcome.classifier, outcome.stats, outcome.load_seconds, report, output_path)
    _echo(f"duplicates: {outcome.duplicates} rows took the scores of an identical row of their window"
          + (f"; resumed after {outcome.resumed_at} rows done earlier" if outcome.resumed_at else ""))
    if outcome.gold is not None:
        outcome.gold.print(outcome.labels)
    if report is not None and not report.ok:
        raise VerificationError(f"the output was written, but {report.summary()}; "
                                f"disagreeing rows {list(report.disagreements)}")


def verify_table(input_path: str, task: Task, settings: EngineSettings, *, model=None, text_column="text",
                 fmt=None, errors="strict", probes=16, tolerance=1e-3) -> VerifyReport:
    """Run probe items through both paths; print and return the comparison."""
    frame = read_table(input_path, text_column, fmt=fmt if input_path == "-" else None, errors=errors)
    texts = texts_of(frame, text_column)
    classifier = Classifier(task, model=model, settings=settings, precision_sample=texts)
    encoded = classifier.encode(texts)
    indices = pick_probes(encoded, probes)
    probe_items = encoded.subset(indices)
    fast = classifier.score(probe_items).scores  # the probes batched together: padded rows, the prefix cache
    report = compare(classifier, probe_items, fast, list(range(len(indices))), tolerance)
    _echo(f"model: {classifier.loaded.name}; mode: {classifier.mode} ({classifier.mode_reason}); "
          f"calibrated: {classifier.bias is not None}")
    _echo("labels: " + "; ".join(line.strip() for line in describe_labels(
        classifier.loaded.tokenizer, classifier.task.labels, classifier.label_tokens)))
    lengths = [len(encoded.ids[i]) for i in indices]
    if lengths:
        _echo(f"probes: {len(indices)} rows, prompt tokens {min(lengths)}..{max(lengths)}")
    _echo(f"engine: {engine_line(classifier.loaded)}")
    _echo(f"{report.summary()}; per-item path {report.reference_speed()} on the probes")
    return report


def _print_summary(classifier: Classifier, s: RunStats, load_seconds: float, report: VerifyReport | None,
                   output: str) -> None:
    _echo(f"model: {classifier.loaded.name} (loaded in {load_seconds:.1f} s); "
          f"mode: {classifier.mode} ({classifier.mode_reason}); calibrated: {classifier.bias is not None}")
    _echo("labels: " + "; ".join(line.strip() for line in describe_labels(
        classifier.loaded.tokenizer, classifier.task.labels, classifier.label_tokens)))
    _echo(f"items: {s.items} ({s.scored} scored, {s.items - s.scored} empty) in {s.seconds:.2f} s: "
          f"{s.items_per_s:.1f} items/s, {s.tokens_per_s:.0f} tokens/s")
    _echo(_cap_line(classifier.settings.max_text_tokens))
    _echo(f"batches: {s.batches}; padding: {100 * s.padding_share:.1f}% of processed tokens; "
          f"prefix: {s.prefix_tokens} tokens run once, {s.prefix_reused} reused; fallbacks: {s.fallbacks}")
    _echo(f"engine: {engine_line(classifier.loaded)}")
    if report is not None:
        _echo(f"verify: {report.summary()}; per-item path {report.reference_speed()} on the probes")
    if output != "-":
        _echo(f"wrote {output}")


def engine_line(loaded) -> str:
    """Device, precision, GEMM kernel and the measurement behind the choice, for summaries."""
    line = loaded.backend.describe() if loaded.backend is not None else "cpu fp32"
    rates = loaded.gemm_rates or {}
    if rates.get("rates"):
        measured = ", ".join(f"{k} {v:.0f}" for k, v in rates["rates"].items())
        line += f"; GEMM GFLOP/s on the model's shapes: {measured} ({'cached' if rates.get('cached') else 'measured now'})"
    if auto := auto_line(loaded):
        line += f"; {auto}"
    return line


def _cap_line(cap: int | None) -> str:
    if cap is None:
        return "item texts: no cap (cut only at the model's context)"
    return f"item texts: cut at {cap} tokens (status truncated; --max-tokens N raises the cap, none removes it)"
