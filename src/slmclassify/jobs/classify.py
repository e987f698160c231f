"""The `classify` job: stream a table through the classifier into an output, resumably.

    check output (not the input) → lock OUTPUT → open input (columns) → [partial run? check it, resume
    or refuse] → load model
    → for each chunk of `window` rows: score → append input + result columns to OUTPUT.partial
      → fsync → progress record → … → rename to OUTPUT → probes → summary

The job prints nothing: it returns a `ClassifySummary` (figures as data), and tells its caller
through `on_loaded` when the model is loaded (for lines that must appear before the rows run).

Chunks are the classifier's windows (rows k·W … (k+1)·W − 1), so an interrupted run resumed with
`--resume` scores every item in the same batches as an uninterrupted one, and its output is
byte-identical. Memory is bounded by the window, never by the file. Probe items for the check
against the per-item path are kept as a small pool spread over the prompt lengths seen.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import Counter
from typing import Callable

import numpy as np
import pandas as pd

from ..classifier import Classifier, EngineSettings, engine_line, label_token_lines
from ..core.encode import EncodedItems
from ..core.multilabel import split_labels
from ..errors import InputError, TaskError
from ..head.apply import HeadChoice
from ..models.loading import LoadedModel
from .meter import Meter, MeterFactory, no_meter
from .resume import same_kernels, same_model, saved_run, writing
from .table_request import ClassifyRequest
from ..io.checkpoint import Checkpoint, digest, input_fingerprint
from ..io.formats import check_not_input, check_output
from ..io.lock import OutputLock
from ..io.labelled import gold_text
from ..io.readers import open_table
from ..io.sink import open_sink
from ..io.writers import parquet_schema
from ..core.results import RunStats, check_result_columns, columns_for, result_arrow_fields, result_columns, result_frame
from ..core.taps import Taps
from ..core.task import Task
from ..core.verify import VerifyReport, compare, pick_probes
from ..backends.memory import release_freed_memory


@dataclasses.dataclass(frozen=True)
class ClassifySummary:
    """What a finished classify run did: the figures its summary shows."""

    model: str
    load_seconds: float
    mode: str
    mode_reason: str
    calibrated: bool
    label_lines: tuple[str, ...]
    """Each label and its tokens after the chat template (`describe_labels`)."""
    stats: RunStats
    """The whole run's counts (resumed sessions included)."""
    max_text_tokens: int | None
    engine: str
    """Device, precision and kernel (`classifier.engine_line`)."""
    report: VerifyReport | None
    """The probe check against the per-item path (None: not run)."""
    output: str
    resumed_at: int
    """Rows already done by earlier sessions (0 for a fresh run)."""
    gold: GoldTally | None
    labels: tuple = ()
    """The labels the results use (the task's, or the head's)."""


def run_classify(request: ClassifyRequest, task: Task, settings: EngineSettings, *, model=None,
                 head: HeadChoice = HeadChoice(), on_loaded: Callable[[Classifier], None] | None = None,
                 meter: MeterFactory = no_meter) -> ClassifySummary:
    """Classify every row of a table and write it with the result columns added; returns the summary.

    With a head and scorer head or combined, the result columns are the head's labels and
    probabilities, read from the same pass; probes still check the label scores against the per-item path.
    `on_loaded(classifier)` is called once the model is loaded, before any row is scored; `meter`
    makes the progress meter the rows are counted on.

    Raises `Interrupted` on Ctrl-C/SIGTERM (finished chunks stay in OUTPUT.partial for --resume).
    Refuses, before any work, an output that is the input, and an output another run is writing.
    A failed probe check is in the summary's `report` (the output is written): the caller decides.
    """
    out_fmt = check_output(request.output_path, request.fmt if request.output_path == "-" else None)
    check_not_input(request.input_path, request.output_path)
    lock = OutputLock(request.output_path).acquire() if request.output_path != "-" else None
    try:
        return _run_classify(request, out_fmt, task, settings, model, head, on_loaded, meter)
    finally:
        if lock is not None:
            lock.release()


