"""The `verify` job: probe items of a table through the fast and the per-item path, compared."""

from __future__ import annotations

import dataclasses

from ..classifier import Classifier, EngineSettings, engine_line
from ..core.task import Task
from ..core.verify import VerifyReport, compare, pick_probes
from ..errors import FieldError
from ..io import read_table
from ..io.readers import item_texts
from .classify import label_lines

__all__ = ["VerifySummary", "verify_table"]


@dataclasses.dataclass(frozen=True)
class VerifySummary:
    """What `verify_table` compared, for the summary."""

    model: str
    mode: str
    mode_reason: str
    calibrated: bool
    label_lines: tuple[str, ...]
    probe_lengths: tuple[int, ...]
    """Prompt tokens of each probe, in input order."""
    engine: str
    report: VerifyReport


def verify_table(input_path: str, task: Task, settings: EngineSettings, *, model=None, text_column="text",
                 fmt=None, errors="strict", probes=16, tolerance=1e-3) -> VerifySummary:
    """Run probe items through both paths; return the comparison (the caller decides what a mismatch means)."""
    if probes < 1:  # a check that checks nothing must not pass
        raise FieldError("probes", "{field} must be at least 1 for verify, got {value}", value=probes)
    fields = task.fields if task.multi_field else ()  # items of several columns, as `classify` reads them
    frame = read_table(input_path, text_column, fmt=fmt if input_path == "-" else None, errors=errors, fields=fields)
    texts = item_texts(frame, text_column, fields, task.compose if fields else None, errors=errors)
    classifier = Classifier(task, model=model, settings=settings, precision_sample=texts)
    encoded = classifier.encode(texts)
    indices = pick_probes(encoded, probes)
    probe_items = encoded.subset(indices)
    fast = classifier.score(probe_items).scores  # the probes batched together: padded rows, the prefix cache
    report = compare(classifier, probe_items, fast, list(range(len(indices))), tolerance)
    return VerifySummary(
        model=classifier.loaded.name, mode=classifier.mode, mode_reason=classifier.mode_reason,
        calibrated=classifier.bias is not None, label_lines=label_lines(classifier),
        probe_lengths=tuple(len(encoded.ids[i]) for i in indices), engine=engine_line(classifier),
        report=report)
