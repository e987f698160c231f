"""OpenAI's (legacy) completions with the prompt's log-probabilities: `echo: true, logprobs: N`,
`max_tokens: 0`, or `max_tokens: 1` as lm-evaluation-harness sends it — what lm-eval's
`local-completions` model and CAPPr read to score a fixed continuation.

The prompts of one request that begin with the same token are one engine row: that token is the
row's item and each prompt's other tokens a branch of the label trie, so what the prompts share (a
multiple-choice question's context, lm-eval's few-shot turns) is computed once, and each
continuation once beyond it. The engine reads the log-softmax at every position of the row
(`Engine.position_logprobs`): the item's token gives the distribution of each prompt's second token,
each trie node the distribution after it. With `max_tokens: 1` each branch feeds its last token too
(a placeholder token follows it, never read), whose distribution gives the completion: the most
likely next token (nothing is sampled; lm-eval sends temperature 0).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import numpy as np

from ..core.batching import collate
from ..core.labels import LabelTrie, build_trie
from ..errors import InputError

MAX_LOGPROBS = 20
_PLACEHOLDER = 0
"""The token after each branch's last one when the next token is asked for: fed, never read."""


@dataclass(frozen=True)
class CompletionAsk:
    """What a completions request asks: its prompts' token ids and how to answer."""

    prompts: tuple[tuple[int, ...], ...]
    echo: bool
    logprobs: int | None
    """How many of the likeliest tokens to list at each position (None: no log-probabilities)."""
    max_tokens: int
    """0 (the prompt only) or 1 (one more token, the likeliest)."""


@dataclass(frozen=True)
class CompletionRow:
    """Prompts of one request that share their first token, as one engine row."""

    first: int
    members: tuple[int, ...]
    """Indices of the request's prompts in this row."""
    trie: LabelTrie | None
    """Each member's other tokens (and the placeholder, for a next token) as a branch; None when no
    member has a position to read."""
    branch: tuple[int, ...]
    """Per member, its branch in the trie (-1: nothing to read)."""


