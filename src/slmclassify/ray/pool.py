"""Blocks the driver holds, classified on Ray actors it feeds itself: `--ray` on one small file.

    start_pool (right after `ray.init`: the actors import and load the model while the driver reads
    the input) → `BlockPool.classify(blocks)`: each block to the next idle actor, one at a time
    → the classified blocks, in block order

An input the driver read (`reading.reads_on_driver`: one CSV or JSONL file of at most 32 MiB) is
in memory already, cut into blocks of equal work (`blocks.spread`); a Ray Dataset of it would only
add Ray Data's fixed start-up: Ray Data creates its actor pool only when the Dataset is consumed
(after the driver's read) and first starts three helper actors of its own (stats, autoscaling
coordinator, actor-location tracker), each a Ray worker process that imports ray.data on the cores
the classifier actors load on. Here the actors are the same `ClassifierActor` with the same
options, created before the input is read, so they load while the driver reads (the side-by-side
figures, `python -m slmclassify.bench.ray_scaling`, are in docs/ray.md). Anything that is not one small file (a folder, Parquet,
a bigger file) and any Dataset a library user brings go through Ray Data (`dataset.py`).

Faults, as there: an actor whose process dies is restarted (`max_restarts`) and the block it was
running is sent again (`max_task_retries=-1`); each block's result is taken once, so no row is lost
or doubled. A bad input fails while the actors load (the driver reads after starting them); the
error names the line, and the caller's `ray.shutdown()` stops the actors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import ray

from ..core.settings import EngineSettings
from ..core.task import Task
from .actors import ClassifierActor, RunBoard, actor_arguments, check_columns, check_model
from .dataset import RaySettings


@dataclasses.dataclass
class BlockPool:
    """Classifier actors (loading or ready) and the run's board."""

    actors: list
    board: ray.actor.ActorHandle
    task: Task
    text_column: str
    result_prefix: str

    def classify(self, blocks: list, done: Callable[[int], None] | None = None) -> list:
        """The blocks (pyarrow Tables) with the result columns added, in block order; each block goes
        to the next idle actor as soon as it is idle, so a slow or late actor takes fewer.
        `done(rows)` after each block."""
        if blocks:
            check_columns(blocks[0].column_names, self.task, self.text_column, self.result_prefix)
        results: list = [None] * len(blocks)
        running: dict = {}  # ObjectRef → (actor, block index)
        waiting = iter(range(len(blocks)))

        def send(actor) -> None:
            index = next(waiting, None)
            if index is not None:
                running[actor.__call__.remote(blocks[index])] = (actor, index)

        for actor in self.actors:
            send(actor)
        while running:
            ready, _ = ray.wait(list(running), num_returns=1)
            actor, index = running.pop(ready[0])
            results[index] = ray.get(ready[0])
            if done is not None:
                done(results[index].num_rows)
            send(actor)
        return results

    def figures(self) -> dict:
        """What the actors reported (`RunBoard.snapshot`)."""
        return ray.get(self.board.snapshot.remote())


def start_pool(task: Task, *, model=None, settings: EngineSettings | None = None,
               ray_settings: RaySettings | None = None, text_column: str = "text",
               result_prefix: str = "", errors: str = "strict",
               precision_sample: list[str] | None = None) -> BlockPool:
    """Create the board and `ray_settings.actors` classifier actors; returns at once (they load in
    the background). Needs `ray.init()` first."""
    check_model(model)
    rs = ray_settings or RaySettings()
    board = RunBoard.remote()
    kwargs, options = actor_arguments(task, model, settings or EngineSettings(), rs, text_column, result_prefix,
                                      errors, board, precision_sample)
    remote = ray.remote(ClassifierActor).options(**options)
    return BlockPool([remote.remote(**kwargs) for _ in range(rs.actors)], board, task, text_column, result_prefix)
