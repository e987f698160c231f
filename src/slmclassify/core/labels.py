"""Label token sequences, the scoring mode, and the label trie scored in one forward pass.

Every label is the token sequence the model would emit right after the generation prompt.
Scoring reads log-probabilities only at a few positions of each row:

    position 0        = the item's last token   → distribution of each label's 1st token
    position 1 + t    = trie node t (fed as input) → distribution of the next token below t

A label's score is the sum of its steps' log-probabilities (`full`), their mean (`full-mean`),
or only the first step (`first`). Only internal trie nodes are fed, so labels that are single
distinct tokens need no extra input and `full` equals `first` exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import TaskError


@dataclass(frozen=True)
class LabelTrie:
    """The token trie of the scored label sequences, flattened into index tensors."""

    labels: tuple[str, ...]
    """Label names, in task order."""
    sequences: tuple[tuple[int, ...], ...]
    """Per label, the token ids that are scored (truncated to 1 in `first` mode)."""
    mode: str
    """The resolved mode: first, full or full-mean."""
    node_tokens: torch.Tensor
    """[T] token of each fed trie node (internal nodes only), parents before children."""
    node_depth: torch.Tensor
    """[T] depth of each node: 1 for a label's first token."""
    ancestors: torch.Tensor
    """[T, T] bool: ancestors[t, u] is True when u is t or one of its ancestors."""
    step_pos: torch.Tensor
    """[N] scoring position of each step: 0 = item's last token, 1 + t = node t."""
    step_token: torch.Tensor
    """[N] the token whose log-probability each step reads."""
    step_label: torch.Tensor
    """[N] which label each step belongs to."""
    label_len: torch.Tensor
    """[L] number of scored tokens per label."""

    @property
    def n_nodes(self) -> int:
        return int(self.node_tokens.numel())

    def score(self, step_logprobs: torch.Tensor) -> torch.Tensor:
        """[B, N] log-probabilities of the steps → [B, L] label scores for the mode."""
        total = torch.zeros(step_logprobs.shape[0], len(self.labels), dtype=step_logprobs.dtype)
        total.index_add_(1, self.step_label, step_logprobs)
        if self.mode == "full-mean":
            total = total / self.label_len.to(total.dtype)
        return total


def build_trie(labels: tuple[str, ...], sequences: list[tuple[int, ...]], mode: str) -> LabelTrie:
    """Flatten the label sequences into a trie; `first` keeps only each label's first token."""
    if mode == "first":
        sequences = [seq[:1] for seq in sequences]
    nodes: dict[tuple[int, ...], int] = {}  # token prefix → node index
    tokens, depth, parent = [], [], []
    for seq in sequences:
        for k in range(1, len(seq)):  # proper prefixes are fed; the full sequence is only read
            key = seq[:k]
            if key not in nodes:
                nodes[key] = len(tokens)
                tokens.append(key[-1])
                depth.append(k)
                parent.append(nodes[key[:-1]] if k > 1 else -1)
    n = len(tokens)
    ancestors = torch.zeros(n, n, dtype=torch.bool)
    for t in range(n):
        u = t
        while u != -1:
            ancestors[t, u] = True
            u = parent[u]
    step_pos, step_token, step_label = [], [], []
    for label_idx, seq in enumerate(sequences):
        for k, token in enumerate(seq):
            step_pos.append(0 if k == 0 else 1 + nodes[seq[:k]])
            step_token.append(token)
            step_label.append(label_idx)
    return LabelTrie(
        labels=labels,
        sequences=tuple(tuple(s) for s in sequences),
        mode=mode,
        node_tokens=torch.tensor(tokens, dtype=torch.long),
        node_depth=torch.tensor(depth, dtype=torch.long),
        ancestors=ancestors,
        step_pos=torch.tensor(step_pos, dtype=torch.long),
        step_token=torch.tensor(step_token, dtype=torch.long),
        step_label=torch.tensor(step_label, dtype=torch.long),
        label_len=torch.tensor([len(s) for s in sequences], dtype=torch.long),
    )


