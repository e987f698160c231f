"""The summaries the commands print, from the figures the jobs return. Nothing here computes: each
function turns one summary dataclass into the lines a user reads (stderr for classify and verify,
whose stdout may be the output; stdout for evaluate and fit, whose report is the output)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import click

from ..head.fitting import ANCHOR_WEIGHT
from ..core.readout import Kinds


def _err(message: str = "") -> None:
    click.echo(message, err=True)


def _out(message: str = "") -> None:
    click.echo(message)


def cap_line(cap: int | None) -> str:
    if cap is None:
        return "item texts: no cap (cut only at the model's context)"
    return f"item texts: cut at {cap} tokens (status truncated; --max-tokens N raises the cap, none removes it)"


def print_loaded(classifier, head=None) -> None:
    """While classify runs, once the model is loaded: `--precision auto`'s decision and the head's scorer."""
    from ..models.precision import auto_line

    if line := auto_line(classifier.loaded):
        _err(line)
    if head is not None and head.used:
        from ..head.model import QuestionHeads

        h = head.head
        if isinstance(h, QuestionHeads):
            rest = [q.name for q in classifier.task.questions if q.name not in h.heads]
            what = f"heads for {', '.join(h.heads)}" + (f"; zero-shot for {', '.join(rest)}" if rest else "")
        else:
            what = f"{len(h.labels)} labels"
        _err(f"scorer: {head.scorer} ({head.source or 'head'}: {what}, layers {h.taps.describe()})")


def print_classify(summary) -> None:
    """`classify`'s summary (`jobs.classify.ClassifySummary`)."""
    s = summary.stats
    _err(f"model: {summary.model} (loaded in {summary.load_seconds:.1f} s); "
         f"mode: {summary.mode} ({summary.mode_reason}); calibrated: {summary.calibrated}")
    _err("labels: " + "; ".join(summary.label_lines))
    _err(f"items: {s.items} ({s.scored} scored, {s.items - s.scored} empty) in {s.seconds:.2f} s: "
         f"{s.items_per_s:.1f} items/s, {s.tokens_per_s:.0f} tokens/s")
    _err(cap_line(summary.max_text_tokens))
    _err(f"batches: {s.batches}; padding: {100 * s.padding_share:.1f}% of processed tokens; "
         f"prefix: {s.prefix_tokens} tokens run once, {s.prefix_reused} reused; fallbacks: {s.fallbacks}")
    _err(f"engine: {summary.engine}")
    if summary.report is not None:
        _err(f"verify: {summary.report.summary()}; per-item path {summary.report.reference_speed()} on the probes")
    if summary.output != "-":
        _err(f"wrote {summary.output}")
    _err(f"duplicates: {summary.stats.reused} rows took the scores of an identical row of their window"
         + (f"; resumed after {summary.resumed_at} rows done earlier" if summary.resumed_at else ""))
    if summary.gold is not None:
        _print_gold(summary.gold, summary.labels)


def _print_gold(tally, labels) -> None:
    if not tally.scored:
        return
    unknown = tally.unknown(labels)
    if unknown:  # `evaluate` refuses such a file; here the labels are written all the same
        rows = sum(tally.gold[g] for g in unknown)
        shown = ", ".join(map(repr, unknown[:5])) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        _err(f"warning: {rows} scored rows have a gold label that is not a label of the task ({shown}); "
             "they count as wrong below")
    counts = dict(sorted(tally.predicted.items(), key=lambda kv: -kv[1]))
    majority = max(tally.gold.values()) / tally.scored
    what, common = ("exact label sets (subset accuracy)", "most common set") if tally.separator else ("accuracy", "majority class")
    _err(f"{what} vs gold: {tally.correct}/{tally.scored} = {tally.correct / tally.scored:.3f} "
         f"({common} {majority:.3f}); predicted: {counts}")
    if tally.confident:
        _err(f"  auto-labelled (not needs_review): {tally.confident}/{tally.scored}, "
             f"accuracy {tally.confident_correct / tally.confident:.3f}")


