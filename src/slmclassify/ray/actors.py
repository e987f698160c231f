"""The Ray actors: one `ClassifierActor` per worker slot, and a `RunBoard` that collects figures
and shares scores between them.

A `ClassifierActor` is the callable class given to `Dataset.map_batches`: Ray builds it once per
actor process, so the model is loaded, the prefix cache computed and the calibration prior
measured once, then every batch (a block of rows) is scored by `sharing.score_block`, which
sorts and batches by length within it. Torch gets as many threads as the actor has CPUs
(its share of the machine, not `os.cpu_count()`).

Duplicates: the actors of a run share the scores of the items they ran through the board
(`sharing.py`): an item identical to one any actor has run (or is running) is not run again, so
each distinct item is run once in total, as in a single process (which scores each distinct item
of a 1024-row window once).

The board is one small actor (no CPU reserved) that each classifier actor tells, after every
batch, what it did: the driver reads it for the per-actor figures of the summary, and tests read
it to find a process to kill. A restarted actor registers again, under its new process id. Each
actor also reports when its phases ended (wall-clock `time.time()`, comparable across the
processes of one machine): process start, imports, model load, classifier built (prefix and
calibration), and the start and end of every block.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time

import ray

from .sharing import Pace, SharedScores, score_block


def check_model(model) -> None:
    """Under Ray each actor loads its own copy, so the model is named (None: the embedded one)."""
    from ..errors import TaskError

    if model is not None and not isinstance(model, str):
        raise TaskError("under Ray, model must be a path or hub id (each actor loads its own copy)")


def check_columns(names: list[str], task, text_column: str, result_prefix: str) -> None:
    """The input has the text column (or every column a multi-field template names), and none that a
    result column would overwrite."""
    from ..errors import InputError
    from ..core.results import check_result_columns, columns_for

    for column in task.fields if task.multi_field else (text_column,):
        if column not in names:
            raise InputError(f"no {'text column' if column == text_column else 'column'} {column!r}; columns are: "
                             f"{', '.join(names)}")
    check_result_columns(names, columns_for(task), result_prefix)


def actor_arguments(task, model, settings, ray_settings, text_column: str, result_prefix: str, errors: str,
                    board, precision_sample) -> tuple[dict, dict]:
    """(ClassifierActor's constructor arguments, its Ray options) for a run: `ray_settings`' CPUs and
    GPUs, restarted when its process dies, and a call whose actor died run again."""
    rs = ray_settings
    kwargs = dict(task=task, model=model, settings=settings, text_column=text_column, result_prefix=result_prefix,
                  threads=rs.threads, errors=errors, board=board, precision_sample=precision_sample)
    options = dict(num_cpus=rs.cpus_per_actor, num_gpus=rs.gpus_per_actor or None, max_restarts=rs.max_restarts,
                   max_task_retries=-1)
    return kwargs, options


def process_started() -> float | None:
    """When this process started, on `time.time()`'s clock; None where psutil cannot tell."""
    try:
        import psutil  # a Ray dependency

        return psutil.Process().create_time()
    except (ImportError, OSError):
        return None


@ray.remote(num_cpus=0)
class RunBoard:
    """Run figures per actor process, keyed `host:pid`, and the scores the actors share."""

    def __init__(self) -> None:
        self.actors: dict[str, dict] = {}
        self.info: dict = {}
        self.shared = SharedScores()

    def exchange(self, owner: str, publish: dict, want: list, take: list, lease_s: float):
        """`SharedScores.exchange`: one round trip per engine batch of an actor."""
        return self.shared.exchange(owner, publish, want, take, lease_s)

    def register(self, key: str, info: dict) -> None:
        entry = self._entry(key)
        entry["phases"] = info.pop("phases")
        self.info = info

    def report(self, key: str, stats: dict, call: tuple[float, float, int, float]) -> None:
        entry = self._entry(key)
        entry["calls"] += 1
        entry["stats"] = stats
        entry["blocks"].append(call)

    def snapshot(self) -> dict:
        """{"info": what the model and task look like, "actors": {key: {"calls", "stats", "started",
        "phases": {name: time.time()}, "blocks": [(began, ended, rows, seconds waiting for others)]}},
        "shared": `SharedScores.figures()`}."""
        return {"info": self.info, "actors": self.actors, "shared": self.shared.figures()}

    def _entry(self, key: str) -> dict:
        return self.actors.setdefault(key, {"started": time.time(), "stats": None, "calls": 0, "phases": {},
                                            "blocks": []})


class ClassifierActor:
    """Adds the result columns to each batch (a pyarrow Table) of a Dataset; see the module docstring."""

    def __init__(self, task, model, settings, text_column: str, result_prefix: str, threads: int,
                 board, errors: str = "strict", precision_sample: list[str] | None = None):
        phases = {"imports_began": time.time()}
        if (started := process_started()) is not None:
            phases["process"] = started
        import torch

        from ..classifier import Classifier, label_token_lines
        from ..models.prepare import load_model
        from ..core.results import RunStats, columns_for, result_arrow_fields

        phases["imports"] = time.time()
        started = time.perf_counter()
        torch.set_num_threads(threads)  # before load_model: the GEMM measurement it reuses is keyed by threads
        loaded = load_model(model, settings.device, settings.precision, task=task, sample=precision_sample,
                            settings=settings)
        phases["load"] = time.time()
        self.classifier = Classifier(task, model=loaded, settings=settings)
        phases["classifier"] = time.time()
        self.pace = Pace()
        self.text_column, self.errors, self.board = text_column, errors, board
        self.fields = result_arrow_fields(columns_for(task), result_prefix)
        self.prefix = result_prefix
        self.total = RunStats(prefix_tokens=len(self.classifier.prefix_ids))
        self.key = f"{socket.gethostname()}:{os.getpid()}"
        c = self.classifier
        board.register.remote(self.key, {
            "model": loaded.name, "mode": c.mode, "mode_reason": c.mode_reason,
            "calibrated": c.bias is not None, "threads": threads,
            "load_seconds": time.perf_counter() - started, "phases": phases,
            "labels": [line.strip() for line in label_token_lines(c)],
        })

    def __call__(self, batch):
        import pandas as pd
        import pyarrow as pa

        from ..io.readers import item_texts
        from ..core.results import columns_for, result_frame

        began = time.time()
        task = self.classifier.task
        fields = task.fields if task.multi_field else ()
        columns = fields or (self.text_column,)
        cells = pd.DataFrame({c: batch.column(c).to_pylist() for c in columns}, dtype=object)
        texts = item_texts(cells, self.text_column, fields, task.compose, errors=self.errors)
        block = score_block(self.classifier, texts, self._exchange, self.pace)
        self.total.add(block.stats)
        # a multi-label task's labels as a list column; a CSV or TSV output joins them (`jobs/ray_classify.py`)
        frame = result_frame(block.results, columns_for(self.classifier.task), self.prefix, lists=True)
        results = pa.Table.from_pandas(frame, schema=pa.schema(self.fields), preserve_index=False)
        for field, values in zip(self.fields, results.columns):
            batch = batch.append_column(field, values)
        # waited for, so the driver's figures are complete once the last row is out
        ray.get(self.board.report.remote(self.key, dataclasses.asdict(self.total),
                                         (began, time.time(), batch.num_rows, block.waited)))
        return batch

    def _exchange(self, publish: dict, want: list, take: list, lease_s: float):
        return ray.get(self.board.exchange.remote(self.key, publish, want, take, lease_s))
