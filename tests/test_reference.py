"""The reference path continues each label from the prompt's KV cache; it must equal one full
Hugging Face forward per label (what it did before, and what the per-item loop means)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from slmclassify import Classifier, Task
from slmclassify.core.reference import reference_scores

from helpers import random_texts


@torch.inference_mode()
def per_label_forwards(model, prompt_ids, trie) -> torch.Tensor:
    """One full forward per label over prompt + label tokens (the reference path before the cache)."""
    scores = []
    for seq in trie.sequences:
        logits = model(input_ids=torch.tensor([prompt_ids + list(seq[:-1])]), logits_to_keep=len(seq)).logits[0]
        steps = torch.log_softmax(logits.float(), dim=-1)[torch.arange(len(seq)), torch.tensor(seq)]
        scores.append(steps.mean() if trie.mode == "full-mean" else steps.sum())
    return torch.stack(scores)


@pytest.mark.parametrize("mode", ["first", "full", "full-mean"])
def test_cached_continuations_equal_per_label_forwards(tiny_loaded, mode):
    labels = ("billing", "technical", "account") if mode == "first" else (
        "billing", "technical", "account", "account_deletion", "shipping delay")
    clf = Classifier(Task(labels=labels, mode=mode, calibrate=False), model=tiny_loaded)
    if mode != "first":
        assert max(len(s) for s in clf.trie.sequences) >= 3  # multi-token labels are exercised
    encoded = clf.encode(random_texts(4, seed=23, max_words=40))
    for ids in encoded.ids:
        cached = reference_scores(tiny_loaded.model, ids, clf.trie).numpy()
        full = per_label_forwards(tiny_loaded.model, ids, clf.trie).numpy()
        np.testing.assert_allclose(cached, full, atol=1e-5, rtol=0)


def test_prompt_runs_once_per_probe(tiny_loaded, monkeypatch):
    """Cost: one prompt-length forward per probe, then one short forward per multi-token label."""
    clf = Classifier(Task(labels=("billing", "account", "account_deletion"), mode="full", calibrate=False),
                     model=tiny_loaded)
    ids = clf.encode(["my card was charged twice"]).ids[0]
    lengths = []
    original = type(tiny_loaded.model).forward

    def counting(self, input_ids=None, **kwargs):
        lengths.append(input_ids.shape[1])
        return original(self, input_ids=input_ids, **kwargs)

    monkeypatch.setattr(type(tiny_loaded.model), "forward", counting)
    reference_scores(tiny_loaded.model, ids, clf.trie)
    multi = [len(s) - 1 for s in clf.trie.sequences if len(s) > 1]
    assert lengths == [len(ids)] + multi


def test_the_oracle_runs_convolutions_in_true_float32_on_cuda():
    """On CUDA the reference path turns cuDNN's TF32 off while it runs (LFM2's convolution would move by
    ~1e-3 under TF32) and restores the user's setting after, also when the forward raises; on a CPU it
    touches nothing. Only the flag is read here, so this runs without a GPU."""
    from slmclassify.core.reference import true_float32

    before = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        with true_float32(torch.device("cpu")):
            assert torch.backends.cudnn.allow_tf32
        with pytest.raises(RuntimeError):
            with true_float32(torch.device("cuda")):
                assert not torch.backends.cudnn.allow_tf32
                raise RuntimeError("the forward failed")
        assert torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cudnn.allow_tf32 = before
