"""The fast path (prefix cache + left-padded token-budget batches + label trie) must give the
reference path's label log-probabilities, for both architectures and every scoring mode."""

from __future__ import annotations

import dataclasses
import random
import zlib

import numpy as np
import pytest
import torch

from conftest import TEST_DEVICE, assert_same_scores
from slmclassify import Classifier, EngineSettings, Task, TaskError
from slmclassify.classifier import content_free_prior
from slmclassify.core.batching import collate
from slmclassify.core.verify import compare, pick_probes

from helpers import assert_matches_reference, random_texts

pytestmark = pytest.mark.isa  # all of it runs again under `make test`'s ISA caps (Makefile)


@pytest.mark.parametrize("mode", ["first", "full", "full-mean"])
@pytest.mark.parametrize("budget,max_rows", [(None, 3), (120, 8), (4096, 64)])
def test_fast_path_equals_reference(tiny_loaded, mode, budget, max_rows):
    labels = ("billing", "technical", "account") if mode == "first" else ("billing", "technical", "account", "accounting")
    task = Task(labels=labels, mode=mode, user_template="Ticket: {text}\nCategory:")
    clf = Classifier(task, model=tiny_loaded, settings=EngineSettings(token_budget=budget, max_rows=max_rows))
    assert clf.mode == mode
    assert clf.prefix is not None and clf.prefix.length > 10
    # A stable seed per case (hash() of a str changes with PYTHONHASHSEED: failures would not reproduce).
    scored = assert_matches_reference(clf, random_texts(13, seed=zlib.crc32(f"{mode}/{budget}".encode()) % 1000))
    assert scored.stats.fallbacks == 0
    assert scored.stats.prefix_reused == clf.prefix.length * 13


@pytest.mark.parametrize("seed", range(3))
def test_random_batch_compositions(tiny_loaded, seed):
    """Random lengths, random budgets and row caps, with and without the cache or sorting."""
    rng = random.Random(seed)
    settings = EngineSettings(
        token_budget=rng.choice([None, 64, 200, 1000]), max_rows=rng.randint(1, 9),
        prefix_cache=rng.random() < 0.7, sort=rng.random() < 0.7,
    )
    task = Task(labels=("billing", "account", "account_deletion"), mode="full",
                examples=(), instruction="Sort the tickets.")
    clf = Classifier(task, model=tiny_loaded, settings=settings)
    assert_matches_reference(clf, random_texts(rng.randint(1, 12), seed=seed, max_words=90))


def test_few_shot_examples_live_in_prefix(tiny_loaded):
    from slmclassify.core.task import Example

    task = Task(labels=("billing", "technical"), examples=(Example("card charged twice", "billing"),
                                                          Example("app crashes", "technical")))
    clf = Classifier(task, model=tiny_loaded)
    plain = Classifier(Task(labels=("billing", "technical")), model=tiny_loaded)
    assert clf.prefix.length > plain.prefix.length
    assert_matches_reference(clf, random_texts(5, seed=7))


def test_label_prefix_gets_end_of_turn(tiny_loaded):
    """`account` is a token prefix of `accounting`: both get the end-of-turn token appended."""
    clf = Classifier(Task(labels=("account", "accounting"), mode="full"), model=tiny_loaded)
    eot = tiny_loaded.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert all(seq[-1] == eot for seq in clf.trie.sequences)
    assert "end-of-turn" in clf.mode_reason
    assert_matches_reference(clf, random_texts(4, seed=3))


def test_first_equals_full_for_single_token_labels(tiny_loaded):
    texts = random_texts(6, seed=11)
    labels = ("billing", "technical", "refund")  # single tokens in the tiny vocabulary
    first = Classifier(Task(labels=labels, mode="first"), model=tiny_loaded)
    full = Classifier(Task(labels=labels, mode="full"), model=tiny_loaded)
    assert all(len(s) == 1 for s in full.trie.sequences), full.trie.sequences
    np.testing.assert_array_equal(first.score(first.encode(texts)).scores, full.score(full.encode(texts)).scores)
    auto = Classifier(Task(labels=labels), model=tiny_loaded)
    assert auto.mode == "first"