def print_verify(summary) -> None:
    """`verify`'s summary (`jobs.verify.VerifySummary`)."""
    _err(f"model: {summary.model}; mode: {summary.mode} ({summary.mode_reason}); calibrated: {summary.calibrated}")
    _err("labels: " + "; ".join(summary.label_lines))
    lengths = summary.probe_lengths
    if lengths:
        _err(f"probes: {len(lengths)} rows, prompt tokens {min(lengths)}..{max(lengths)}")
    _err(f"engine: {summary.engine}")
    _err(f"{summary.report.summary()}; per-item path {summary.report.reference_speed()} on the probes")


def print_ray(summary) -> None:
    """`classify --ray`'s summary (`jobs.ray_classify.RaySummary`)."""
    from ..ray.sharing import SHARED_ITEMS

    info, total, seconds = summary.model, summary.total, summary.seconds
    if info:
        _err(f"model: {info['model']} (loaded in {info['load_seconds']:.1f} s per actor); "
             f"mode: {info['mode']} ({info['mode_reason']}); calibrated: {info['calibrated']}")
        _err("labels: " + "; ".join(info["labels"]))
    where = summary.address or "a local Ray on this machine"
    _err(f"ray: {summary.actors} actors × {summary.cpus_per_actor:g} CPU ({summary.threads} torch threads each) on "
         f"{where} ({summary.feed}); "
         f"blocks of at most {summary.block_rows} rows; actor processes started: {len(summary.actor_figures)}")
    rate = summary.rows / seconds if seconds else 0.0
    _err(f"items: {summary.rows} ({total.scored} scored, {total.items - total.scored} empty) in {seconds:.2f} s: "
         f"{rate:.1f} items/s, {(total.real_tokens + total.prefix_reused) / seconds if seconds else 0:.0f} tokens/s")
    _err(f"batches: {total.batches}; padding: {100 * total.padding_share:.1f}% of processed tokens; "
         f"prefix: {total.prefix_tokens} tokens run once per actor, {total.prefix_reused} reused; "
         f"fallbacks: {total.fallbacks}; duplicates: {total.reused} rows took the scores of an identical row "
         f"run by any actor; run through the model: {summary.scored_by_model}")
    shared = summary.shared
    if shared:
        _err(f"shared scores: {shared['kept']} distinct items kept on the board, {shared['forgotten']} forgotten "
             f"(at most {SHARED_ITEMS:,})")
    driver = "" if summary.began_after_driver_s is None else (
        f" (began {summary.began_after_driver_s:.2f} s after the driver process started, which handed Ray "
        f"the work {summary.submitted_after_driver_s:.2f} s after it started)")
    _err(f"phases: ray.init {summary.ray_init_s:.2f} s{driver}; from handing Ray the work (0 s) to the last row "
         f"written {seconds:.2f} s")
    for actor in summary.actor_figures:
        s = actor.stats
        _err(f"  actor {actor.key}: {actor.rows} rows in {actor.blocks} blocks, busy {actor.busy_s:.2f} s, "
             f"{s.items_per_s:.1f} items/s, padding {100 * s.padding_share:.1f}%, "
             f"run through the model {actor.scored_by_model}, waited {actor.waited_s:.2f} s for items other "
             f"actors were running; {_actor_phases(actor.phases)}")
    _err("verify: not run under --ray (each actor runs the same fast path; check a sample with "
         "`slmclassify verify`)")
    _err(f"wrote {summary.output}")


def _actor_phases(phases: dict) -> str:
    from ..jobs.ray_classify import phase_words

    return f"at {phase_words(phases)} s"