def _run_classify(request: ClassifyRequest, out_fmt: str, task: Task, settings: EngineSettings, model,
                  choice: HeadChoice, on_loaded, meter: MeterFactory) -> ClassifySummary:
    """open the input → the run's identity → the run to continue, if any → load → stream → probes."""
    resumable = request.output_path != "-" and request.input_path != "-"
    checkpoint = Checkpoint(request.output_path) if request.output_path != "-" else None
    reader, labels = _open_input(request, task, choice)
    identity = _identity(request, out_fmt, task, settings, choice, resumable)
    saved = saved_run(checkpoint, identity, request.resume, request.restart, request.input_path, out_fmt)

    done = saved["rows_done"] if saved is not None else 0
    if settings.precision == "auto" and not isinstance(model, LoadedModel):  # decided when it is prepared
        sample, chunks = _read_ahead(reader, settings.window, done)
    else:
        sample, chunks = None, reader.chunks(settings.window, skip_rows=done)
    started = time.perf_counter()
    classifier = Classifier(task, model=model, settings=settings, precision_sample=sample)
    load_seconds = time.perf_counter() - started
    try:
        if choice.used:
            from ..head.apply import check

            check(choice.head, classifier, choice.source or "the head")
        classifier = _as_recorded(saved, classifier, task, settings)
        if on_loaded is not None:
            on_loaded(classifier)
        same_model(saved, identity, classifier.loaded, checkpoint)
        same_kernels(saved, identity, classifier.loaded, checkpoint)  # recorded: a resumed run computes with them
    except BaseException:
        reader.close()
        raise
    # recorded: and with the same schedule, where that matters (`_as_recorded`)
    identity["schedule"] = {"token_budget": classifier.settings.token_budget, "max_rows": classifier.settings.max_rows}

    # the probes keep the raw scores of every scored sequence (a multi-label task's yes and no branches)
    state = _RunState.restore(saved, classifier.trie.labels, request.probes, len(classifier.prefix_ids),
                              task.readout.gold_separator(task))
    columns = columns_for(task, labels)
    schema = (parquet_schema(reader, result_arrow_fields(columns, request.result_prefix)) if out_fmt == "parquet"
              else list(reader.columns) + result_columns(columns, request.result_prefix))
    sink = open_sink(request.output_path, checkpoint, out_fmt, schema, saved, resumable, identity, request.errors)
    bar = meter(reader.total_rows, reader.total_bytes, state.rows)
    _stream(request, reader, chunks, classifier, choice, labels, state, sink, resumable, bar)

    report = state.verify(classifier) if request.probes > 0 else None
    return ClassifySummary(
        model=classifier.loaded.name, load_seconds=load_seconds, mode=classifier.mode,
        mode_reason=classifier.mode_reason, calibrated=classifier.bias is not None,
        label_lines=label_lines(classifier), stats=state.stats, max_text_tokens=classifier.settings.max_text_tokens,
        engine=engine_line(classifier), report=report, output=request.output_path,
        resumed_at=state.resumed_at,
        gold=state.gold if request.gold_column is not None else None, labels=tuple(labels))


def _open_input(request: ClassifyRequest, task: Task, choice: HeadChoice):
    """(the input's reader, the labels the results use); refuses, before the model loads, what cannot run."""
    if request.resume and request.input_path == "-":
        raise InputError("{resume} needs an input file (stdin cannot be read again)", names={"resume": "resume"})
    if request.resume and request.output_path == "-":
        raise InputError("{resume} needs an output file (stdout cannot be appended to)", names={"resume": "resume"})
    reader = open_table(request.input_path, request.text_column, fmt=request.fmt if request.input_path == "-" else None,
                        errors=request.errors, id_column=request.id_column,
                        fields=task.fields if task.multi_field else (), compose=task.compose)
    gold_column = request.gold_column
    if gold_column is not None and columns_for(task).named:  # a tally counts one label per row; each question has its own
        raise TaskError("{gold} counts one label per row, and this task asks questions: measure each question with "
                        "`slmclassify evaluate FILE --task TASK --gold-column NAME=COLUMN` (one per question)",
                        names={"gold": "gold_column"})
    if gold_column is not None and gold_column not in reader.columns:
        raise InputError(f"no gold column {gold_column!r}; columns are: {', '.join(map(str, reader.columns))}")
    if choice.used:  # a task with questions: heads per question (`head/questions.py`), the rest zero-shot
        from ..head.apply import check_scorer

        check_scorer(choice.head, task.labels, choice.scorer, task)
    labels = choice.labels(task)
    check_result_columns(reader.columns, columns_for(task, labels), request.result_prefix)
    return reader, labels


def _identity(request: ClassifyRequest, out_fmt: str, task: Task, settings: EngineSettings, choice: HeadChoice,
              resumable: bool) -> dict:
    """What a resumed run must share with the run it continues (digests, and the values shown when not)."""
    shown = {"window": settings.window, "token_budget": settings.token_budget, "max_rows": settings.max_rows,
             "max_text_tokens": settings.max_text_tokens, "text_column": request.text_column,
             "id_column": request.id_column, "errors": request.errors, "result_prefix": request.result_prefix,
             "output_format": out_fmt}
    identity = {"task": digest(repr(task)), "settings": digest([repr(settings), shown]), "settings_shown": shown}
    identity["task_shown"] = _task_shown(task)
    identity["head"] = None  # a resumed run must apply the same head (file contents) with the same scorer
    identity["head_shown"] = {"head": choice.source if choice.used else None,
                              "scorer": choice.scorer if choice.used else None}
    if choice.used:
        from ..io.hashing import file_sha256

        identity["head"] = digest([file_sha256(choice.source) if choice.source else repr(choice.head.coef.tolist()),
                                   choice.scorer])
    if resumable:
        identity["input"] = input_fingerprint(request.input_path)
    return identity


