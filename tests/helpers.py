"""The helpers that several test modules share, kept here so that test modules do not import each
other. (One exception left: `test_serve`'s `running` server, imported inside two tests, needs the
optional `serve` extra that this module must not.)

Fixtures stay in `conftest.py` or in their module; a helper that needs a fixture's value takes it as
an argument."""

from __future__ import annotations

import csv
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from slmclassify import Classifier, ModelLoadError, Task, load_model
from slmclassify import classifier as classifier_module
from slmclassify.cli.main import cli
from slmclassify.head import Head, model_fingerprint, task_record
from slmclassify.head.features import collect, default_taps
from slmclassify.head.fitting import fit

# --------------------------------------------------------------------------- labels and tasks

LABELS = ("billing", "technical", "account")
LABEL_ARG = ",".join(LABELS)  # "billing,technical,account", as `--labels` takes them
RAY_TASK = Task(labels=LABELS, user_template="Ticket: {text}")
BACKEND_TASK = Task(labels=("billing", "technical", "account", "accounting"), mode="full",
                    user_template="Ticket: {text}\nCategory:")

# --------------------------------------------------------------------------- texts and input files

_RANDOM_WORDS = ("my card was charged twice invoice app crashes settings page email profile refund the a of "
                 "parcel login error please help thanks waiting days update").split()
_INPUT_WORDS = "card charged twice invoice app crash settings email profile refund login error password".split()
_RAY_WORDS = ("refund invoice charged twice crash login password parcel delivery slow error app settings "
              "email profile account billing shipping feedback update waiting days").split()
# Two kinds of text a random model still tells apart: its states differ with the tokens.
_BILLING = "my card was charged twice for the invoice please refund"
_TECH = "the app crashes with a login error on the settings page"
_BILLING_WORDS = _BILLING.split()
_TECH_WORDS = _TECH.split()


def random_texts(n: int, seed: int, max_words: int = 60) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_RANDOM_WORDS) for _ in range(rng.randint(1, max_words))) for _ in range(n)]


def ray_texts(n: int, seed: int = 0) -> list[str]:
    """Texts of 0..40 words, with empty ones and exact duplicates, as real exports have."""
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(_RAY_WORDS, size=rng.integers(1, 40))) for _ in range(n)]
    for i in rng.choice(n, size=n // 20, replace=False):
        texts[i] = "" if i % 2 else texts[(i * 7) % n]
    return texts


def labelled(n_per_label: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(seed)
    texts, gold = [], []
    for label, words in (("money", _BILLING.split()), ("broken app", _TECH.split())):
        for _ in range(n_per_label):
            texts.append(" ".join(rng.choice(words, size=rng.integers(3, 9))))
            gold.append(label)
    return texts, gold


def make_input(path: Path, n: int, seed: int = 0) -> Path:
    """n short tickets with ids; about one in ten a repeat of an earlier one (duplicates), some empty."""
    rng = random.Random(seed)
    texts = []
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "text"])
        for i in range(n):
            if texts and rng.random() < 0.1:
                text = rng.choice(texts)
            elif rng.random() < 0.03:
                text = ""
            else:
                text = " ".join(rng.choice(_INPUT_WORDS) for _ in range(rng.randint(1, 10)))
            texts.append(text)
            writer.writerow([f"{i:05d}", text])
    return path


def tickets(path: Path, n: int = 24) -> dict[str, str]:
    """A CSV of two kinds of text (and one empty row); returns {text: gold}."""
    rng = np.random.default_rng(0)
    rows, gold = [], {}
    for i in range(n):
        label, words = ("billing", _BILLING_WORDS) if i % 2 else ("technical", _TECH_WORDS)
        text = " ".join(rng.choice(words, size=rng.integers(4, 9)))
        rows.append({"id": f"T{i:03d}", "text": text})
        gold[text] = label
    rows.insert(5, {"id": "EMPTY", "text": ""})
    pd.DataFrame(rows).to_csv(path, index=False)
    return gold


# id, text, note: ids with leading zeros, an empty and a whitespace-only text, empty/NA notes.
ROWS = [
    ("007", "My card was charged twice for the same invoice.", "first"),
    ("0001", "The mobile app crashes whenever I open the settings page.", ""),
    ("0042", "", "NA"),
    ("10", "   \t ", "x"),
    ("9", "I need to change the email address on my profile.", "nan"),
    ("0100", "crash", "last"),
]