def print_multilabel_evaluate(summary) -> None:
    """`evaluate`'s report of a multi-label task (`jobs.evaluate.MultiLabelSummary`), on stdout."""
    task = summary.task
    _out(f"model: {summary.model}; {summary.items} items; multi-label, labels {list(task.labels)}")
    _out(f"instruction: {task.instruction!r}; calibrate: {task.calibrate}")
    _out("branch tokens (after the chat template):")
    for line in summary.label_token_lines:
        _out(line)
    if summary.scorer != "zero-shot":
        _out(f"scorer: {summary.scorer} (a one-vs-rest head); zero-shot alongside")
        if summary.items_used_to_fit:
            _out(f"warning: {summary.items_used_to_fit} of these {summary.items} items fitted the head: its figures "
                 "on them are optimistic; evaluate on items it was not fitted on")
    ours = "the head's" if summary.scorer != "zero-shot" else "the task's"
    rows = [(f"at {ours} thresholds", summary.at_task),
            ("at thresholds picked on the other half (cross-fitted)", summary.cross_fitted)]
    if summary.zero_shot is not None:
        rows.append(("zero-shot, at thresholds picked on the other half (cross-fitted)", summary.zero_shot))
    for title, m in rows:
        _out(f"\n{title}: micro-F1 {m['micro_f1']:.3f}   macro-F1 {m['macro_f1']:.3f}   "
             f"subset accuracy {m['subset_accuracy']:.3f}   Hamming loss {m['hamming_loss']:.3f}   ({m['items']} items)")
        width = max(len(label) for label in task.labels)
        _out(f"  {'label':<{width}}  precision  recall     f1  support")
        for label, e in m["per_label"].items():
            _out(f"  {label:<{width}}  {e['precision']:9.3f}  {e['recall']:6.3f}  {e['f1']:5.3f}  {e['support']:7d}")
    goal = (f"lowest reaching precision {summary.target_precision:g}" if summary.target_precision is not None
            else "F1-optimal")
    picked = ", ".join(f"{label} {'none' if t is None else f'{t:.3f}'}" for label, t in zip(task.labels, summary.picked))
    _out(f"\nthresholds picked on all {summary.items} items ({goal}): {picked}")
    _print_written(summary)


def print_evaluate(summary) -> None:
    """`evaluate`'s report (`jobs.evaluate.EvaluateSummary`), on stdout."""
    from ..core.metrics import format_report

    task = summary.task
    _out(f"model: {summary.model}; {summary.items} items; labels {list(task.labels)}")
    if summary.precision_line:
        _out(summary.precision_line)
    _out(f"system turn: {task.system!r}" if task.system is not None else f"instruction: {task.instruction!r}")
    _out(f"mode: {summary.mode} ({summary.mode_reason}); calibrate: {task.calibrate}; "
         f"temperature: {task.temperature:g}")
    _out("label tokens (after the chat template):")
    for line in summary.label_token_lines:
        _out(line)
    if summary.fitted_temperature is not None:
        _out(f"fitted temperature: {summary.fitted_temperature:.3f}")
    if summary.head is not None:
        _print_head(summary)
    _out(format_report(summary.main))
    if summary.uncalibrated:
        raw, cal = summary.uncalibrated, summary.main
        _out(f"without calibration (same scores): accuracy {raw['accuracy']:.3f}, macro-F1 {raw['macro_f1']:.3f}, "
             f"ECE {raw['ece']:.3f}")
        if raw["accuracy"] > cal.accuracy + 0.02:
            _out(f"calibration cost {100 * (raw['accuracy'] - cal.accuracy):.1f} accuracy points here: with labels far "
                 f"from balanced it can (docs/calibration.md); consider calibrate = false")
    if summary.modes:
        _out("\nmode comparison (same items, one run each):")
        _out(f"{'mode':<12} {'calibrated':>10} {'accuracy':>9} {'macro-F1':>9} {'ECE':>7} {'items/s':>8}")
        for row in summary.modes:
            _out(f"{row['mode']:<12} {str(row['calibrated']):>10} {row['accuracy']:>9.3f} {row['macro_f1']:>9.3f} "
                 f"{row['ece']:>7.3f} {row['items_per_s']:>8.1f}")
    if summary.fewshot_cost:
        cost = summary.fewshot_cost
        base, shots = (v for k, v in cost.items() if k != "cost_ratio")
        _out(f"\nfew-shot cost: prefix {base['prefix_tokens']} -> {shots['prefix_tokens']} tokens (computed once); "
             f"{base['ms_per_item']:.1f} -> {shots['ms_per_item']:.1f} ms per item ({cost['cost_ratio']:.2f}x)")
    for path in summary.plots:
        _out(f"wrote {path}")
    _print_written(summary)


