"""Ray Data integration (`pip install 'slmclassify[ray]'`): classify a `ray.data.Dataset` on a pool
of actors, in input order, with the same results as a single-process run.

    import ray
    from slmclassify import Task
    from slmclassify.ray import RaySettings, classify_dataset

    ray.init()                                   # or ray.init(address="auto") on a cluster
    ds = ray.data.read_parquet("s3://bucket/tickets/")
    run = classify_dataset(ds, Task(labels=("billing", "technical", "account")),
                           ray_settings=RaySettings(actors=8, cpus_per_actor=4))
    run.dataset.write_parquet("labelled/")       # rows in input order; run.figures() per actor

Imported only when used: `import slmclassify` never imports Ray. Inside this package `import ray`
is an absolute import and gets the Ray package, not this module.
"""

from __future__ import annotations

from .dataset import DEFAULT_BLOCK_ROWS, RayRun, RaySettings, classify_dataset

__all__ = ["DEFAULT_BLOCK_ROWS", "RayRun", "RaySettings", "classify_dataset"]
