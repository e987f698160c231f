"""`classify_dataset`: a Ray Dataset in, the same Dataset with the result columns added out.

    Dataset (text column, any others)
    → map_batches(ClassifierActor, one call per block, `actors` actors × `cpus_per_actor` CPUs)
    → Dataset (input columns as read + label, confidence, needs_review, p_*, status)

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

from ..classifier import EngineSettings
from ..errors import InputError, TaskError
from ..results import result_columns
from ..task import Task
from .actors import ClassifierActor, StatsBoard

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
    """Rows per actor call (`map_batches` batch size), sorted and batched by length within it. An
    input block of more rows is cut into calls of this size on one actor: to spread work over the
    actors the input needs at least as many blocks as actors (several files, `override_num_blocks`)."""
    max_restarts: int = 3
    """Times an actor whose process dies is started again (-1: always)."""

    def __post_init__(self) -> None:
        if self.actors < 1:
            raise TaskError(f"--actors must be positive, got {self.actors}")
        if self.cpus_per_actor <= 0:
            raise TaskError(f"--cpus-per-actor must be positive, got {self.cpus_per_actor}")
        if self.gpus_per_actor < 0:
            raise TaskError(f"--gpus-per-actor must not be negative, got {self.gpus_per_actor}")
        if self.block_rows < 1:
            raise TaskError(f"--block-rows must be positive, got {self.block_rows}")

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
                     result_prefix: str = "", errors: str = "strict") -> RayRun:
    """Add the result columns to every row of `dataset`, in input order, on a pool of actors.

    `model` is what `load_model` takes (None: the embedded model; a path must exist on every node).
    Needs `ray.init()` (or a running cluster) first. Returns lazily; consume `run.dataset`.
    """
    settings = settings or EngineSettings()
    rs = ray_settings or RaySettings()
    if model is not None and not isinstance(model, str):
        raise TaskError("under Ray, model must be a path or hub id (each actor loads its own copy)")
    names = _column_names(dataset)
    if names is not None:
        if text_column not in names:
            raise InputError(f"no text column {text_column!r}; columns are: {', '.join(names)}")
        clash = [c for c in result_columns(task.labels, result_prefix) if c in names]
        if clash:
            raise InputError(f"the input already has column {clash[0]!r}; pass --result-prefix (e.g. pred_) "
                             "so the results do not overwrite it")
    board = StatsBoard.remote()
    classified = dataset.map_batches(
        ClassifierActor,
        fn_constructor_kwargs=dict(task=task, model=model, settings=settings, text_column=text_column,
                                   result_prefix=result_prefix, threads=rs.threads, errors=errors, board=board),
        batch_size=rs.block_rows,
        batch_format="pyarrow",
        zero_copy_batch=True,
        compute=ray.data.ActorPoolStrategy(size=rs.actors),
        num_cpus=rs.cpus_per_actor,
        num_gpus=rs.gpus_per_actor or None,
        max_restarts=rs.max_restarts,
        max_task_retries=-1,
    )
    classified.context.execution_options.preserve_order = True
    return RayRun(classified, board)


def _column_names(dataset) -> list[str] | None:
    """The input's column names when Ray knows them without running the whole pipeline."""
    schema = dataset.schema(fetch_if_missing=False)
    return None if schema is None else list(schema.names)