def print_evaluation(summary) -> None:
    """The report of a task of labels' evaluation, by the figures `evaluate_file` returned (its
    readout's report: one label's or several labels')."""
    summary.task.readout.pick(_EVALUATE_REPORTS)(summary)


def print_questions_evaluate(summary) -> None:
    """`evaluate`'s report of a task with questions (`jobs.evaluate.QuestionsSummary`), on stdout: a
    row per question with a gold column."""
    task = summary.task
    _out(f"model: {summary.model}; {summary.items} items; questions {[q.name for q in task.asked]}, "
         "scored in one pass")
    if summary.precision_line:
        _out(summary.precision_line)
    _out(f"system turn: {task.system!r}" if task.system is not None else f"instruction: {task.instruction!r}")
    _out(f"mode: {summary.mode} ({summary.mode_reason}); calibrate: "
         + ", ".join(f"{q.name} {q.task.calibrate}" for q in task.asked))
    _out("branch tokens (after the chat template):")
    for line in summary.label_token_lines:
        _out(line)
    width = max([len("question")] + [len(r.name) for r in summary.questions])
    column = max([len("gold column")] + [len(r.gold_column) for r in summary.questions])
    _out(f"\n{'question':<{width}}  {'gold column':<{column}}  {'kind':<11} {'accuracy':>8} {'macro-F1':>8} "
         f"{'micro-F1':>8} {'ECE':>6} {'majority':>8}   uncalibrated: accuracy macro-F1    ECE")
    dash = "-"
    for r in summary.questions:  # each question's figures know their cells (`core/figures.py`)
        figures = " ".join(f"{dash:>{w}}" if v is None else f"{v:>{w}.3f}" for v, w in zip(r.cells(), (8, 8, 8, 6)))
        raw = r.uncalibrated
        plain = f"{raw['accuracy']:>24.3f} {raw['macro_f1']:>8.3f} {raw['ece']:>6.3f}" if raw else f"{dash:>24}"
        _out(f"{r.name:<{width}}  {r.gold_column:<{column}}  {r.kind:<11} {figures} {r.majority:>8.3f} {plain}")
    for footnote in dict.fromkeys(r.footnote for r in summary.questions if r.footnote):  # once each, in order
        _out(footnote)
    for r in summary.questions:
        for line in r.notes():
            _out(line)
    if summary.not_reported:
        _out(f"not reported (scored, no gold column): {', '.join(summary.not_reported)}; add --gold-column "
             f"{summary.not_reported[0]}=COLUMN to measure it")
    if summary.json_path:
        _out(f"wrote {summary.json_path}")


def _print_written(summary) -> None:
    """What an evaluation wrote besides the plots: the values put into the task file, and the JSON."""
    if summary.task_values:
        _out(f"wrote {', '.join(f'{k} = {v}' for k, v in summary.task_values.items())} into {summary.task_file}")
    if summary.json_path:
        _out(f"wrote {summary.json_path}")


def _print_head(summary) -> None:
    head, extra = summary.head, summary.main.extra
    if extra.get("items_used_to_fit"):
        _out(f"warning: {extra['items_used_to_fit']} of these {summary.items} items were used to fit the head, so its "
             f"figures on them are optimistic; `slmclassify fit` prints cross-validated ones")
    if "zero_shot" in extra:
        z = extra["zero_shot"]
        _out(f"zero-shot on the same items: accuracy {z['accuracy']:.3f}, macro-F1 {z['macro_f1']:.3f}, "
             f"ECE {z['ece']:.3f}")
    _out(f"scorer: {extra['scorer']} (head: {len(head.labels)} labels, layers {head.taps.describe()}, "
         f"fitted on {head.info.get('items')} items)")


