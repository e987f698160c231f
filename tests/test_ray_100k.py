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

from test_ray import LABELS, TASK, _texts  # noqa: E402

pytestmark = pytest.mark.skipif(not os.environ.get("SLMCLASSIFY_RAY_100K"), reason="set SLMCLASSIFY_RAY_100K=1")


def test_100k_rows_in_order_and_equal_to_single_process(llama_dir, llama_loaded):
    n = 100_000
    texts = _texts(n, seed=7)
    began = time.perf_counter()
    expected = Classifier(TASK, model=llama_loaded).classify(texts)
    single = time.perf_counter() - began
    start_ray(num_cpus=2)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        ds = ray.data.from_items([{"row": i, "text": t} for i, t in enumerate(texts)], override_num_blocks=16)
        began = time.perf_counter()
        frame = classify_dataset(ds, TASK, model=str(llama_dir),
                                 ray_settings=RaySettings(actors=2, block_rows=1024)).dataset.to_pandas()
        on_ray = time.perf_counter() - began
    finally:
        ray.shutdown()
    assert frame["row"].tolist() == list(range(n))
    assert [None if pd.isna(v) else v for v in frame["label"]] == [r.label for r in expected]
    assert frame["status"].tolist() == [r.status for r in expected]
    delta = max(float(np.nanmax(np.abs(frame[f"p_{lab}"].to_numpy()
                                       - np.array([r.probabilities.get(lab, np.nan) for r in expected]))))
                for lab in LABELS)
    assert delta <= 1e-4
    print(f"\n100k rows: single process {single:.1f} s, ray 2 actors x 1 CPU {on_ray:.1f} s; "
          f"labels identical, in order, max |dp| {delta:.1e}")
