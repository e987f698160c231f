"""The streaming core: `Classifier.classify_iter` over windows, duplicates scored once, the compact
token layout and the split tokenisation, and the API's input checks. Tiny random Llama model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import assert_same_scores
from slmclassify import Classifier, EngineSettings, InputError, Task
from slmclassify.core.encode import PromptSplit, encode_items
from slmclassify.core.results import RunStats

LABELS = ("billing", "technical", "account")
POOL = [
    "crash", "My card was charged twice for the same invoice.", "", "refund please",
    "The mobile app crashes whenever I open the settings page on my phone every single time.",
    "login error", "  ", "I need to change the email address on my profile.", "x", "invoice invoice invoice",
]


@pytest.fixture(scope="module")
def clf(llama_loaded):
    return Classifier(Task(labels=LABELS), model=llama_loaded)


@pytest.fixture(scope="module")
def alone(clf):
    """Each pool text classified on its own: a batch of one, no padding, no window."""
    return {text: clf.classify([text])[0] for text in POOL}


def _probs(result):
    return np.array([result.probabilities.get(label, np.nan) for label in LABELS])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(picks=st.lists(st.integers(0, len(POOL) - 1), max_size=40), window=st.integers(1, 12))
def test_order_across_windows(clf, alone, picks, window):
    """Whatever the window, every text gets its own result, in input order (duplicates included)."""
    windowed = clf.variant(EngineSettings(window=window))
    texts = [POOL[p] for p in picks]
    windows = list(windowed.classify_windows(iter(texts)))  # a one-shot iterator, as from a file
    results = [r for w in windows for r in w.results]
    assert len(results) == len(texts)
    for i, (text, result) in enumerate(zip(texts, results)):
        want = alone[text]
        assert result.status == want.status, (i, text)
        assert result.label == want.label, (i, text)
        assert_same_scores(_probs(result), _probs(want), clf.engine, err_msg=f"row {i}: {text!r}")
    assert sum(w.stats.items for w in windows) == len(texts)
    assert [w.start for w in windows] == list(range(0, len(texts), window))


def test_duplicates_are_scored_once_per_window(clf):
    windowed = clf.variant(EngineSettings(window=8))
    texts = ["crash", "refund please", "crash", "", "crash", "refund please", "login error", "crash",  # window 1
             "crash", "crash"]  # window 2: its first "crash" is scored again, its second reused
    windows = list(windowed.classify_windows(texts))
    results = [r for w in windows for r in w.results]
    stats = RunStats()
    for w in windows:
        stats.add(w.stats)
    assert [w.stats.reused for w in windows] == [4, 1]
    assert stats.items == 10
    assert stats.scored == 9
    assert stats.reused == 4 + 1
    crash = [r for t, r in zip(texts, results) if t == "crash"]
    assert all(r.scores == crash[0].scores for r in crash[1:4])  # identical: one scoring, shared
    # window 2 scores "crash" again in another batch: the same bits where the backend is batch-invariant
    assert all(r.label == crash[0].label for r in crash)
    assert_same_scores(list(crash[4].scores.values()), list(crash[0].scores.values()), clf.engine)
    assert crash[5].scores == crash[4].scores  # shared within window 2
    assert results[3].status == "empty"


def test_window_holds_only_window_rows(clf):
    """classify_iter pulls at most one window of texts ahead of what it yields."""
    windowed = clf.variant(EngineSettings(window=4))
    pulled = []

    def source():
        for i in range(20):
            pulled.append(i)
            yield POOL[i % len(POOL)]

    stream = windowed.classify_iter(source())
    next(stream)
    assert len(pulled) == 4
    for _ in range(4):
        next(stream)
    assert len(pulled) == 8


def test_bare_string_is_an_error(clf):
    with pytest.raises(InputError, match=r"got a single str; pass a list: classify\(\[text\]\)"):
        clf.classify("one string")
    with pytest.raises(InputError, match="got a single bytes"):
        list(clf.classify_iter(b"bytes"))


def test_none_is_an_empty_text(clf):
    """Regression: classify(["ok", None]) raised AttributeError."""
    results = clf.classify(["ok", None])
    assert [r.status for r in results] == ["ok", "empty"]
    assert results[1].label is None and results[1].needs_review is True


def test_non_text_items_are_named(clf):
    with pytest.raises(InputError, match=r"texts\[1\] is a int, not a str"):
        clf.classify(["ok", 5])
    with pytest.raises(InputError, match=r"texts\[0\] is not valid Unicode"):
        clf.classify(["\ud800"])


def test_compact_layout_keeps_only_suffixes(clf):
    texts = ["crash", "My card was charged twice.", "", "login error"]
    encoded = clf.encode(texts)
    assert encoded.tokens.dtype == np.int32 and encoded.offsets.dtype == np.int64
    n_prefix = len(encoded.prefix_ids)
    assert n_prefix > 0 and encoded.cached[[0, 1, 3]].all()
    tok = clf.loaded.tokenizer
    for i, text in enumerate(texts):
        if not text:
            assert encoded.ids[i] == [] and len(encoded.own(i)) == 0
            continue
        full = tok(clf.renderer.render(text), add_special_tokens=False)["input_ids"]
        assert encoded.ids[i] == full  # the per-item path's exact tokens
        assert encoded.suffix(i) == full[n_prefix:]  # only the suffix is stored
        assert encoded.prompt_length(i) == len(full)
    assert len(encoded.tokens) == sum(len(encoded.suffix(i)) for i in range(len(texts)))


def test_split_tokenisation_is_exact_on_awkward_texts(clf):
    split = PromptSplit(clf.loaded.tokenizer, clf.renderer)
    assert split.active  # the ChatML head has special tokens to split at
    tok = clf.loaded.tokenizer
    texts = [" lead", "\n\nnl", "trailing  ", "<|im_start|>user", "Grüße ✓", "a" * 60, "crash\tcrash"]
    encoded = encode_items(tok, clf.renderer, texts, clf.prefix_ids, clf.max_prompt_tokens, split=split)
    for i, text in enumerate(texts):
        assert encoded.ids[i] == tok(clf.renderer.render(text), add_special_tokens=False)["input_ids"], text


def test_split_is_off_when_it_would_differ(clf, monkeypatch):
    """If the tokenizer merged across the special token, the split must switch itself off."""
    from slmclassify.core import encode

    monkeypatch.setattr(encode, "_SPLIT_PROBES", ("",))
    tok = clf.loaded.tokenizer

    class Merging:
        """A tokenizer whose ids depend on the whole string (here: its length as a first id)."""

        def __call__(self, texts, add_special_tokens=False):
            return {"input_ids": [[len(t)] + tok(t, add_special_tokens=False)["input_ids"] for t in texts]}

    split = PromptSplit(Merging(), clf.renderer)
    assert not split.active


def test_sweep_shows_the_window_trade_off(llama_dir, tmp_path):
    from click.testing import CliRunner

    from slmclassify.cli.main import cli

    result = CliRunner().invoke(cli, ["sweep", "--n", "6", "--budgets", "64", "--row-caps", "4", "--windows", "2,8",
                                      "--model", str(llama_dir), "--plot", str(tmp_path / "s.png")],
                                catch_exceptions=False)
    lines = result.stdout.splitlines()
    header = lines.index(f"{'window':>8} {'items/s':>8} {'padding%':>9} {'reused':>7} {'peak RSS MB':>12}")
    rows = [line.split() for line in lines[header + 1 : header + 3]]
    assert [r[0] for r in rows] == ["2", "8"]
    assert lines[header + 3].startswith("plot: ")  # the plot is drawn last, after every measurement
    assert all(float(r[1]) > 0 and 0 <= float(r[2]) <= 100 for r in rows)


def test_progress_status_line_for_logs():
    """Not a terminal: one status line per period, with rows/s, the share done and an ETA."""
    import io as _io

    from slmclassify.cli.progress import Progress

    stream = _io.StringIO()
    progress = Progress(total_rows=1000, total_bytes=None, every=0.0, stream=stream)
    progress.update(250)
    progress.update(250)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[1].startswith("progress: 500 rows, ") and ", 50.0% done, ETA " in lines[1]
    quiet = _io.StringIO()
    Progress(total_rows=10, total_bytes=None, enabled=False, every=0.0, stream=quiet).update(5)
    assert quiet.getvalue() == ""
