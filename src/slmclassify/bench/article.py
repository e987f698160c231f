"""The article's code paths for `slmclassify bench`, as the article wrote them: (a) one forward per
item, (b)/(c) fixed batches, each scoring the first token of every label."""

from __future__ import annotations

import numpy as np
import torch

from ..models.loading import LoadedModel


def first_ids(tokenizer, labels) -> torch.Tensor:
    """[L] the first token id of each label, as the article reads label scores."""
    return torch.tensor([tokenizer.encode(label, add_special_tokens=False)[0] for label in labels])


@torch.inference_mode()
def article_loop(loaded: LoadedModel, prompts: list[str], labels) -> np.ndarray:
    """(a): one forward per item, full prompt, last position only, first-token scores."""
    tok, model = loaded.tokenizer, loaded.model
    first = first_ids(tok, labels)
    out = np.zeros((len(prompts), len(labels)))
    for i, prompt in enumerate(prompts):
        inputs = tok(prompt, add_special_tokens=False, return_tensors="pt").to(model.device)
        logits = model(**inputs, logits_to_keep=1).logits[0, -1, :].float()
        out[i] = torch.log_softmax(logits, dim=-1)[first.to(model.device)].cpu().numpy()
    return out


@torch.inference_mode()
def article_batched(loaded: LoadedModel, prompts: list[str], labels, order, batch_size=32):
    """(b)/(c): fixed batches in the given order; returns (scores, processed, real tokens)."""
    tok, model = loaded.tokenizer, loaded.model
    first = first_ids(tok, labels)
    out = np.zeros((len(prompts), len(labels)))
    processed = real = 0
    for i in range(0, len(order), batch_size):
        idx = order[i : i + batch_size]
        side = tok.padding_side  # the tokenizer is shared with every classifier of this model: restore it
        tok.padding_side = "left"
        try:
            batch = tok([prompts[j] for j in idx], add_special_tokens=False, padding=True, return_tensors="pt")
        finally:
            tok.padding_side = side
        processed += batch["input_ids"].numel()
        real += int(batch["attention_mask"].sum())
        logits = model(**batch.to(model.device), logits_to_keep=1).logits[:, -1, :].float()
        out[idx] = torch.log_softmax(logits, dim=-1)[:, first.to(model.device)].cpu().numpy()
    return out, processed, real
