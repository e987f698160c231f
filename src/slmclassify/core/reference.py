"""The reference path: one item, its full prompt, no padding, no batching, the Hugging Face forward.

It is slow on purpose and shares no code with `engine/` beyond the label trie's definition of
which tokens to read, so it is the oracle for the fast path (tests and `slmclassify verify`).
The prompt runs once; each multi-token label continues from a copy of the prompt's KV cache
(`past_key_values`, the unmodified Hugging Face cache), so a probe costs one prompt forward plus
a few label tokens per label instead of one full forward per label.
"""

from __future__ import annotations

import contextlib
import copy

import torch

from .labels import LabelTrie


@contextlib.contextmanager
def true_float32(device: torch.device):
    """On CUDA, cuDNN's convolutions in IEEE float32 while the oracle runs: their default is TF32 (a
    10-bit mantissa), which moves LFM2's short convolution by ~1e-3. Matrix products are float32
    already (PyTorch's default, `torch.backends.cuda.matmul.allow_tf32` False)."""
    if device.type != "cuda":
        yield
        return
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = before


@torch.inference_mode()
def reference_scores(model: torch.nn.Module, prompt_ids: list[int], trie: LabelTrie) -> torch.Tensor:
    """[L] label scores for one prompt: one prompt forward, then each label's continuation."""
    with true_float32(model.device):
        return _scores(model, prompt_ids, trie)


def _scores(model: torch.nn.Module, prompt_ids: list[int], trie: LabelTrie) -> torch.Tensor:
    sequences = trie.sequences
    continued = any(len(seq) > 1 for seq in sequences)
    out = model(input_ids=torch.tensor([prompt_ids], device=model.device), logits_to_keep=1, use_cache=continued)
    first = torch.log_softmax(out.logits[0, -1].float(), dim=-1)  # [V] next-token log-probs after the prompt
    if not continued:
        return torch.stack([first[seq[0]] for seq in sequences])
    scores = []
    for seq in sequences:
        steps = first[seq[0]][None]
        if len(seq) > 1:
            past = copy.deepcopy(out.past_key_values)  # the prompt's keys/values, untouched for the next label
            logits = model(input_ids=torch.tensor([list(seq[:-1])], device=model.device), past_key_values=past, use_cache=True).logits[0]
            logprobs = torch.log_softmax(logits.float(), dim=-1)  # [len(seq)-1, V]
            steps = torch.cat([steps, logprobs[torch.arange(len(seq) - 1, device=model.device), torch.tensor(seq[1:], device=model.device)]])
        scores.append(steps.mean() if trie.mode == "full-mean" else steps.sum())
    return torch.stack(scores)