def _stream(request: ClassifyRequest, reader, chunks, classifier: Classifier, choice: HeadChoice, labels,
            state: _RunState, sink, resumable: bool, bar: Meter) -> None:
    """Score each chunk and append it, with its result columns, to the sink; on Ctrl-C/SIGTERM or a
    failed write, keep the finished chunks for --resume and raise what the user reads."""
    gold_column = request.gold_column
    results = choice.results_step()
    taps = choice.head.taps if choice.used else Taps()
    with writing(sink, state, bar, reader.close):
        for start, frame in chunks:
            window = classifier.score_items(reader.texts(frame), taps=taps, results=results, start=start)
            results_frame = result_frame(window.results, columns_for(classifier.task, labels), request.result_prefix,
                                         index=frame.index, lists=sink.fmt in ("jsonl", "parquet"))
            task = classifier.task  # a gold cell as its answer would be spelled (label sets: in task order)
            gold = ([task.readout.gold(gold_text(v, task.label_separator), task) for v in frame[gold_column]]
                    if gold_column else None)
            state.add(window, gold)
            sink.write(pd.concat([frame, results_frame], axis=1), state,
                       reader.read_digest() if resumable else None)
            bar.update(len(frame), reader.bytes_read)
            release_freed_memory()  # the window's frames and activations: freed, but glibc's arenas keep the pages


def label_lines(classifier: Classifier) -> tuple[str, ...]:
    """Each label of the classifier's task and its tokens after the chat template, one line each."""
    return tuple(line.strip() for line in label_token_lines(classifier))


def _read_ahead(reader, window: int, skip_rows: int):
    """(`--precision auto`'s sample of the input, the chunks to run): the sample is read ahead
    (`precision.input_sample`: a bounded number of rows) and the chunks read for it are held and
    yielded first, so every row after `skip_rows` still comes once and in order. The sample starts at
    row 0 even when resuming: the same file gets the same check, hence the same (cached) precision."""
    from ..models.precision import input_sample

    chunks = reader.chunks(window)
    held: list = []

    def texts():
        for start, frame in chunks:
            held.append((start, frame))
            yield from reader.texts(frame)

    sample = input_sample(texts())
    return sample, _after(itertools.chain(held, chunks), skip_rows)


def _after(chunks, skip_rows: int):
    """The (start, frame) chunks from row `skip_rows` on."""
    for start, frame in chunks:
        if start + len(frame) <= skip_rows:
            continue
        if start < skip_rows:
            frame, start = frame.iloc[skip_rows - start:], skip_rows
        yield start, frame


def _as_recorded(saved: dict | None, classifier: Classifier, task: Task, settings: EngineSettings) -> Classifier:
    """The classifier of a resumed run computing as the interrupted run did, from what that run
    recorded (`identity["gemm"]`, `identity["schedule"]`), so that the output is byte-identical:

    - on its GEMM kernel: a choice measured again between the sessions may pick another exact kernel
      (mm or oneDNN), and the two round differently in the last digits;
    - on its batch schedule only where the engine is not batch-invariant (`Engine.batch_variance`, e.g.
      int8-onednn, whose rows share a quantisation range, or torch's attention): elsewhere an item's
      scores are the same bits in any batch, and the schedule measured now is used.

    Another precision or model is refused by `resume.same_model`, a recorded kernel that cannot run
    here now by `resume.same_kernels`, naming them."""
    from ..backends import gemm
    from ..models.engines import with_backend

    saved = saved or {}
    recorded, loaded = saved.get("gemm"), classifier.loaded
    runs = gemm.fp32_kernels(loaded.backend.device) if loaded.backend.precision == "fp32" else gemm.KERNELS
    if (isinstance(recorded, dict) and recorded.get("precision") == loaded.backend.precision
            and recorded.get("kernel") in runs and recorded.get("kernel") != loaded.backend.gemm):
        backend = dataclasses.replace(loaded.backend, gemm=recorded["kernel"])
        classifier = Classifier(task, model=with_backend(loaded, backend), settings=settings)
    schedule = saved.get("schedule")
    now = {"token_budget": classifier.settings.token_budget, "max_rows": classifier.settings.max_rows}
    if classifier.engine.batch_invariant or not isinstance(schedule, dict) or schedule == now:
        return classifier
    return classifier.variant(dataclasses.replace(classifier.settings, **schedule))