def print_fit(summary) -> None:
    """`fit`'s report (`jobs.fit.FitSummary`), on stdout."""
    if summary.skipped:
        _out(f"skipping {summary.skipped} empty texts")
    if summary.precision_line:
        _out(summary.precision_line)
    _out(f"model: {summary.model}; {summary.items} items, {len(summary.counts)} labels {summary.counts}")
    _out(f"features: layers {summary.taps.describe()} ({summary.feature_values} values)"
         f"{' + calibrated label scores' if summary.use_scores else ''}, {summary.choice}; "
         f"{'one fast-path pass' if summary.passes == 1 else 'two fast-path passes (each text read once, then twice)'} "
         f"in {summary.seconds:.1f} s")
    anchored = summary.head.info.get("anchors") or {}
    if anchored:
        _out(f"anchors: the descriptions of {', '.join(anchored)} read as items, each learnt from as "
             f"{ANCHOR_WEIGHT} items in every fit")
    for warning in summary.warnings:
        _out(f"warning: {warning}")
    summary.head.readout.pick(_FIT_TABLES)(summary)


def _print_one_label_fit(summary) -> None:
    """The rest of `fit`'s report for a softmax head: the scorers' table and the learning curve."""
    if summary.taps.echo and summary.passes == 1:  # no pass of the texts read once
        _out("zero-shot: not shown (the pass read each text twice, --echo: its label scores are not the task's)")
    elif not summary.zero_shot_comparable:
        _out("zero-shot: not comparable (the gold labels are not all in the task's label set)")
    _out(f"\n{'scorer':<18} {'accuracy':>9} {'macro-F1':>9} {'ECE':>7}")
    for row in summary.rows:
        _out(f"{row.name:<18} {row.accuracy:>9.3f} {row.macro_f1:>9.3f} {row.ece:>7.3f}")
    if summary.curve:
        _out(f"\nlearning curve ({summary.folds}-fold CV, tested on every held-out item):")
        _out(f"{'per label':>9} {'items':>6} {'accuracy':>9}")
        for n, acc in summary.curve:
            _out(f"{n:>9} {n * len(summary.counts):>6} {acc:>9.3f}")
        _out(f"wrote {summary.plot_path}")
    else:
        _out(f"\nlearning curve: none (its smallest size, {min(summary.curve_sizes)} per label, needs more than the "
             f"{summary.smallest_fold} per label a training fold holds here)")
    _out(f"C = {summary.C:g} (chosen by {summary.folds}-fold CV on all items); wrote {summary.output}")
    if summary.json_path:
        _out(f"wrote {summary.json_path}")


def print_descriptions_fit(summary) -> None:
    """`fit --from-descriptions`'s report (`jobs.fit.DescriptionsFitSummary`), on stdout."""
    if summary.precision_line:
        _out(summary.precision_line)
    _out(f"model: {summary.model}; a head from the labels' words, centred on {summary.items} items; layer "
         f"{summary.taps.describe()}; one fast-path pass in {summary.seconds:.1f} s")
    for label, words in summary.labels:
        _out(f"  {label}: {words!r}")
    _out(f"wrote {summary.output}; no gold was read: measure it with `slmclassify evaluate FILE --gold-column COLUMN "
         f"--head {summary.output}`")


