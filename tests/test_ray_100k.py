"""The 100,000-row check of the Ray integration: every row once, in order, with the single-process
result. Too slow for every CI run (minutes on 2 cores); run it with

    SLMCLASSIFY_RAY_100K=1 .venv/bin/python -m pytest tests/test_ray_100k.py -s
"""

from __future__ import annotations

import os
import time

import numpy as np
import pandas as pd
import pytest

ray = pytest.importorskip("ray")

from slmclassify import Classifier  # noqa: E402
from slmclassify.ray import RaySettings, classify_dataset  # noqa: E402
from slmclassify.ray.local import start_ray  # noqa: E402

from helpers import LABELS, RAY_TASK, ray_texts  # noqa: E402

pytestmark = pytest.mark.skipif(not os.environ.get("SLMCLASSIFY_RAY_100K"), reason="set SLMCLASSIFY_RAY_100K=1")


def test_100k_rows_in_order_and_equal_to_single_process(llama_dir, llama_loaded):
    """Both paths: Ray Data (`classify_dataset`) and actors fed by the driver (`pool.py`, one small file)."""
    import pyarrow as pa

    from slmclassify.ray.blocks import restore, spread
    from slmclassify.ray.pool import start_pool

    n = 100_000
    texts = ray_texts(n, seed=7)
    began = time.perf_counter()
    expected = Classifier(RAY_TASK, model=llama_loaded).classify(texts)
    single = time.perf_counter() - began
    settings = RaySettings(actors=2, block_rows=1024)
    start_ray(num_cpus=2)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        ds = ray.data.from_items([{"row": i, "text": t} for i, t in enumerate(texts)], override_num_blocks=16)
        began = time.perf_counter()
        on_data = classify_dataset(ds, RAY_TASK, model=str(llama_dir), ray_settings=settings).dataset.to_pandas()
        data_s = time.perf_counter() - began
        began = time.perf_counter()
        pool = start_pool(RAY_TASK, model=str(llama_dir), ray_settings=settings)
        blocks, order = spread(pa.table({"row": list(range(n)), "text": texts}), "text", settings.block_rows,
                               settings.actors)
        on_pool = restore(pa.concat_tables(pool.classify(blocks)), order).to_pandas()
        pool_s = time.perf_counter() - began
    finally:
        ray.shutdown()
    for frame in (on_data, on_pool):
        assert frame["row"].tolist() == list(range(n))
        assert [None if pd.isna(v) else v for v in frame["label"]] == [r.label for r in expected]
        assert frame["status"].tolist() == [r.status for r in expected]
    deltas = [max(float(np.nanmax(np.abs(frame[f"p_{lab}"].to_numpy()
                                         - np.array([r.probabilities.get(lab, np.nan) for r in expected]))))
                  for lab in LABELS) for frame in (on_data, on_pool)]
    assert max(deltas) <= 1e-4
    print(f"\n100k rows: single process {single:.1f} s; ray 2 actors x 1 CPU: Ray Data {data_s:.1f} s, "
          f"fed by the driver {pool_s:.1f} s; labels identical, in order, max |dp| {deltas[0]:.1e} / {deltas[1]:.1e}")