def test_left_padding_regression(tiny_loaded):
    """Regression: with right padding (or positions counted from the padded edge) the last
    position of short rows reads a pad token and every short row is scored wrongly. The engine
    left-pads and derives positions from each row's length; this pins both."""
    clf = Classifier(Task(labels=("billing", "technical", "account"), mode="first"), model=tiny_loaded)
    texts = ["the app crashes " * 12, "refund", "my card was charged twice"]
    encoded = clf.encode(texts)
    suffixes = [encoded.suffix(i) for i in range(3)]
    batch = collate(suffixes, np.arange(3), tiny_loaded.tokenizer.pad_token_id, cached=True)
    assert (batch.input_ids[1, : batch.input_ids.shape[1] - len(suffixes[1])] == tiny_loaded.tokenizer.pad_token_id).all()
    fast = clf.engine.score(batch, clf.prefix, clf.trie).numpy()
    ref = clf.reference(encoded, range(3))
    np.testing.assert_allclose(fast, ref, atol=1e-4)

    width = batch.input_ids.shape[1]
    right = torch.full_like(batch.input_ids, tiny_loaded.tokenizer.pad_token_id)
    for r, s in enumerate(suffixes):
        right[r, : len(s)] = torch.tensor(s)
    wrong = clf.engine.score(type(batch)(batch.rows, right, torch.full((3,), width), True), clf.prefix, clf.trie)
    assert np.abs(wrong.numpy()[1:] - ref[1:]).max() > 1e-2  # the check above can fail


def test_verification_catches_wrong_positions(tiny_loaded, monkeypatch):
    clf = Classifier(Task(labels=("billing", "technical", "account"), mode="first"), model=tiny_loaded)
    texts = random_texts(8, seed=5)
    encoded = clf.encode(texts)
    good = compare(clf, encoded, clf.score(encoded).scores, pick_probes(encoded, 8))
    assert good.ok and good.agree == good.n == 8

    original = type(clf.engine)._layout

    def shifted(self, *args):
        layout = original(self, *args)
        return dataclasses.replace(layout, positions=layout.positions + 3)

    monkeypatch.setattr(type(clf.engine), "_layout", shifted)
    bad = compare(clf, encoded, clf.score(encoded).scores, pick_probes(encoded, 8))
    assert not bad.ok and bad.max_abs_diff > 1e-3


def test_prefix_boundary_fallback(tiny_loaded):
    """Items whose first characters merge with the prompt's last shared token must not use the
    cached prefix; they run with their full prompt, are counted, and still match the reference."""
    task = Task(labels=("billing", "technical"), mode="first", user_template="Ticket: {text}")
    clf = Classifier(task, model=tiny_loaded)
    tok = tiny_loaded.tokenizer
    # Take the prefix up to and including "Ticket:" + " ": the space merges with a following word.
    full_head = tok(clf.renderer.before, add_special_tokens=False)["input_ids"]
    scorer = dataclasses.replace(clf.scorer, prefix_ids=full_head)
    texts = ["card charged", "  spaced start", "app crashes"]
    encoded = scorer.encode(texts)
    for i, text in enumerate(texts):
        full = tok(clf.renderer.render(text), add_special_tokens=False)["input_ids"]
        assert encoded.ids[i] == full  # always the per-item path's exact tokens
        assert encoded.cached[i] == (full[: len(full_head)] == full_head)
    assert encoded.fallbacks >= 1
    scored = assert_matches_reference(clf, texts, scorer=scorer, prefix=scorer.prefill(clf.engine))
    assert scored.stats.fallbacks == encoded.fallbacks


def test_default_prefix_never_falls_back(tiny_loaded):
    clf = Classifier(Task(labels=("billing", "technical"), user_template="Ticket: {text}"), model=tiny_loaded)
    encoded = clf.encode(["card", " lead space", "\nnewline first", "x" * 50, "Ünïcödé ✓"])
    assert encoded.fallbacks == 0