def _print_multilabel_fit(summary) -> None:
    """The rest of `fit`'s report for one-vs-rest heads."""
    _out("\none-vs-rest heads; figures at thresholds picked on the other half of the items (cross-fitted):")
    _out(f"{'scorer':<18} {'micro-F1':>9} {'macro-F1':>9} {'subset acc':>11} {'Hamming':>8}")
    for name, m in summary.multi_label_rows:
        _out(f"{name:<18} {m['micro_f1']:>9.3f} {m['macro_f1']:>9.3f} {m['subset_accuracy']:>11.3f} "
             f"{m['hamming_loss']:>8.3f}")
    head = summary.head
    picked = ", ".join(f"{label} {t:.3f}" for label, t in zip(head.labels, head.thresholds))
    _out(f"thresholds (F1-optimal on the out-of-fold probabilities, kept in the head): {picked}")
    _out(f"C per label: {', '.join(f'{c:g}' for c in head.info['C'])} (chosen by {summary.folds}-fold CV); "
         f"wrote {summary.output}")
    if summary.json_path:
        _out(f"wrote {summary.json_path}")


def print_questions_fit(summary) -> None:
    """`fit`'s report of a task with questions (`jobs.fit.QuestionsFitSummary`), on stdout: a row per
    question fitted, its head's cross-validated figures next to zero-shot's on the same items."""
    if summary.skipped:
        _out(f"skipping {summary.skipped} empty texts")
    if summary.precision_line:
        _out(summary.precision_line)
    _out(f"model: {summary.model}; {summary.items} items")
    _out(f"features: layers {summary.taps.describe()} ({summary.feature_values} values)"
         f"{' + calibrated label scores' if summary.use_scores else ''}, read for every question in one fast-path "
         f"pass in {summary.seconds:.1f} s")
    for warning in summary.warnings:
        _out(f"warning: {warning}")
    width = max([len("question")] + [len(f.name) for f in summary.fits])
    _out(f"\n{'question':<{width}}  {'kind':<11} {'zero-shot':>9} {'head (CV)':>9}  {'macro-F1 zero/head':>18}  "
         f"{'ECE zero/head':>13}  features")
    for f in summary.fits:
        z, h, row = f.zero_shot, f.cv, f.head.readout.pick(_QUESTION_ROWS)
        _out(f"{f.name:<{width}}  {row.kind:<11} {z[row.accuracy]:>9.3f} "
             f"{h[row.accuracy]:>9.3f}  {z['macro_f1']:>9.3f}/{h['macro_f1']:<8.3f}  {row.ece(z, h)}  "
             f"{f.head.taps.describe()} ({f.choice})")
    for note in dict.fromkeys(note for f in summary.fits for note in f.head.readout.pick(_QUESTION_ROWS).notes):
        _out(note)
    _out(f"head: {summary.folds}-fold cross-validated (feature set and C chosen inside each fold); no learning curve "
         "for a task with questions")
    if summary.not_fitted:
        _out(f"no head (no gold column): {', '.join(summary.not_fitted)}; answered zero-shot by classify --head")
    _out(f"wrote {summary.output} ({len(summary.fits)} heads)")
    if summary.json_path:
        _out(f"wrote {summary.json_path}")


_FIT_TABLES = Kinds(one_label=_print_one_label_fit, several_labels=_print_multilabel_fit)
"""The rest of `fit`'s report, by the kind of head fitted."""


@dataclasses.dataclass(frozen=True)
class _QuestionRow:
    """How a question's row of `print_questions_fit` shows its kind of head."""

    kind: str
    accuracy: str
    """The figure in the accuracy columns."""
    ece: Callable[[dict, dict], str]
    """The ECE column from zero-shot's and the head's figures."""
    notes: tuple[str, ...] = ()
    """Lines after the table, once, when any question's head is of this kind."""


_QUESTION_ROWS = Kinds(
    one_label=_QuestionRow("single", "accuracy", lambda z, h: f"{z['ece']:>6.3f}/{h['ece']:<6.3f}"),
    several_labels=_QuestionRow("multi-label", "subset_accuracy", lambda z, h: f"{'-':>13}", (
        "multi-label: accuracy is subset accuracy, at thresholds picked on the other half of the items "
        "(cross-fitted, zero-shot's and the head's alike)",)))


_EVALUATE_REPORTS = Kinds(one_label=print_evaluate, several_labels=print_multilabel_evaluate)
"""How a task of labels' evaluation is printed, per kind of answer (`Readout.pick`)."""