def completion_ask(body: dict, tokenizer, context: int) -> CompletionAsk:
    """Read a completions request (prompt as a string, strings, token ids or lists of them).
    Raises InputError naming what cannot be answered."""
    if body.get("stream"):
        raise InputError("stream is not supported: send stream: false")
    if body.get("n") not in (None, 1) or body.get("best_of") not in (None, 1):
        raise InputError("n and best_of must be 1: the answer is the prompt's log-probabilities and at most one "
                         "greedy token")
    if body.get("max_tokens") is None:  # the API's default is 16 tokens of free text: answering 1 would cut it
        raise InputError("max_tokens is not given, and the API's default (up to 16 generated tokens) is free text, "
                         "which is not supported: send max_tokens: 0 with echo: true for the prompt's "
                         "log-probabilities, or max_tokens: 1 for the likeliest next token")
    max_tokens = body["max_tokens"]
    if max_tokens not in (0, 1) or isinstance(max_tokens, bool):
        raise InputError(f"max_tokens={max_tokens!r}: only 0 (the prompt's log-probabilities, with echo) and 1 (one "
                         "more token) are supported; free-text generation is not")
    logprobs = body.get("logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                 or not 0 <= logprobs <= MAX_LOGPROBS):
        raise InputError(f"logprobs must be an integer from 0 to {MAX_LOGPROBS}, got {logprobs!r}")
    echo = bool(body.get("echo"))
    if not echo and max_tokens == 0:
        raise InputError("max_tokens 0 without echo asks for nothing: set echo: true for the prompt's "
                         "log-probabilities")
    prompts = [_prompt_ids(p, tokenizer, k) for k, p in enumerate(_prompts(body.get("prompt")))]
    vocab = len(tokenizer)
    for k, ids in enumerate(prompts):
        if not ids:
            raise InputError(f"prompt[{k}] is empty")
        if any(not 0 <= t < vocab for t in ids):
            raise InputError(f"prompt[{k}] holds a token id outside the vocabulary (0..{vocab - 1})")
        if len(ids) + max_tokens > context:
            raise InputError(f"prompt[{k}] is {len(ids)} tokens: over the model's {context}")
    return CompletionAsk(prompts=tuple(tuple(p) for p in prompts), echo=echo, logprobs=logprobs,
                         max_tokens=max_tokens)


def _prompts(prompt) -> list:
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [prompt]  # one prompt of token ids
    if isinstance(prompt, list) and prompt:
        return prompt
    raise InputError("prompt must be a string, a list of strings, a list of token ids or a list of such lists")


def _prompt_ids(prompt, tokenizer, k: int) -> list[int]:
    if isinstance(prompt, str):
        return tokenizer(prompt)["input_ids"]  # special tokens as the model's server would add them (BOS)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    raise InputError(f"prompt[{k}] must be a string or a list of token ids")


def completion_rows(ask: CompletionAsk) -> list[CompletionRow]:
    """The request's prompts grouped by first token, each group's other tokens as trie branches."""
    groups: dict[int, list[int]] = {}
    for k, ids in enumerate(ask.prompts):
        groups.setdefault(ids[0], []).append(k)
    rows = []
    for first, members in groups.items():
        sequences: dict[tuple[int, ...], int] = {}
        branch = []
        for k in members:
            seq = ask.prompts[k][1:] + ((_PLACEHOLDER,) if ask.max_tokens else ())
            if not seq:
                branch.append(-1)
                continue
            branch.append(sequences.setdefault(seq, len(sequences)))  # a repeated prompt is one branch
        trie = build_trie(tuple(str(b) for b in range(len(sequences))), list(sequences), "full") if sequences else None
        rows.append(CompletionRow(first=first, members=tuple(members), trie=trie, branch=tuple(branch)))
    return rows


def row_logprobs(engine, pad_id: int, row: CompletionRow, ask: CompletionAsk) -> dict[int, tuple]:
    """{member: (token_lp, top_ids, top_lp)} for one row through the engine: `token_lp` the
    log-probability of each of the member's tokens after its first (with max_tokens 1, then the
    likeliest next token's), `top_ids` / `top_lp` the likeliest tokens at each of those positions."""
    k = max(ask.logprobs or 0, 1 if ask.max_tokens else 0)
    none = (np.zeros(0), np.zeros((0, k), np.int64), np.zeros((0, k)))
    if row.trie is None:
        return {m: none for m in row.members}
    batch = collate([[row.first]], np.array([0]), pad_id, cached=False)
    read, _ = engine.read_states(batch, None, row.trie)
    steps, top_lp, top_ids = engine.read_logprobs(read, row.trie, k)  # [1, N], [1, 1+T, k] twice
    out = {}
    for member, branch in zip(row.members, row.branch):
        if branch < 0:
            out[member] = none
            continue
        chosen = (row.trie.step_label == branch).numpy()
        positions = row.trie.step_pos.numpy()[chosen]
        token_lp = steps[0, chosen].astype(np.float64)
        if ask.max_tokens:  # the placeholder's step: the likeliest next token instead
            token_lp[-1] = top_lp[0, positions[-1], 0]
        out[member] = (token_lp, top_ids[0, positions], top_lp[0, positions].astype(np.float64))
    return out


def completion_choice(index: int, ask: CompletionAsk, ids: tuple[int, ...], token_lp: np.ndarray,
                      top_ids: np.ndarray | None, top_lp: np.ndarray | None, tokenizer) -> dict:
    """One prompt's choice: `token_lp` [len(ids) - 1 + max_tokens] the log-probability of each token
    after the first (the last, with max_tokens 1, the likeliest next token's), `top_ids`/`top_lp`
    [same, k] the likeliest tokens there (k = logprobs)."""
    generated = [int(top_ids[-1, 0])] if ask.max_tokens else []
    shown = (list(ids) if ask.echo else []) + generated
    pieces = [tokenizer.decode([t]) for t in shown]
    text = "".join(pieces)
    logprobs = None
    if ask.logprobs is not None:
        skip = 0 if ask.echo else len(ids)  # positions of the prompt not shown
        lps = ([None] if ask.echo else []) + [float(x) for x in token_lp[max(0, skip - 1):]]
        tops = [None] if ask.echo else []
        for p in range(max(0, skip - 1), len(token_lp)):
            top: dict[str, float] = {}
            for t, v in zip(top_ids[p, : ask.logprobs], top_lp[p, : ask.logprobs]):  # likeliest first
                top.setdefault(tokenizer.decode([int(t)]), float(v))  # two ids of one text: the likelier
            tops.append(top)
        offsets = np.cumsum([0] + [len(p) for p in pieces[:-1]]).tolist() if pieces else []
        logprobs = {"tokens": pieces, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": "length"}


def completion_response(body: dict, ask: CompletionAsk, choices: list[dict]) -> dict:
    prompt_tokens = sum(len(p) for p in ask.prompts)
    completion_tokens = ask.max_tokens * len(ask.prompts)
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": body.get("model"), "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}
