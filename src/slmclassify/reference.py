"""The reference path: one item, its full prompt, no padding, no cache, the Hugging Face forward.

It is slow on purpose and shares no code with `engine.py` beyond the label trie's definition of
which tokens to read, so it is the oracle for the fast path (tests and `slmclassify verify`).
"""

from __future__ import annotations

import torch

from .labels import LabelTrie


@torch.inference_mode()
def reference_scores(model: torch.nn.Module, prompt_ids: list[int], trie: LabelTrie) -> torch.Tensor:
    """[L] label scores for one prompt: one forward per label (one in all for single tokens)."""
    sequences = trie.sequences
    if all(len(seq) == 1 for seq in sequences):
        logits = model(input_ids=torch.tensor([prompt_ids], device=model.device), logits_to_keep=1).logits[0, -1]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        return torch.stack([logprobs[seq[0]] for seq in sequences])
    scores = []
    for seq in sequences:
        ids = torch.tensor([prompt_ids + list(seq[:-1])], device=model.device)
        logits = model(input_ids=ids, logits_to_keep=len(seq)).logits[0]  # [len(seq), V]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        steps = logprobs[torch.arange(len(seq), device=model.device), torch.tensor(seq, device=model.device)]
        scores.append(steps.mean() if trie.mode == "full-mean" else steps.sum())
    return torch.stack(scores)
