"""The best plain-transformers configuration a user would write on a GPU, for `bench`'s (h) rows:
prompts sorted by length (longest first), left-padded into token-budget batches, one forward with
`logits_to_keep=1` each, first-token label scores; optionally continuing a prefix KV cache computed
once and copied per batch (the article's plain-transformers recipe; its GPU figures are in
docs/performance.md).
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from .article import first_ids


@torch.inference_mode()
def token_budget_scores(loaded, prompts: list[str], labels, prefix_ids: list[int], budget: int = 32768,
                        max_rows: int = 512) -> tuple[np.ndarray, float]:
    """([n, L] first-token label log-probs, share of padding) for `prompts` (full prompt strings)."""
    tok, model = loaded.tokenizer, loaded.model
    dev = model.device
    first = first_ids(tok, labels).to(dev)
    ids = [tok(p, add_special_tokens=False).input_ids for p in prompts]
    P = len(prefix_ids)
    if P and any(x[:P] != list(prefix_ids) or len(x) <= P for x in ids):
        P = 0  # not every prompt continues the prefix: run without the cache
    cache = model(input_ids=torch.tensor([ids[0][:P]], device=dev), use_cache=True).past_key_values if P else None
    pad_id = tok.pad_token_id or 0
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    out = np.zeros((len(ids), len(labels)))
    processed = real = 0
    start = 0
    while start < len(order):
        rows, S = [], 0
        while start < len(order):
            L = len(ids[order[start]]) - P
            if rows and (max(S, L) * (len(rows) + 1) > budget or len(rows) >= max_rows):
                break
            rows.append(order[start])
            S = max(S, L)
            start += 1
        B = len(rows)
        x = torch.full((B, S), pad_id, dtype=torch.long)
        mask = torch.zeros((B, P + S), dtype=torch.long)
        pos = torch.zeros((B, S), dtype=torch.long)
        mask[:, :P] = 1
        for r, i in enumerate(rows):
            suffix = ids[i][P:]
            x[r, S - len(suffix):] = torch.tensor(suffix)
            mask[r, P + S - len(suffix):] = 1
            pos[r, S - len(suffix):] = torch.arange(P, P + len(suffix))
            real += len(suffix)
        processed += B * S
        extra = {}
        if cache is not None:
            batch_cache = copy.deepcopy(cache)
            batch_cache.batch_repeat_interleave(B)
            extra["past_key_values"] = batch_cache
        logits = model(input_ids=x.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                       logits_to_keep=1, **extra).logits[:, -1].float()
        out[rows] = torch.log_softmax(logits, dim=-1)[:, first].cpu().numpy()
    return out, 1 - real / processed
