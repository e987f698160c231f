"""`slmclassify label`: run the labelling page (one person's, or a team's: one address per member),
or write its export / head / agreement / suspected label errors from the store and exit.

The library (slmclassify.label) prints nothing; the lines a person reads are printed here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import TaskError
from ..io.formats import check_writes
from ..interrupts import Interrupted, terminate_as_interrupt
from . import startup
from .options import ModelOptions, bundle, task_options

if TYPE_CHECKING:  # the session imports torch: the command imports it when it runs
    from ..label.session import LabelRequest


@dataclasses.dataclass(frozen=True)
class LabelOptions:
    """label's options: the session's request (the store named after INPUT unless given), and what
    only the command uses: the page's port and token, and --export / --fit."""

    request: LabelRequest
    port: int = 0
    api_key: str | None = None
    export_path: str | None = None
    fit_path: str | None = None
    fmt: str | None = None
    """--format of --export (None: from its extension)."""
    agreement: bool = False
    suspects: int | None = None

    @classmethod
    def from_flags(cls, *, input_path, store_path, port, api_key, export_path, fit_path, fmt, agreement, suspects,
                   annotators, reviewers, overlap, overlap_share, guidelines, **flags) -> LabelOptions:
        from ..label.session import LabelRequest
        from ..label.team import TeamSpec, read_names

        store = Path(store_path) if store_path else default_store(input_path)
        team = TeamSpec(read_names(annotators), read_names(reviewers), overlap, overlap_share)
        if team.annotators and api_key:
            raise TaskError("--api-key is the one token of a page without a team; with --annotators each person gets "
                            "their own address (kept in the store)")
        if fmt and not export_path:
            raise TaskError("--format is the format of --export: give --export PATH too")
        if export_path:
            from ..label.outputs import export_format

            export_format(export_path, fmt)  # a format the path cannot hold is refused before the model loads
        if suspects is not None and suspects < 1:
            raise TaskError(f"--suspects must be a positive number of items, got {suspects}")
        text = _read_text(guidelines, "--guidelines") if guidelines else ""
        return cls(LabelRequest(input_path, store, team=team, guidelines=text, **flags), port, api_key, export_path,
                   fit_path, fmt, agreement, suspects)


