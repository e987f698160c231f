"""`slmclassify classify INPUT -o OUTPUT --ray`: the job behind the CLI flag.

    connect (--ray-address) or start a local Ray →
      one small file: start the actors, read it here meanwhile, feed them its blocks (`pool.py`)
      anything else: Ray's readers (`reading.py`) → classify_dataset (Ray Data)
    → write the rows in input order into one file (OUTPUT.partial, renamed when complete), or a
      folder of Parquet parts → summary (`RaySummary`, data) → shut down the Ray it started

CSV columns are read as strings, as in a single-process run (so `007` stays `007`).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from pathlib import Path

import ray

from ..core.settings import EngineSettings
from ..errors import InputError
from ..io.formats import FORMATS, check_not_input, check_output, table_format
from ..io.lock import OutputLock
from .meter import MeterFactory, no_meter
from .table_request import TableRequest
from ..core.results import RunStats
from ..core.task import Task
from ..ray.actors import process_started
from ..ray.blocks import restore, spread
from ..ray.dataset import RaySettings, classify_dataset
from ..ray.local import start_ray
from ..ray.reading import driver_table, ray_read, reads_on_driver


@dataclasses.dataclass(frozen=True)
class RayClassifyRequest(TableRequest):
    """Which table (a file, or a folder of files of one format) to classify on Ray into which output
    (a file, or a folder of Parquet parts), and how (everything but the task and the settings)."""

    address: str | None = None
    """The Ray to join: auto, HOST:PORT, ray://HOST:10001, or local (None: `start_ray`'s choice)."""
    progress: bool = True
    """Ray Data's progress bars."""

    def __post_init__(self) -> None:
        if self.input_path == "-" or self.output_path == "-":
            raise InputError("--ray reads and writes files or folders, not stdin/stdout")


@dataclasses.dataclass(frozen=True)
class ActorFigures:
    """One actor's share of a `--ray` run. Times are seconds after Ray was handed the work."""

    key: str
    rows: int
    blocks: int
    """Calls (blocks) it ran."""
    busy_s: float
    """Seconds it spent scoring."""
    scored_by_model: int
    """Distinct items it ran through the model (the rest took scores shared by other actors)."""
    waited_s: float
    """Seconds it waited, at the end of its blocks, for items other actors were running."""
    phases: dict
    """When its phases ended: any of process, imports_began, imports, load, classifier,
    first_block_began, last_block_ended."""
    stats: RunStats


@dataclasses.dataclass(frozen=True)
class RaySummary:
    """What a `--ray` run did, as data: `dataclasses.asdict(summary)` (or `to_json()`) is JSON-able."""

    rows: int
    seconds: float
    """From handing Ray the work to the last row written."""
    output: str
    address: str | None
    """The Ray joined (None: a local one started for the run)."""
    feed: str
    """How the rows reached the actors, in words."""
    actors: int
    cpus_per_actor: float
    threads: int
    block_rows: int
    model: dict | None
    """The first actor's model, mode, calibration, label lines and load seconds (None: no actor reported)."""
    total: RunStats
    shared: dict | None
    """The shared-score board: kept and forgotten items."""
    ray_init_s: float
    began_after_driver_s: float | None
    """From the driver process's start to ray.init (None: unknown)."""
    submitted_after_driver_s: float | None
    """From the driver process's start to handing Ray the work (None: unknown)."""
    actor_figures: tuple[ActorFigures, ...]

    @property
    def scored_by_model(self) -> int:
        """Distinct items run through the model, over all actors."""
        return self.total.scored - self.total.reused

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def run_ray_classify(request: RayClassifyRequest, task: Task, settings: EngineSettings, ray_settings: RaySettings,
                     *, model=None, meter: MeterFactory = no_meter) -> RaySummary:
    """Classify the request's input into its output on Ray; returns the summary's figures. `meter`:
    the rows written when this process feeds the actors."""
    input_path, output_path, text_column = request.input_path, request.output_path, request.text_column
    folder_out = Path(output_path).suffix == ""
    if folder_out:
        if Path(output_path).is_file() or (Path(output_path).is_dir() and any(Path(output_path).iterdir())):
            raise InputError(f"output folder {output_path} exists and is not empty; give a new folder or a file name")
        out_fmt = "parquet"
    else:
        out_fmt = check_output(output_path)
    in_fmt, files = _input_files(input_path)
    for path in files:  # the input is never overwritten
        check_not_input(path, output_path)
    with OutputLock(output_path):  # one writer per output, refused before Ray starts
        began = time.time()
        own_ray = start_ray(request.address)
        try:
            initialised = time.time()
            sample = first_texts(files, text_column, request.errors) if settings.precision == "auto" else None
            how = dict(task=task, model=model, settings=settings, ray_settings=ray_settings, text_column=text_column,
                       result_prefix=request.result_prefix, errors=request.errors, precision_sample=sample)
            if reads_on_driver(in_fmt, files):
                feed = "actors fed by this process, which read the file"
                handed, rows, figures = _on_pool(in_fmt, files[0], output_path, out_fmt, folder_out, meter, how)
            else:
                feed = "Ray Data: Ray's readers, an actor pool"
                handed, rows, figures = _on_dataset(in_fmt, files, output_path, out_fmt, folder_out, request.progress,
                                                    how)
            finished = time.time()
            phases = {"ray_init": initialised - began, "began": began, "submitted": handed, "finished": finished,
                      "driver": process_started(), "feed": feed}
            return _summary(figures, rows, ray_settings, request.address, output_path, phases)
        finally:
            if own_ray:  # here, not at exit: Ray's exit hook first sleeps 0.5 s "for log messages"
                ray.shutdown()