def label_sequences(tokenizer, prompt_tail: str, labels: tuple[str, ...]) -> list[tuple[int, ...]]:
    """Token ids of each label exactly as it would follow the rendered prompt."""
    separator = "" if not prompt_tail or prompt_tail[-1].isspace() else " "
    base = tokenizer(prompt_tail, add_special_tokens=False)["input_ids"]
    sequences = []
    for label in labels:
        ids = tokenizer(prompt_tail + separator + label, add_special_tokens=False)["input_ids"]
        if ids[: len(base)] == base and len(ids) > len(base):
            seq = ids[len(base) :]
        else:  # the label merged with the prompt's last token: score it as a standalone string
            seq = tokenizer(separator + label, add_special_tokens=False)["input_ids"]
        sequences.append(tuple(seq))
    return sequences


def end_of_turn_id(tokenizer) -> int:
    """The token a chat template puts right after an assistant answer (e.g. `<|im_end|>`)."""
    marker = "\u2063LABEL\u2063"
    if getattr(tokenizer, "chat_template", None):
        chat = [{"role": "user", "content": "x"}, {"role": "assistant", "content": marker}]
        text = tokenizer.apply_chat_template(chat, tokenize=False)
        after = text.split(marker, 1)[1] if marker in text else ""
        ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after.strip() else []
        if ids:
            return ids[0]
    return tokenizer.eos_token_id


def resolve_mode(labels: tuple[str, ...], sequences: list[tuple[int, ...]], requested: str, eot_id: int):
    """Check the label tokenisation and pick the scoring mode.

    Returns (mode, sequences, reason). `auto` scores first tokens when every label is a single,
    distinct token, else full sequences. In full modes, when one label's tokens are a prefix of
    another's, every label gets the end-of-turn token appended so the shorter one cannot win by
    being a prefix.
    """
    by_seq: dict[tuple[int, ...], str] = {}
    for label, seq in zip(labels, sequences):
        if not seq:
            raise TaskError(f"label {label!r} tokenises to nothing")
        if seq in by_seq:
            raise TaskError(f"labels {by_seq[seq]!r} and {label!r} tokenise identically {list(seq)}; rename one")
        by_seq[seq] = label
    firsts = [seq[0] for seq in sequences]
    distinct_first = len(set(firsts)) == len(firsts)
    single = all(len(seq) == 1 for seq in sequences)
    if requested == "first":
        if not distinct_first:
            clash = _first_token_clash(labels, firsts)
            raise TaskError("{mode} first: labels {clash} share their first token; use {mode} full",
                            names={"mode": "mode"}, clash=clash)
        return "first", sequences, "first token requested"
    if requested == "auto":
        if distinct_first and single:
            return "first", sequences, "every label is one distinct token"
        requested = "full"
        reason = (
            "labels share first tokens: " + ", ".join(_first_token_clash(labels, firsts))
            if not distinct_first
            else "some labels are several tokens"
        )
    else:
        reason = f"{requested} requested"
    prefix_clash = any(
        a != b and len(a) < len(b) and b[: len(a)] == a for a in sequences for b in sequences
    )
    if prefix_clash:
        sequences = [seq + (eot_id,) for seq in sequences]
        reason += "; end-of-turn appended (a label is a token prefix of another)"
    return requested, sequences, reason


def _first_token_clash(labels, firsts) -> list[str]:
    return [label for label, first in zip(labels, firsts) if firsts.count(first) > 1]


def describe_labels(tokenizer, labels: tuple[str, ...], sequences: list[tuple[int, ...]], warn: bool = True) -> list[str]:
    """One line per label showing its tokens, plus (`warn`) warnings about first tokens that mislead
    (not for a multi-label task's branches, which are scored in full and compared in pairs)."""
    lines, warnings = [], []
    firsts = [seq[0] for seq in sequences]
    for label, seq in zip(labels, sequences):
        pieces = [tokenizer.decode([t]) for t in seq]
        lines.append(f"  {label!r} -> {' | '.join(repr(p) for p in pieces)} ({len(seq)} token{'s' * (len(seq) > 1)})")
        first = pieces[0].strip()
        if len(seq) > 1 and len(first) < len(label.strip()) and len(first) <= 3:
            warnings.append(f"  warning: {label!r} starts with the fragment {first!r}, which also begins many other "
                            "words; first-token scoring compares that fragment's prior, not the label")
    clash = _first_token_clash(labels, firsts)
    if clash:
        warnings.append(f"  warning: labels {clash} share their first token; only full-sequence modes can tell them apart")
    return lines + (warnings if warn else [])
