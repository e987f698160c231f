"""What a run over a table is asked to do: which table into which output, and how. `TableRequest`
holds the fields every such run has; `ClassifyRequest` adds what the resumable run in this process
does (`classify.py`), `RayClassifyRequest` what the run on Ray does (`ray_classify.py`). Each
field is checked once, here, when the request is made.

The CLI makes a `ClassifyRequest` while it reads classify's flags, also for a `--ray` run, whose
driver never imports torch: this module imports nothing heavy.
"""

from __future__ import annotations

import dataclasses

from ..errors import FieldError, TaskError


@dataclasses.dataclass(frozen=True)
class TableRequest:
    """Which table into which output, and how its cells are read and the results named."""

    input_path: str
    """CSV, JSONL or Parquet file (on Ray: or a folder of them), or - for stdin."""
    output_path: str
    """The output file (its format from its suffix; on Ray: or a folder of Parquet parts), or - for stdout."""
    text_column: str = "text"
    errors: str = "strict"
    """Invalid UTF-8: strict (an error naming the row) or replace."""
    result_prefix: str = ""
    """Prefix of the added result columns (e.g. pred_)."""

    def table(self) -> dict:
        """These fields as keywords, to make another job's request over the same table."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(TableRequest)}


@dataclasses.dataclass(frozen=True)
class ClassifyRequest(TableRequest):
    """Which table to classify into which output, and how (everything but the task, settings, model, head)."""

    id_column: str | None = None
    """Column of row ids (kept; named in errors)."""
    fmt: str | None = None
    """Format of - (stdin/stdout)."""
    probes: int = 8
    """Items checked against the per-item path after the run (0: none)."""
    gold_column: str | None = None
    """Column of true labels: the summary counts accuracy."""
    resume: bool = False
    """Continue the unfinished run kept in OUTPUT.partial."""
    restart: bool = False
    """Discard an unfinished run (OUTPUT.partial) and start over."""

    def __post_init__(self) -> None:
        check_resume(self.resume, self.restart)
        if self.probes < 0:
            raise FieldError("probes", "{field} must be 0 (no check) or more, got {value}", value=self.probes)


def check_resume(resume: bool, restart: bool) -> None:
    """A resumable job's --resume and --restart (classify, batch) exclude each other."""
    if resume and restart:
        raise TaskError("{resume} and {restart} exclude each other", names={"resume": "resume", "restart": "restart"})