def _task_shown(task: Task) -> dict:
    """The task's fields as JSON values, so that a refused --resume can name what changed."""
    shown = {f.name: getattr(task, f.name) for f in dataclasses.fields(task)}
    shown["examples"] = [[e.text, e.label] for e in task.examples]
    shown["questions"] = [{"name": q.name, "question": q.question, **_task_shown(q.task)} for q in task.questions]
    return {k: list(v) if isinstance(v, tuple) else v for k, v in shown.items()}


# --------------------------------------------------------------------------- run state


@dataclasses.dataclass
class _RunState:
    """What the summary needs from all chunks so far (saved in the progress record)."""

    labels: tuple
    probes: int
    prefix_len: int
    rows: int = 0
    resumed_at: int = 0
    stats: RunStats = dataclasses.field(default_factory=RunStats)
    pool: list = dataclasses.field(default_factory=list)
    """Probe candidates: [row, prompt length, cached, own ids, status, fast scores]."""
    gold: GoldTally = None

    @classmethod
    def restore(cls, saved, labels, probes, prefix_len, separator: str | None = None) -> _RunState:
        state = cls(tuple(labels), probes, prefix_len, gold=GoldTally(separator=separator))
        state.stats.prefix_tokens = prefix_len
        if saved:
            data = saved["state"]
            state.rows = state.resumed_at = saved["rows_done"]
            state.stats = RunStats(**data["stats"])
            state.pool = data["pool"]
            state.gold = GoldTally(**data["gold"])
        return state

    def to_json(self) -> dict:
        return {"stats": dataclasses.asdict(self.stats), "pool": self.pool, "gold": dataclasses.asdict(self.gold)}

    def add(self, window, gold: list[str] | None) -> None:
        self.rows += len(window.results)
        self.stats.add(window.stats)
        if gold is not None:
            self.gold.add(gold, window.results)
        if self.probes > 0:
            enc = window.encoded
            for i in pick_probes(enc, self.probes):
                self.pool.append([window.start + i, enc.prompt_length(i), bool(enc.cached[i]),
                                  enc.own(i).tolist(), enc.status[i], window.scores[i].tolist()])
            self.pool = _spread(self.pool, self.probes)

    def verify(self, classifier: Classifier) -> VerifyReport:
        pool = sorted(self.pool)  # input order
        encoded = EncodedItems.join([np.asarray(p[3], dtype=np.int32) for p in pool], [p[4] for p in pool],
                                    [p[2] for p in pool], classifier.prefix_ids)
        fast = np.array([p[5] for p in pool], dtype=np.float64).reshape(len(pool), len(self.labels))
        report = compare(classifier, encoded, fast, list(range(len(pool))))
        rows = [p[0] for p in pool]
        return dataclasses.replace(report, indices=tuple(rows),
                                   disagreements=tuple(rows[k] for k in report.disagreements))


def _spread(pool: list, n: int) -> list:
    """At most n candidates evenly spread over prompt length (shortest and longest kept)."""
    if len(pool) <= n:
        return pool
    by_length = sorted(pool, key=lambda p: (p[1], p[0]))
    picks = np.unique(np.linspace(0, len(by_length) - 1, num=n).round().astype(int))
    return [by_length[k] for k in picks]


@dataclasses.dataclass
class GoldTally:
    """Accuracy vs a gold column, counted chunk by chunk."""

    scored: int = 0
    correct: int = 0
    confident: int = 0
    confident_correct: int = 0
    predicted: dict = dataclasses.field(default_factory=dict)
    gold: dict = dataclasses.field(default_factory=dict)
    separator: str | None = None
    """A multi-label task's label separator: gold cells and predictions are label sets (None: single labels)."""

    def add(self, gold: list[str], results) -> None:
        predicted, golds = Counter(self.predicted), Counter(self.gold)
        for g, r in zip(gold, results):
            if r.label is None:
                continue
            self.scored += 1
            self.correct += g == r.label
            predicted[r.label] += 1
            golds[g] += 1
            if not r.needs_review:
                self.confident += 1
                self.confident_correct += g == r.label
        self.predicted, self.gold = dict(predicted), dict(golds)

    def unknown(self, labels) -> list[str]:
        """Gold labels that are not among `labels`, sorted (rows with them count as wrong); a multi-label
        tally's gold cells hold label sets: its unknown cells are those naming a label not in `labels`
        (the empty set is a label set)."""
        if self.separator is None:
            return sorted(set(self.gold) - set(labels))
        return sorted(g for g in self.gold if set(split_labels(g, self.separator)) - set(labels))