def _on_pool(fmt: str, path: str, output_path: str, out_fmt: str, folder_out: bool, make_meter: MeterFactory,
             how: dict) -> tuple[float, int, dict]:
    """One small file: the actors start loading, the driver reads and spreads the file meanwhile, then
    feeds them its blocks (`pool.py`); (when the actors were started, rows written, figures)."""
    import pyarrow as pa

    from ..ray.pool import start_pool

    handed = time.time()
    pool = start_pool(**how)
    rs = how["ray_settings"]
    blocks, order = spread(driver_table(fmt, path), how["text_column"], rs.block_rows, rs.actors)
    meter = make_meter(sum(b.num_rows for b in blocks), None, 0)
    table = pa.concat_tables(pool.classify(blocks, done=meter.update))
    meter.close()
    if order is not None:
        table = restore(table, order)
    rows = _write_part(table, output_path) if folder_out else _write_file([table], output_path, out_fmt,
                                                                          _joined(how))
    return handed, rows, pool.figures()


def _on_dataset(fmt: str, files: list[str], output_path: str, out_fmt: str, folder_out: bool, progress: bool,
                how: dict) -> tuple[float, int, dict]:
    """Anything else: Ray's readers and `classify_dataset` (Ray Data); (when the Dataset was
    submitted, rows written, figures)."""
    ray.data.DataContext.get_current().enable_progress_bars = progress
    run = classify_dataset(ray_read(fmt, files), **how)
    handed = time.time()
    with warnings.catch_warnings():
        # the cut into blocks (`dataset._cut`) may get fewer input blocks than its task limit: as meant
        warnings.filterwarnings("ignore", message="The maximum number of concurrent tasks", category=UserWarning)
        if folder_out:
            run.dataset.write_parquet(output_path)
            rows = sum(pq_rows(p) for p in sorted(Path(output_path).glob("*.parquet")))
        else:
            batches = run.dataset.iter_batches(batch_size=None, batch_format="pyarrow")
            rows = _write_file(batches, output_path, out_fmt, _joined(how))
    return handed, rows, run.figures()


def pq_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def first_texts(files: list[str], text_column: str, errors: str = "strict") -> list[str]:
    """`--precision auto`'s sample of the input (`precision.input_sample`), read on the driver from
    the first rows of the files in order, so every actor checks the same texts."""
    from ..io.readers import open_table
    from ..models.precision import input_sample

    def texts():
        for path in files:
            reader = open_table(path, text_column, errors=errors)
            try:
                for _, frame in reader.chunks(1024):
                    yield from reader.texts(frame)
            finally:
                reader.close()

    return input_sample(texts())


def _input_files(path: str) -> tuple[str, list[str]]:
    """(format, files) of a file or a folder of files of one format (sorted by name)."""
    target = Path(path)
    if target.is_file():
        return table_format(path), [path]
    if not target.is_dir():
        raise InputError(f"input not found: {path}")
    found = {}
    for child in sorted(target.iterdir()):
        if child.is_file() and not child.name.startswith((".", "_")):
            try:
                found.setdefault(table_format(str(child)), []).append(str(child))
            except InputError:
                continue
    if len(found) != 1:
        kinds = ", ".join(sorted(found)) or "none"
        raise InputError(f"input folder {path} must hold files of one format ({', '.join(FORMATS)}); found: {kinds}")
    return next(iter(found.items()))