def test_prefix_computed_once_per_run(tiny_loaded, monkeypatch):
    calls = []
    clf = Classifier(Task(labels=("billing", "technical")), model=tiny_loaded,
                     settings=EngineSettings(token_budget=40, max_rows=2))
    original = clf.engine.prefill
    monkeypatch.setattr(clf.engine, "prefill", lambda ids: calls.append(ids) or original(ids))
    windows = list(clf.classify_windows(random_texts(9, seed=2)))
    clf.classify(random_texts(4, seed=3))
    assert calls == []  # computed in __init__, reused by every batch of every call
    assert sum(w.stats.batches for w in windows) >= 2


@pytest.mark.parametrize("mode", ["first", "full"])
@pytest.mark.parametrize("inline", [True, False])
def test_inline_and_merged_prefix_attention_equal_reference(tiny_loaded, monkeypatch, mode, inline):
    """Rows wide enough take the prefix's keys inline (one causal kernel call; with trie nodes, one
    masked call), narrower ones attend to it apart and merge by log-sum-exp: both must give the
    reference's scores, for item queries, node queries (full mode) and the last layer's reads."""
    from slmclassify.core.engine import layout

    monkeypatch.setattr(layout, "_INLINE_PREFIX_RATIO", 0.0 if inline else float("inf"))
    labels = ("billing", "technical", "account") if mode == "first" else ("billing", "technical", "account", "accounting")
    clf = Classifier(Task(labels=labels, mode=mode, user_template="Ticket: {text}\nCategory:"), model=tiny_loaded,
                     settings=EngineSettings(token_budget=300, max_rows=4))
    columns = []
    original = type(clf.engine)._layout
    monkeypatch.setattr(type(clf.engine), "_layout",
                        lambda self, *a: columns.append(original(self, *a).prefix_cols) or original(self, *a))
    assert_matches_reference(clf, random_texts(11, seed=21))
    assert columns and set(columns) == ({clf.prefix.length} if inline else {0})


@pytest.mark.skipif(TEST_DEVICE != "cpu", reason="query blocks are the CPU attention kernel's (attend_cpu)")
@pytest.mark.parametrize("mode", ["first", "full"])
@pytest.mark.parametrize("inline", [True, False])
def test_causal_attention_in_query_blocks_equals_reference(tiny_loaded, monkeypatch, inline, mode):
    """Row attention runs in blocks of queries (`attention.CAUSAL_BLOCK`; 4 here, so every row of 8
    or more columns takes them, the inline prefix's dummy queries included), causal without trie
    nodes, with the trie mask's rows (full mode): the scores must stay the reference's."""
    from slmclassify.core.engine import layout
    from slmclassify.backends import attention

    monkeypatch.setattr(layout, "_INLINE_PREFIX_RATIO", 0.0 if inline else float("inf"))
    monkeypatch.setattr(attention, "CAUSAL_BLOCK", 4)
    blocked = []
    original = attention._causal_blocks
    monkeypatch.setattr(attention, "_causal_blocks", lambda q, *a: blocked.append(q.shape[2]) or original(q, *a))
    labels = ("billing", "technical", "account") if mode == "first" else ("billing", "technical", "account", "accounting")
    clf = Classifier(Task(labels=labels, mode=mode, user_template="Ticket: {text}\nCategory:"),
                     model=tiny_loaded, settings=EngineSettings(token_budget=300, max_rows=4))
    assert (clf.trie.n_nodes > 0) == (mode == "full")
    assert_matches_reference(clf, random_texts(11, seed=22))
    assert blocked and min(blocked) >= 8


def test_loaded_model_is_frozen(tiny_loaded):
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny_loaded.engine = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny_loaded.auto_decision = {"precision": "int8"}
    assert tiny_loaded.engine is not None  # built in loading, shared by every Classifier of the model
    assert Classifier(Task(labels=("billing", "technical")), model=tiny_loaded).engine is tiny_loaded.engine


