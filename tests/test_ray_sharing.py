"""The scores Ray actors share (`slmclassify.ray.sharing`), without Ray: the registry's leases, its
cap, and two classifiers scoring overlapping blocks through one registry."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ray")  # the package imports Ray

from slmclassify import Classifier  # noqa: E402
from slmclassify.ray.sharing import Pace, SharedScores, board_key, score_block  # noqa: E402

from helpers import RAY_TASK, ray_texts  # noqa: E402

K1, K2, K3 = (board_key(bytes([i])) for i in range(3))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_key_is_leased_to_one_actor_and_its_scores_go_to_the_others():
    board = SharedScores(clock=Clock())
    first = board.exchange("a", {}, [K1, K2, K3], [K1, K2], lease_s=10)
    assert (first.known, first.granted, first.elsewhere) == ({}, [K1, K2], [])
    second = board.exchange("b", {}, [K2, K3], [K2, K3], lease_s=10)
    assert (second.known, second.granted, second.elsewhere) == ({}, [K3], [K2])  # K2 is a's for now
    board.exchange("a", {K1: np.array([1.0]), K2: np.array([2.0])}, [], [], lease_s=0)
    third = board.exchange("b", {K2: np.array([2.5])}, [K1, K2], [K1, K2], lease_s=10)
    assert third.known == {K1: np.array([1.0]), K2: np.array([2.0])}  # the first result published stays
    assert third.granted == [] and third.elsewhere == []
    assert board.figures() == {"kept": 2, "published": 2, "forgotten": 0, "leased": 1}  # K3, still b's


def test_a_dead_actors_lease_runs_out_and_another_actor_runs_its_keys():
    clock = Clock()
    board = SharedScores(clock=clock)
    assert board.exchange("dead", {}, [K1], [K1], lease_s=5).granted == [K1]
    clock.now += 4.9
    assert board.exchange("b", {}, [K1], [K1], lease_s=5).elsewhere == [K1]
    clock.now += 0.2
    late = board.exchange("b", {}, [K1], [K1], lease_s=5)
    assert late.granted == [K1] and late.elsewhere == []


def test_past_its_cap_the_registry_forgets_the_oldest_scores():
    board = SharedScores(cap=3, clock=Clock())
    keys = [board_key(bytes([i])) for i in range(5)]
    board.exchange("a", {k: np.array([float(i)]) for i, k in enumerate(keys)}, [], [], lease_s=0)
    reply = board.exchange("b", {}, keys, keys, lease_s=1)
    assert list(reply.known) == keys[2:] and reply.granted == keys[:2]  # forgotten: run again
    assert board.figures()["forgotten"] == 2


def test_overlapping_blocks_of_two_classifiers_run_each_item_once(llama_dir, llama_loaded):
    """Block 2 shares items with block 1 (and with itself): its actor runs only the items the other
    did not publish, and every row gets the single-process result."""
    from slmclassify import load_model

    texts = ray_texts(90, seed=9)
    first, second = texts[:60], texts[30:90] + texts[40:50]
    board = SharedScores()
    classifiers = [Classifier(RAY_TASK, model=llama_loaded), Classifier(RAY_TASK, model=load_model(str(llama_dir)))]
    blocks = [score_block(clf, block, lambda p, w, t, s, o=owner: board.exchange(o, p, w, t, s), Pace())
              for clf, block, owner in zip(classifiers, (first, second), ("a", "b"))]
    one = Classifier(RAY_TASK, model=llama_loaded)
    distinct = {one.encode([t]).key(0) for t in texts if t}
    distinct_first = {one.encode([t]).key(0) for t in first if t}
    ran = [b.stats.scored - b.stats.reused for b in blocks]
    assert ran == [len(distinct_first), len(distinct - distinct_first)]
    assert board.figures()["kept"] == len(distinct)
    for block, block_texts in zip(blocks, (first, second)):
        expected = one.classify(block_texts)
        assert [r.label for r in block.results] == [r.label for r in expected]
        assert [r.status for r in block.results] == [r.status for r in expected]
        np.testing.assert_allclose(block.scores, np.array([[r.scores.get(lab, np.nan) for lab in RAY_TASK.labels]
                                                           for r in expected]), atol=1e-4, rtol=0)
