"""`classify_dataset`: a Ray Dataset in, the same Dataset with the result columns added out.

    Dataset (text column, any others)
    → repartition(target_num_rows_per_block=block_rows): blocks cut in row order (streaming)
    → map_batches(ClassifierActor, one call per block, `actors` actors × `cpus_per_actor` CPUs)
    → Dataset (input columns as read + label, confidence, needs_review, p_*, status)

Spreading: Ray hands a map task whole input blocks, and a single CSV/JSONL file is read as one
block; without the cut, one actor would do all of such an input's work while the others wait.
(The CLI feeds one small file to actors of its own instead: `pool.py` says why.)

Order: Ray Data may hand blocks back in the order they finish; the returned Dataset's own context
has `preserve_order` set, so its rows come out in input order whatever the actors do. Faults: the
actors restart when their process dies (`max_restarts`) and a batch whose actor died is run again
(`max_task_retries`); a batch's output is only taken once it is complete, so no row is lost or
doubled. Each row's result equals a single-process run's within float rounding (batches differ:
≤ 1e-4 in label log-probability, the same bound as fast path vs reference).
"""

from __future__ import annotations

import dataclasses

import ray

from ..core.settings import EngineSettings
from ..errors import FieldError
from ..core.task import Task
from .actors import ClassifierActor, RunBoard, actor_arguments, check_columns, check_model

DEFAULT_BLOCK_ROWS = 256


@dataclasses.dataclass(frozen=True)
class RaySettings:
    """How the work is spread over Ray actors."""

    actors: int = 2
    """Classifier actors (model copies) in the pool."""
    cpus_per_actor: float = 1
    """CPUs Ray reserves per actor; torch runs max(1, int(cpus_per_actor)) threads in it."""
    gpus_per_actor: float = 0
    """GPUs Ray reserves per actor (0 on CPU-only clusters)."""
    block_rows: int = DEFAULT_BLOCK_ROWS
    """Rows per actor call (`map_batches` batch size), sorted and batched by length within it. Input
    blocks of more rows are cut into blocks of this many rows first, in order, so that one big file
    is spread over the actors: with N rows there are ceil(N / block_rows) calls to share."""
    max_restarts: int = 3
    """Times an actor whose process dies is started again (-1: always)."""

    def __post_init__(self) -> None:
        if self.actors < 1:
            raise FieldError("actors", "{field} must be positive, got {value}", value=self.actors)
        if self.cpus_per_actor <= 0:
            raise FieldError("cpus_per_actor", "{field} must be positive, got {value}", value=self.cpus_per_actor)
        if self.gpus_per_actor < 0:
            raise FieldError("gpus_per_actor", "{field} must not be negative, got {value}", value=self.gpus_per_actor)
        if self.block_rows < 1:
            raise FieldError("block_rows", "{field} must be positive, got {value}", value=self.block_rows)

    @property
    def threads(self) -> int:
        return max(1, int(self.cpus_per_actor))


@dataclasses.dataclass
class RayRun:
    """A classified Dataset (lazy: nothing runs until it is consumed) and its figures board."""

    dataset: ray.data.Dataset
    board: ray.actor.ActorHandle

    def figures(self) -> dict:
        """What the actors reported so far: {"info": {...}, "actors": {"host:pid": {...}}}."""
        return ray.get(self.board.snapshot.remote())


def classify_dataset(dataset: ray.data.Dataset, task: Task, *, model=None, settings: EngineSettings | None = None,
                     ray_settings: RaySettings | None = None, text_column: str = "text",
                     result_prefix: str = "", errors: str = "strict", precision_sample: list[str] | None = None) -> RayRun:
    """Add the result columns to every row of `dataset`, in input order, on a pool of actors.

    `model` is what `load_model` takes (None: the embedded model; a path must exist on every node).
    Needs `ray.init()` (or a running cluster) first. Returns lazily; consume `run.dataset`.
    `precision_sample`: texts of the input for `--precision auto`'s check (each actor's `load_model`),
    the same on every actor.
    """
    rs = ray_settings or RaySettings()
    check_model(model)
    names = _column_names(dataset)
    if names is not None:
        check_columns(names, task, text_column, result_prefix)
    board = RunBoard.remote()
    kwargs, options = actor_arguments(task, model, settings or EngineSettings(), rs, text_column, result_prefix,
                                      errors, board, precision_sample)
    classified = _cut(dataset, rs.block_rows).map_batches(
        ClassifierActor,
        fn_constructor_kwargs=kwargs,
        batch_size=rs.block_rows,
        batch_format="pyarrow",
        zero_copy_batch=True,
        # one block at a time per actor: a block waits for the next idle actor instead of queueing behind
        # the first actor that is ready (with few blocks, that actor took them all while the others loaded)
        compute=ray.data.ActorPoolStrategy(size=rs.actors, max_tasks_in_flight_per_actor=1),
        **options,
    )
    classified.context.execution_options.preserve_order = True
    return RayRun(classified, board)


def _cut(dataset, rows: int, tasks: int = 1):
    """The dataset in blocks of at most `rows` rows, in order (Ray's streaming repartition).

    Ray 2.60 runs the cut as tasks that reserve 1 CPU each and takes no argument to change that:
    actors holding every CPU of a small cluster (2 actors × 1 CPU on 2 cores) would starve them
    and the run would hang. So the cut reserves no CPU, as the readers do (`reading.ray_read`), and
    runs `tasks` tasks at once, one by default: it only slices Arrow tables (milliseconds a block),
    while every task running at once may need a Ray worker process of its own, started while the
    actors start (without a limit, 0-CPU tasks started one per input block; with 2, a 600-row CSV
    started a second worker for one slice: importing ray and ray.data alone is 1.6 s of CPU).
    """
    from ray.data._internal.compute import TaskPoolStrategy

    cut = dataset.repartition(target_num_rows_per_block=rows, strict=True)  # not strict: 1.5 × rows stay whole
    op = cut._logical_plan.dag
    op.ray_remote_args["num_cpus"] = 0
    object.__setattr__(op, "compute", TaskPoolStrategy(size=tasks))  # a frozen dataclass
    return cut


def _column_names(dataset) -> list[str] | None:
    """The input's column names when Ray knows them without running the whole pipeline."""
    schema = dataset.schema(fetch_if_missing=False)
    return None if schema is None else list(schema.names)