def _write_part(table, folder: str) -> int:
    """The rows (an input the driver read) as one Parquet part in a new folder; returns the rows."""
    import pyarrow.parquet as pq

    from ..io.writers import atomic_output

    Path(folder).mkdir(parents=True, exist_ok=True)
    with atomic_output(str(Path(folder) / "part-00000.parquet")) as fh:
        pq.write_table(table, fh)
    return table.num_rows


def _joined(how: dict) -> tuple[tuple[str, str], ...]:
    """(column, separator) of each multi-label answer's list column of labels, which a CSV or TSV output joins."""
    return tuple((how["result_prefix"] + q.result_column, q.task.label_separator) for q in how["task"].asked
                 if q.readout.lists)


def _write_file(tables, output_path: str, fmt: str, joined: tuple[tuple[str, str], ...] = ()) -> int:
    """Write the rows in order into OUTPUT.partial, then rename it; returns the rows written.
    `joined`: (column, separator) of each list column written joined in the text formats (CSV, TSV)."""
    from ..io.writers import ChunkWriter, atomic_output

    rows = 0
    with atomic_output(output_path) as fh:
        writer = None
        for batch in tables:
            if writer is None:
                schema = batch.schema if fmt == "parquet" else list(batch.column_names)
                writer = ChunkWriter(fh, fmt, schema, name=output_path)
            frame = batch.to_pandas()
            for column, separator in joined if fmt == "csv" else ():
                frame[column] = [None if v is None else separator.join(v) for v in frame[column]]
            writer.write(frame)
            rows += batch.num_rows
        if writer is None:
            raise InputError("the input has no rows")
        writer.close()
    return rows


def _summary(figures: dict, rows: int, rs: RaySettings, address, output: str, phases: dict) -> RaySummary:
    """The run's figures (`pool.figures()` or the Dataset's) as a `RaySummary`."""
    info, actors = figures["info"], figures["actors"]
    total = RunStats.total(RunStats(**entry["stats"]) for entry in actors.values() if entry["stats"])
    t0, driver = phases["submitted"], phases["driver"]
    per_actor = []
    for key, entry in sorted(actors.items()):
        s = RunStats(**entry["stats"]) if entry["stats"] else RunStats()
        per_actor.append(ActorFigures(key=str(key), rows=s.items, blocks=entry["calls"], busy_s=s.seconds,
                                      scored_by_model=s.scored - s.reused, waited_s=waited_seconds(entry),
                                      phases=actor_phases(entry, t0), stats=s))
    return RaySummary(
        rows=rows, seconds=phases["finished"] - t0, output=output, address=address, feed=phases["feed"],
        actors=rs.actors, cpus_per_actor=rs.cpus_per_actor, threads=rs.threads, block_rows=rs.block_rows,
        model=info or None, total=total, shared=figures.get("shared") or None, ray_init_s=phases["ray_init"],
        began_after_driver_s=None if driver is None else phases["began"] - driver,
        submitted_after_driver_s=None if driver is None else t0 - driver, actor_figures=tuple(per_actor))


def waited_seconds(entry: dict) -> float:
    """Seconds the actor waited, at the end of its blocks, for items other actors were running."""
    return sum(call[3] for call in entry.get("blocks") or () if len(call) > 3)


ACTOR_PHASES = {"process": "process started", "imports_began": "__init__ began", "imports": "imports done",
                "load": "model loaded", "classifier": "classifier ready", "first_block_began": "first block began",
                "last_block_ended": "last block ended"}
"""An actor's phases in order (`actors.py`; the last two from its blocks), and their names in words."""


def phase_words(phases: dict) -> str:
    """An actor's phases (`actor_phases`) in words, in order: "process started 0.12, ..." (seconds)."""
    return ", ".join(f"{label} {phases[k]:.2f}" for k, label in ACTOR_PHASES.items() if k in phases)


def actor_phases(entry: dict, t0: float) -> dict:
    """When an actor's phases ended, in seconds after Ray was handed the work (`actors.py`)."""
    p, blocks = entry.get("phases") or {}, entry.get("blocks") or []
    found = {k: p[k] - t0 for k in ACTOR_PHASES if k in p}  # the start-up ones (`actors.py`)
    if blocks:
        found["first_block_began"] = blocks[0][0] - t0
        found["last_block_ended"] = blocks[-1][1] - t0
    return found