def write_csv(path: Path, rows, header=("id", "text", "note")) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def write_input(path: Path, rows=ROWS, header=("id", "text", "note")) -> Path:
    """Write rows of strings as CSV, JSONL or Parquet (from the extension)."""
    frame = pd.DataFrame([dict(zip(header, r)) for r in rows], columns=list(header))
    if path.suffix == ".csv":
        return write_csv(path, rows, header)
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(dict(zip(header, r))) + "\n" for r in rows), encoding="utf-8")
    else:
        frame.to_parquet(path, index=False)
    return path


# --------------------------------------------------------------------------- the fast path against the reference


def assert_matches_reference(clf: Classifier, texts: list[str], atol: float = 1e-4, scorer=None, prefix=None):
    """The fast path's `Scored` of `texts`, checked against the reference path (`scorer` and `prefix`:
    score with these instead of the classifier's own, e.g. another prefix)."""
    scorer = scorer or clf.scorer
    encoded = scorer.encode(texts)
    scored = scorer.score(encoded, clf.engine, clf.prefix if prefix is None else prefix)
    fast = scored.scores
    ref = clf.reference(encoded, range(len(texts)))
    diff = np.abs(fast - ref)
    assert diff.max() <= atol, f"fast vs reference differ by {diff.max():.2e}\nfast:\n{fast}\nreference:\n{ref}"
    return scored


def assert_refused_before_weights(folder, target, edit: dict, named: str) -> None:
    """A copy of model `folder` in `target` with `edit` on its config and unreadable weights is refused
    at load with one line naming `named` (the config is checked before any weight is read)."""
    config = json.loads((folder / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, **edit}))
    for f in folder.iterdir():
        if f.name != "config.json":
            (target / f.name).write_bytes(f.read_bytes())
    (target / "model.safetensors").write_bytes(b"not read: the config is refused first")
    with pytest.raises(ModelLoadError, match=named.replace("(", r"\(").replace(".", r"\.")) as info:
        load_model(str(target))
    assert "\n" not in str(info.value)


def fitted_head(loaded, task, texts, gold) -> Head:
    clf = Classifier(task, model=loaded)
    taps = default_taps(loaded.model.config.num_hidden_layers)
    _, calibrated, states = collect(clf, clf.encode(texts), taps)
    X = np.concatenate([states, calibrated], axis=1)
    f = fit(X, gold, folds=3)
    return Head(labels=f.labels, taps=taps, use_scores=True, mean=f.mean, scale=f.scale, coef=f.coef,
                intercept=f.intercept, model=model_fingerprint(loaded), task=task_record(task), info={"C": f.C})


# --------------------------------------------------------------------------- running the command line


def invoke(*args):
    """A successful run through CliRunner (exceptions propagate)."""
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def classify_args(src, target, model_dir, *extra):
    return ["classify", str(src), "-o", str(target), "--labels", LABEL_ARG, "--model", str(model_dir), "--window",
            "8", "--quiet", "--no-verify", *extra]


def one_error(code, err) -> str:
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slmclassify: error: "), err
    return lines[0]


def cli_command():
    script = Path(sys.executable).parent / "slmclassify"
    return [str(script)] if script.exists() else [sys.executable, "-c", "from slmclassify.cli.main import main; main()"]


def cli_env(tmp_path):
    """The environment of a command a test starts: its own config and cache folders. The cache starts
    with a copy of the C kernels this session compiled (`backends/native.py`: each named by its sources,
    flags and CPU, its record checked before loading), so that the command does not compile them again
    (~2.6 s of CPU each time); it measures, converts and records everything else itself. A kernel the
    session has not built yet is compiled by the command, as a user's first run would."""
    from slmclassify.cache import cache_root

    kernels, own = cache_root() / "kernels", tmp_path / "cache" / "slmclassify" / "kernels"
    if kernels.is_dir() and not own.exists():
        shutil.copytree(kernels, own, ignore=shutil.ignore_patterns("tmp*"))
    return {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def interrupt_after(monkeypatch, windows: int):
    """Ctrl-C while scoring window number `windows` (0-based)."""
    original = classifier_module.Classifier.score_items
    calls = []

    def scoring(self, items, *args, **kwargs):
        calls.append(kwargs.get("start", 0))
        if len(calls) > windows:
            raise KeyboardInterrupt
        return original(self, items, *args, **kwargs)

    monkeypatch.setattr(classifier_module.Classifier, "score_items", scoring)
    return monkeypatch


def wait_for(condition, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
