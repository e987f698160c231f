"""Inter-annotator agreement (`label/agreement.py`) against the references: `krippendorff` (alpha),
statsmodels (Fleiss' kappa), scikit-learn (Cohen's kappa), a brute-force walk over every pair of
answers (raw agreement, confusion, specific agreement, per annotator), and the published values of
the textbook examples."""

from __future__ import annotations

import json
from itertools import combinations

import numpy as np
import pytest

from slmclassify.errors import InputError
from slmclassify.label.agreement import agreement, lines, table

krippendorff = pytest.importorskip("krippendorff")
inter_rater = pytest.importorskip("statsmodels.stats.inter_rater")
metrics = pytest.importorskip("sklearn.metrics")

EXACT = dict(rel=1e-9, abs=1e-12)
"""Against a reference implementation: the same number up to rounding."""
PUBLISHED = dict(abs=5e-4)
"""Against a value published to 3 decimals."""

# Wikipedia's Fleiss' kappa example: 10 items, 14 raters each, counts per category (5 categories).
FLEISS_COUNTS = [[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
                 [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]]
# Krippendorff (2011), "Computing Krippendorff's alpha-reliability", nominal data with missing values:
# 4 coders (rows) x 12 units, values 1..5, None missing; nominal alpha = 0.743.
KRIPPENDORFF_DATA = [[1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None],
                     [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3],
                     [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None],
                     [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None]]


def names(prefix: str, count: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{k}" for k in range(count))


def random_answers(seed: int, items: int, annotators: int, labels: int, missing: float = 0.0) -> np.ndarray:
    """A table where each annotator gives the item's true label with probability 0.6, else a random one."""
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, labels, items)
    guess = rng.integers(0, labels, (items, annotators))
    out = np.where(rng.random((items, annotators)) < 0.6, truth[:, None], guess)
    return np.where(rng.random((items, annotators)) < missing, -1, out)


def counts_of(answers: np.ndarray, labels: int) -> np.ndarray:
    return np.array([[int((row == j).sum()) for j in range(labels)] for row in answers])


def answer_pairs(answers: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Every unordered pair of answers to one item: (annotator, label, annotator, label)."""
    out = []
    for row in answers:
        given = [(a, int(x)) for a, x in enumerate(row) if x >= 0]
        out += [(a, x, b, y) for (a, x), (b, y) in combinations(given, 2)]
    return out


def alpha_reference(answers: np.ndarray) -> float:
    data = np.where(answers >= 0, answers, np.nan).T.astype(float)  # rows are annotators
    return krippendorff.alpha(reliability_data=data, level_of_measurement="nominal")


def fleiss_reference(answers: np.ndarray) -> float:
    return inter_rater.fleiss_kappa(inter_rater.aggregate_raters(answers)[0], method="fleiss")


def fleiss_varying(counts: np.ndarray) -> float:
    """The brief's generalised Fleiss kappa, written out item by item."""
    counts = [row for row in counts.tolist() if sum(row) >= 2]
    p_items = [sum(c * (c - 1) for c in row) / (sum(row) * (sum(row) - 1)) for row in counts]
    total = sum(map(sum, counts))
    p_e = sum((sum(row[j] for row in counts) / total) ** 2 for j in range(len(counts[0])))
    return (sum(p_items) / len(p_items) - p_e) / (1 - p_e)


def check_against_pairs(report: dict, answers: np.ndarray, n_labels: int) -> None:
    """raw, confusion, specific agreement and per annotator, from the brute-force pairs."""
    pairs = answer_pairs(answers)
    assert report["overall"]["raw"]["value"] == pytest.approx(np.mean([x == y for _, x, _, y in pairs]), **EXACT)
    confusion = np.zeros((n_labels, n_labels), dtype=int)
    for _, x, _, y in pairs:
        confusion[x, y] += 1
        confusion[y, x] += 1
    assert report["confusion"] == confusion.tolist()
    for j, label in enumerate(report["labels"]):
        involving = [(x, y) for _, x, _, y in pairs if j in (x, y)]
        expected = 2 * sum(x == y for x, y in involving) / (sum(x == y for x, y in involving) + len(involving))
        assert report["per_label"][label]["specific_agreement"] == pytest.approx(expected, **EXACT)
    for a, name in enumerate(report["annotators"]):
        mine = [(x, y) for p, x, q, y in pairs if p == a] + [(y, x) for p, x, q, y in pairs if q == a]
        stats = report["per_annotator"][name]
        assert stats["answers"] == int((answers[(answers >= 0).sum(1) >= 2, a] >= 0).sum())
        assert stats["agreement"] == pytest.approx(np.mean([x == y for x, y in mine]), **EXACT)
        mine_x, mine_y = zip(*mine)
        assert stats["kappa"] == pytest.approx(metrics.cohen_kappa_score(mine_x, mine_y), **EXACT)


def check_cohen(report: dict, answers: np.ndarray) -> None:
    expected = []
    for a, b in combinations(range(answers.shape[1]), 2):
        both = (answers[:, a] >= 0) & (answers[:, b] >= 0)
        if both.sum() >= 2:
            kappa = metrics.cohen_kappa_score(answers[both, a], answers[both, b])
            expected.append((report["annotators"][a], report["annotators"][b], int(both.sum()), kappa))
    got = [(p["a"], p["b"], p["items"], p["value"]) for p in report["cohen_kappa"]]
    assert [g[:3] for g in got] == [e[:3] for e in expected]
    assert [g[3] for g in got] == pytest.approx([e[3] for e in expected], **EXACT)


def test_fleiss_wikipedia_example():
    counts = np.array(FLEISS_COUNTS)
    answers = np.array([np.repeat(np.arange(5), row) for row in counts])  # 14 raters, in category order
    report = agreement(answers, names("c", 5), names("r", 14), bootstrap=50)
    assert report["overall"]["fleiss_kappa"]["value"] == pytest.approx(0.210, **PUBLISHED)
    assert report["overall"]["fleiss_kappa"]["value"] == pytest.approx(inter_rater.fleiss_kappa(counts), **EXACT)
    assert report["overall"]["raw"]["value"] == pytest.approx(0.378, **PUBLISHED)  # P-bar: every item has 14
    assert (report["items"], report["answers"], report["unpaired_items"]) == (10, 140, 0)


def test_krippendorff_example_with_missing_data():
    data = np.array([[-1 if v is None else v - 1 for v in coder] for coder in KRIPPENDORFF_DATA]).T
    report = agreement(data, tuple("12345"), tuple("ABCD"), bootstrap=50)
    alpha = report["overall"]["krippendorff_alpha"]["value"]
    assert alpha == pytest.approx(0.743, **PUBLISHED)
    assert alpha == pytest.approx(alpha_reference(data), **EXACT)
    assert (report["items"], report["answers"], report["unpaired_items"]) == (11, 40, 1)  # unit 12: one answer
    check_cohen(report, data)
    check_against_pairs(report, data, 5)


def test_cohen_example():
    """Wikipedia's Cohen's kappa example: 50 items, yes/yes 20, yes/no 5, no/yes 10, no/no 15: kappa 0.4."""
    cells = [(0, 0)] * 20 + [(0, 1)] * 5 + [(1, 0)] * 10 + [(1, 1)] * 15
    report = agreement(np.array(cells), ("yes", "no"), ("A", "B"), bootstrap=50)
    (pair,) = report["cohen_kappa"]
    assert (pair["a"], pair["b"], pair["items"]) == ("A", "B", 50)
    assert pair["value"] == pytest.approx(0.4, **EXACT)
    assert report["overall"]["raw"]["value"] == pytest.approx(0.7, **EXACT)
    check_cohen(report, np.array(cells))


@pytest.mark.parametrize("seed, items, annotators, labels", [(0, 30, 3, 2), (1, 60, 5, 4), (2, 12, 8, 3),
                                                            (3, 100, 2, 6)])
def test_full_tables_against_references(seed, items, annotators, labels):
    answers = random_answers(seed, items, annotators, labels)
    report = agreement(answers, names("l", labels), names("a", annotators), bootstrap=20)
    overall = report["overall"]
    assert overall["fleiss_kappa"]["value"] == pytest.approx(fleiss_reference(answers), **EXACT)
    assert overall["krippendorff_alpha"]["value"] == pytest.approx(alpha_reference(answers), **EXACT)
    check_cohen(report, answers)
    check_against_pairs(report, answers, labels)
    counts = counts_of(answers, labels)
    for j in range(labels):  # per-category kappa: Fleiss' kappa of label j against the rest
        binary = np.column_stack([counts[:, j], annotators - counts[:, j]])
        expected = inter_rater.fleiss_kappa(binary) if 0 < counts[:, j].sum() < counts.sum() else None
        assert report["per_label"][f"l{j}"]["kappa"] == (None if expected is None else pytest.approx(expected, **EXACT))


@pytest.mark.parametrize("seed, items, annotators, labels, missing", [(4, 40, 4, 3, 0.3), (5, 80, 6, 5, 0.5),
                                                                     (6, 25, 3, 2, 0.4)])
def test_tables_with_missing_answers(seed, items, annotators, labels, missing):
    answers = random_answers(seed, items, annotators, labels, missing)
    report = agreement(answers, names("l", labels), names("a", annotators), bootstrap=20)
    assert report["overall"]["krippendorff_alpha"]["value"] == pytest.approx(alpha_reference(answers), **EXACT)
    assert report["overall"]["fleiss_kappa"]["value"] == pytest.approx(fleiss_varying(counts_of(answers, labels)),
                                                                       **EXACT)
    check_cohen(report, answers)
    check_against_pairs(report, answers, labels)
    counts = counts_of(answers, labels)
    counts = counts[counts.sum(1) >= 2]
    n = counts.sum(1)
    for j in range(labels):  # the varying-n per-category kappa, written out
        p = counts[:, j].sum() / counts.sum()
        expected = 1 - (counts[:, j] * (n - counts[:, j])).sum() / ((n * (n - 1)).sum() * p * (1 - p))
        assert report["per_label"][f"l{j}"]["kappa"] == pytest.approx(expected, **EXACT)
    assert report["unpaired_items"] == int(((answers >= 0).sum(1) < 2).sum())


def test_perfect_agreement_gives_one():
    answers = np.repeat(np.arange(6) % 3, 4).reshape(6, 4)
    report = agreement(answers, names("l", 3), names("a", 4), bootstrap=30)
    for est in [*report["overall"].values(), *report["cohen_kappa"]]:
        assert (est["value"], est["low"], est["high"]) == (1.0, 1.0, 1.0)
    assert all(stats["specific_agreement"] == 1.0 and stats["kappa"] == 1.0 for stats in report["per_label"].values())
    assert all(stats["agreement"] == 1.0 and stats["kappa"] == 1.0 for stats in report["per_annotator"].values())


def test_bootstrap_interval_contains_the_value_and_is_seeded():
    answers = random_answers(7, 80, 4, 3, missing=0.2)
    args = (answers, names("l", 3), names("a", 4))
    report = agreement(*args)  # the default: 1000 resamples
    again, other = agreement(*args, seed=0), agreement(*args, seed=1)
    assert report == again
    assert report["overall"] != other["overall"]
    assert report["bootstrap"] == {"resamples": 1000, "seed": 0, "level": 0.95}
    for est in [*report["overall"].values(), *report["cohen_kappa"]]:
        assert est["low"] < est["value"] < est["high"]
        assert est["resamples"] == 1000
    assert report["overall"]["raw"]["high"] - report["overall"]["raw"]["low"] < 0.3


def test_items_with_one_answer_are_ignored():
    answers = random_answers(8, 30, 4, 3, missing=0.2)
    lonely = np.array([[2, -1, -1, -1], [-1, -1, -1, -1], [-1, 0, -1, -1]])
    base = agreement(answers, names("l", 3), names("a", 4), bootstrap=20)
    more = agreement(np.vstack([lonely, answers, lonely]), names("l", 3), names("a", 4), bootstrap=20)
    assert more["unpaired_items"] == base["unpaired_items"] + 6
    assert {k: v for k, v in more.items() if k != "unpaired_items"} == {
        k: v for k, v in base.items() if k != "unpaired_items"}


def test_degenerate_tables_give_none_not_nan():
    one_label = np.zeros((5, 3), dtype=int)
    report = agreement(one_label, ("a", "b"), ("x", "y", "z"), bootstrap=20)
    json.dumps(report, allow_nan=False)
    assert report["overall"]["raw"]["value"] == 1.0
    for est in [report["overall"]["fleiss_kappa"], report["overall"]["krippendorff_alpha"], *report["cohen_kappa"]]:
        assert {k: est[k] for k in ("value", "low", "high", "resamples")} == {
            "value": None, "low": None, "high": None, "resamples": 0}
    assert report["per_label"] == {"a": {"specific_agreement": 1.0, "kappa": None},
                                   "b": {"specific_agreement": None, "kappa": None}}
    assert report["per_annotator"]["x"] == {"answers": 5, "agreement": 1.0, "kappa": None}

    nobody = agreement(np.array([[0, -1], [-1, 1], [-1, -1]]), ("a", "b"), ("x", "y"), bootstrap=20)
    json.dumps(nobody, allow_nan=False)
    assert (nobody["items"], nobody["answers"], nobody["unpaired_items"], nobody["cohen_kappa"]) == (0, 0, 3, [])
    assert all(est["value"] is None for est in nobody["overall"].values())
    assert nobody["confusion"] == [[0, 0], [0, 0]]
    lines(nobody)


def test_degenerate_resamples_are_skipped_and_counted():
    """Two items disagree, eight agree on one label: some resamples hold that label only."""
    answers = np.array([[0, 1], [1, 0]] + [[0, 0]] * 8)
    report = agreement(answers, ("a", "b"), ("x", "y"), bootstrap=200)
    alpha = report["overall"]["krippendorff_alpha"]
    assert 0 < alpha["resamples"] < 200
    assert alpha["value"] == pytest.approx(alpha_reference(answers), **EXACT)
    json.dumps(report, allow_nan=False)
    assert any("resamples usable" in line for line in lines(report))


def test_lines_mention_every_annotator_label_and_statistic():
    answers = random_answers(9, 20, 3, 3, missing=0.3)
    report = agreement(answers, ("spam", "ham", "eggs"), ("alice", "bob", "carol"), bootstrap=20)
    text = "\n".join(lines(report))
    for word in ("alice", "bob", "carol", "spam", "ham", "eggs", "Fleiss' kappa", "Krippendorff's alpha",
                 "raw agreement", "alice - bob"):
        assert word in text
    kappa = report["overall"]["fleiss_kappa"]
    assert f"{kappa['value']:5.2f} [{kappa['low']:5.2f}, {kappa['high']:5.2f}]" in text


def test_table_builds_the_answers():
    items = [{"alice": "spam", "bob": "ham"}, {"bob": "spam"}, {}]
    got = table(items, ("spam", "ham"), ("alice", "bob", "carol"))
    assert got.tolist() == [[0, 1, -1], [-1, 0, -1], [-1, -1, -1]]
    with pytest.raises(InputError, match="unknown annotator 'dave'"):
        table([{"dave": "spam"}], ("spam", "ham"), ("alice", "bob"))
    with pytest.raises(InputError, match="'eggs', not a label"):
        table([{"alice": "eggs"}], ("spam", "ham"), ("alice", "bob"))


@pytest.mark.parametrize("answers, message", [(np.zeros((3, 2), dtype=int), "3 annotators"),
                                              (np.zeros((3, 3)), "integers"),
                                              (np.full((3, 3), 2), "0..1 or -1"),
                                              (np.full((3, 3), -2), "0..1 or -1")])
def test_bad_tables_are_refused(answers, message):
    with pytest.raises(InputError, match=message):
        agreement(answers, ("a", "b"), ("x", "y", "z"))