def test_scoring_leaves_the_classifier_unchanged(tiny_loaded):
    """Scoring returns what it did (`Scored`, `ScoredItems`): nothing is stored on the classifier,
    and a variant with other settings is a new object."""
    task = Task(labels=("billing", "technical", "account"), calibrate=True)
    clf = Classifier(task, model=tiny_loaded, settings=EngineSettings(token_budget=120, window=4))
    before = dict(vars(clf))
    texts = random_texts(7, seed=4) + ["", "refund"]
    first = clf.score(clf.encode(texts))
    windows = list(clf.classify_windows(texts))
    content_free_prior(clf)
    assert vars(clf).keys() == before.keys() and all(vars(clf)[k] is v for k, v in before.items())
    again = clf.score(clf.encode(texts))
    np.testing.assert_array_equal(first.scores, again.scores)  # the same bits
    assert dataclasses.replace(first.stats, seconds=0) == dataclasses.replace(again.stats, seconds=0)
    assert [w.start for w in windows] == [0, 4, 8] and sum(w.stats.items for w in windows) == 9
    with pytest.raises(AttributeError):
        clf.settings = EngineSettings()
    with pytest.raises(AttributeError):
        clf.trie = None
    wide = clf.variant(EngineSettings(token_budget=4096, window=64))
    assert wide.settings.window == 64 and clf.settings.window == 4 and wide.prefix is clf.prefix
    if TEST_DEVICE == "cpu":
        assert_same_scores(wide.score(clf.encode(texts)).scores, first.scores, clf.engine)
    else:  # cuBLAS picks its float32 GEMM kernel by shape: 1.1e-5 seen on an H200, within the reference's 1e-4
        np.testing.assert_allclose(wide.score(clf.encode(texts)).scores, first.scores, atol=1e-4)
    with pytest.raises(TaskError, match="not prefix_cache"):
        clf.variant(EngineSettings(prefix_cache=False))


@pytest.mark.parametrize("mode", ["first", "full"])
def test_output_layer_takes_several_batches(tiny_loaded, monkeypatch, mode):
    """`Scorer.score` stacks consecutive batches' read states for one output-layer call (as many
    as `Engine.output_rows` allows): the same scores as each batch scored alone, every item reported once
    to `progress`, and fewer output-layer calls than batches."""
    labels = ("billing", "technical", "account") if mode == "first" else ("billing", "technical", "account", "accounting")
    clf = Classifier(Task(labels=labels, mode=mode), model=tiny_loaded,
                     settings=EngineSettings(token_budget=100, max_rows=2))
    texts = random_texts(17, seed=11, max_words=20)
    encoded = clf.encode(texts)
    batches = list(clf.scorer.batches(encoded))
    assert len(batches) > 4
    alone = np.full((len(texts), len(labels)), np.nan)
    for batch in batches:
        alone[batch.rows] = clf.engine.score(batch, clf.prefix, clf.trie).double().numpy()

    calls, reported = [], []
    label_scores = type(clf.engine).label_scores
    monkeypatch.setattr(type(clf.engine), "label_scores",
                        lambda self, read, trie: calls.append(read.shape[0]) or label_scores(self, read, trie))
    monkeypatch.setattr(type(clf.engine), "output_rows", lambda self, trie: 5)
    scored = clf.scorer.score(encoded, clf.engine, clf.prefix, progress=reported.append)
    assert_same_scores(scored.scores, alone, clf.engine)
    assert sum(reported) == len(texts) and sum(calls) == len(texts)
    assert len(calls) < len(batches)
    # a call takes at most a call's rows (no second pass over the weights for a few leftover rows),
    # and one is made early only when the next batch (≤ 2 rows) would not fit
    assert all(n <= 5 for n in calls) and all(n > 5 - 2 for n in calls[:-1])
    assert_matches_reference(clf, texts)