def _read_text(path: str, flag: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskError(f"{flag} {path}: cannot read it ({exc})") from None


def default_store(input_path: str | Path) -> Path:
    """`tickets.csv` → `tickets.labels.sqlite` in the current folder."""
    return Path(f"{Path(input_path).stem}.labels.sqlite")


def page_outputs(store_path: Path) -> tuple[Path, Path]:
    """Where the page's Export and Fit buttons write: next to the store, named after it
    (`tickets.labels.sqlite` → `tickets.labelled.csv`, `tickets.head.npz`)."""
    base = store_path.stem.removesuffix(".labels")
    return store_path.with_name(f"{base}.labelled.csv"), store_path.with_name(f"{base}.head.npz")


def run_label(run: LabelOptions, task, settings, *, model, task_file=None) -> None:
    """Start the session; with --export/--fit write those and exit, else serve the page."""
    from ..label.server import new_token, run_page
    from ..label.session import LabelSession
    from ..label.store import LabelStore

    if run.api_key is not None and not run.api_key.strip():
        raise TaskError("--api-key is empty; give a token or leave it out for a random one")
    request = run.request
    store_path, input_path = Path(request.store_path), request.input_path
    page_export, page_fit = page_outputs(store_path)
    reads = {"the input": input_path, "--task": task_file, "--model": model}
    check_writes(reads, {"--store": store_path})
    check_writes({**reads, "the store": store_path}, {"--export": run.export_path, "--fit": run.fit_path,
                                                      "the page's export file": page_export,
                                                      "the page's head file": page_fit})
    if run.export_path and run.fit_path:
        check_writes({"--export": run.export_path}, {"--fit": run.fit_path})

    def start(**more):
        return LabelSession.start(dataclasses.replace(request, **more), task, settings, model=model)

    if run.export_path or run.fit_path or run.agreement or run.suspects:
        if not store_path.exists():
            raise TaskError(f"no label store at {store_path}: label first (`slmclassify label {input_path} "
                            "--task ...`), or give the store with --store")
        session = start(first_slice=1)  # the answered rows are scored first; no pool to pick from
        try:
            if run.agreement:
                _print_agreement(session.agreement(), agreement_path(store_path))
            if run.export_path:
                rows = session.export(run.export_path, run.fmt)
                click.echo(f"wrote {rows} labelled rows to {run.export_path}")
            if run.suspects:
                session.wait_ready()
                _print_suspects(session.suspects(run.suspects))
            if run.fit_path:
                session.wait_ready()  # the answered rows' hidden states are scored first
                head = session.fit(run.fit_path)
                click.echo(f"wrote {run.fit_path}: a head fitted on {head.info['items']} answers; "
                           f"classify with it: slmclassify classify {input_path} -o OUT --head {run.fit_path}")
        finally:
            session.close()
        return

    def ready(url: str, session) -> None:
        team = session.team
        if team is None:
            click.echo(url)
        else:  # one address per person: send each their own
            for member in team.members:
                click.echo(f"{member.name} ({member.role}): {url.split('?token=')[0]}?token={member.token}")
        click.echo(f"answers are kept in {store_path} as they are given; Export writes {page_export}, Fit "
                   f"writes {page_fit}; Ctrl-C stops", err=True)

    # the URL is kept across restarts: the port and token of the store's last page, unless given
    saved = LabelStore.page_address(store_path)
    token = run.api_key or (saved[1] if saved else new_token())
    reuse = not run.port and saved is not None
    try:
        run_page(start, port=saved[0] if reuse else run.port, token=token, export_path=page_export, fit_path=page_fit,
                 on_ready=ready, fallback_port=reuse, on_progress=lambda line: click.echo(line, err=True))
    except KeyboardInterrupt:  # before the page was up: the answers given earlier are in the store already
        raise Interrupted(f"interrupted; the answers given so far are kept in {store_path}",
                          143 if terminate_as_interrupt.received else 130) from None
    click.echo(f"stopped; the answers are kept in {store_path}", err=True)


def agreement_path(store_path: Path) -> Path:
    """Where --agreement writes its JSON: next to the store (`tickets.labels.sqlite` → `tickets.agreement.json`)."""
    return store_path.with_name(f"{store_path.stem.removesuffix('.labels')}.agreement.json")


def _print_agreement(report: dict, path: Path) -> None:
    import json

    from ..label.agreement import lines

    names = ", ".join(report["annotators"]) or "nobody"
    click.echo(f"agreement on {report['items']} items answered by 2 or more of {names}")
    for part in report["questions"]:
        if part["question"]:
            click.echo(f"-- {part['question']}")
        for line in lines(part):
            click.echo(line)
    path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    click.echo(f"wrote {path}", err=True)


def _print_suspects(found: dict) -> None:
    click.echo(f"the {len(found['suspects'])} of {found['items']} answered items whose gold a head fitted without "
               "them finds least likely (check these first):")
    for s in found["suspects"]:
        p = "n/a" if s["probability"] is None else f"{s['probability']:.3f}"
        click.echo(f"row {s['row']}: gold {s['gold']} (p {p}; the head says {s['predicted']}) {s['text']}")


label_options = bundle("run", LabelOptions.from_flags, [
    click.argument("input_path", metavar="INPUT"),
    click.option("--store", "store_path", help="SQLite file of the answers (default: INPUT's name + .labels.sqlite, "
                 "here); starting again with it continues where it stopped."),
    click.option("--port", type=int, default=0, show_default=True, help="Port on 127.0.0.1 (0: a free one)."),
    click.option("--api-key", envvar="SLMCLASSIFY_API_KEY",
                 help="The page's token (also from $SLMCLASSIFY_API_KEY; default: a random one, in the printed URL)."),
    click.option("--export", "export_path", help="Write the labelled input rows to this file and exit (no page): "
                 "CSV/JSONL with a gold column; .parquet for `datasets` (gold, each annotator's and the reviewer's "
                 "answers as ClassLabel); see --format."),
    click.option("--format", "fmt", type=click.Choice(["csv", "parquet", "label-studio"]),
                 help="--export's format (default from its extension; label-studio: a Label Studio import .json "
                 "with one annotation per answer)."),
    click.option("--annotators", help="Label as a team: the annotators' names, comma-separated or a file of one per "
                 "line; each gets their own page address (printed at start, kept in the store)."),
    click.option("--reviewers", help="Reviewers (names or a file): they decide the items annotators disagree on."),
    click.option("--overlap", type=int, default=1, show_default=True,
                 help="Different annotators who answer an item of the overlap share (for agreement)."),
    click.option("--overlap-share", type=float,
                 help="Share of items answered --overlap times (default: all of them when --overlap > 1)."),
    click.option("--guidelines", help="A text or Markdown file shown on the page beside each item."),
    click.option("--agreement", is_flag=True, help="Print the agreement between annotators (and write it as JSON "
                 "next to the store) and exit."),
    click.option("--suspects", type=int, metavar="N", help="Print the N answered items whose gold a head fitted "
                 "out of fold finds least likely (label errors), and exit."),
    click.option("--fit", "fit_path",
                 help="Fit a head (.npz, for `classify --head`) on the answers and exit (no page)."),
    click.option("--sample", type=int, default=20000, show_default=True,
                 help="Work on a seeded sample of this many rows."),
    click.option("--seed", type=int, default=0, show_default=True),
    click.option("--text-column", default="text", show_default=True),
    click.option("--id-column", help="A column of row ids, shown on the page next to each item."),
    click.option("--review-first", is_flag=True,
                 help="INPUT is a `classify` output: offer its needs_review rows first."),
    click.option("--target-accuracy", type=float, default=0.9, show_default=True,
                 help="Accuracy the automatic share must reach (its threshold from the cross-validated predictions)."),
])


@click.command()
@label_options
@task_options
def label(run: LabelOptions, opts: ModelOptions):
    """Label INPUT by hand on a local web page, one item at a time, picked by active learning; a head
    is refitted as you go (needs the 'serve' and 'head' extras)."""
    startup.need_serve_extra()
    run_label(run, opts.task(), opts.settings(), model=opts.model, task_file=opts.task_file)
