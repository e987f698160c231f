"""`slmclassify label`: run the labelling page, or write its export / head from the store and exit.

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

    @classmethod
    def from_flags(cls, *, input_path, store_path, port, api_key, export_path, fit_path, **flags) -> LabelOptions:
        from ..label.session import LabelRequest

        store = Path(store_path) if store_path else default_store(input_path)
        return cls(LabelRequest(input_path, store, **flags), port, api_key, export_path, fit_path)


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

    if run.export_path or run.fit_path:
        if not store_path.exists():
            raise TaskError(f"no label store at {store_path}: label first (`slmclassify label {input_path} "
                            "--task ...`), or give the store with --store")
        session = start(first_slice=1)  # the answered rows are scored first; no pool to pick from
        try:
            if run.export_path:
                rows = session.export(run.export_path)
                click.echo(f"wrote {rows} labelled rows to {run.export_path}")
            if run.fit_path:
                session.wait_ready()  # the answered rows' hidden states are scored first
                head = session.fit(run.fit_path)
                click.echo(f"wrote {run.fit_path}: a head fitted on {head.info['items']} answers; "
                           f"classify with it: slmclassify classify {input_path} -o OUT --head {run.fit_path}")
        finally:
            session.close()
        return

    def ready(url: str) -> None:
        click.echo(url)
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


label_options = bundle("run", LabelOptions.from_flags, [
    click.argument("input_path", metavar="INPUT"),
    click.option("--store", "store_path", help="SQLite file of the answers (default: INPUT's name + .labels.sqlite, "
                 "here); starting again with it continues where it stopped."),
    click.option("--port", type=int, default=0, show_default=True, help="Port on 127.0.0.1 (0: a free one)."),
    click.option("--api-key", envvar="SLMCLASSIFY_API_KEY",
                 help="The page's token (also from $SLMCLASSIFY_API_KEY; default: a random one, in the printed URL)."),
    click.option("--export", "export_path", help="Write the labelled input rows with a gold column to this file "
                 "and exit (no page)."),
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
