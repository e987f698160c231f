"""Tokenize items once: the ids each item runs, status (ok / empty / truncated) and the prefix check.

The fast path must feed the model exactly the tokens of the per-item path. So every item's
*full* prompt ids are known, and the shared prefix is used only when the item's ids really start
with the prefix ids; otherwise the item falls back to its full prompt (counted as a fallback).

Memory layout: an item keeps only what is its own — the ids after the shared prefix (or its
whole prompt for a fallback) — concatenated in one int32 array with offsets:

    tokens:  [ s0 s0 s0 | s1 s1 | f2 f2 f2 f2 f2 f2 | ... ]     s = suffix ids, f = full prompt (fallback)
    offsets: [ 0,        3,      5,                   11, ... ]  [n + 1]

The full prompt of a cached item is `prefix_ids + suffix`, rebuilt only when asked (`ids[i]`).

Speed: the start of every prompt (system turn, few-shot examples) is long and identical. When the
text before the item contains a special token (`<|im_start|>`), the tokenizer splits the text there before any
merge, so `ids(before + item + after) == ids(before_up_to_that_token) + ids(rest + item + after)`. The
split is used only if it reproduces the full tokenisation exactly on probe texts
(`PromptSplit.probe`); otherwise every prompt is tokenized whole.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import TaskError
from .prompts import PromptRenderer
from .results import EMPTY, OK, TRUNCATED  # an item's status: `results.py` owns them

_TOKENIZE_BATCH = 2048  # prompts per tokenizer call: bounds the tokenizer's transient Python lists
_SPLIT_PROBES = ("", "plain text", " leading space", "\n\nnew lines\n", "  two  spaces  ", "Ünïcödé ✓ 123",
                 "<|im_end|> looks special", "x" * 40)


class _FullIds(Sequence):
    """`encoded.ids[i]`: the full prompt ids of item i as a list, rebuilt from prefix + suffix."""

    def __init__(self, items: EncodedItems):
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i):
        items = self._items
        if items.status[i] == EMPTY:
            return []
        own = items.suffix(i)
        return list(items.prefix_ids) + own if items.cached[i] else own


@dataclass
class EncodedItems:
    """Token ids and status of every input item, in input order (compact: see the module docstring)."""

    tokens: np.ndarray
    """[total] int32: each item's own ids (suffix after the prefix, or the whole prompt), concatenated."""
    offsets: np.ndarray
    """[n + 1] int64: item i's ids are tokens[offsets[i]:offsets[i + 1]]."""
    status: list[str]
    """ok, empty or truncated, per item."""
    prefix_ids: list[int]
    """The shared prefix (possibly empty)."""
    cached: np.ndarray
    """[n] bool: the item's prompt starts with `prefix_ids`, so only its suffix is run."""

    def __len__(self) -> int:
        return len(self.status)

    @property
    def ids(self) -> _FullIds:
        """Full prompt ids per item ([] for empty items), as the per-item path sees them."""
        return _FullIds(self)

    def prompt_length(self, i: int) -> int:
        """Tokens in item i's full prompt (0 for empty items)."""
        if self.status[i] == EMPTY:
            return 0
        own = int(self.offsets[i + 1] - self.offsets[i])
        return own + len(self.prefix_ids) if self.cached[i] else own

    @property
    def scored(self) -> np.ndarray:
        """Indices of the items that are scored (not empty)."""
        return np.array([i for i, s in enumerate(self.status) if s != EMPTY], dtype=np.int64)

    @classmethod
    def join(cls, own: Sequence[np.ndarray], status: Sequence[str], cached: Sequence[bool],
             prefix_ids: Sequence[int]) -> EncodedItems:
        """Items from their own ids (`own(i)`), status and prefix flag, in the given order: the one
        place items are put together (a subset, a service batch across requests, saved probes)."""
        lengths = np.fromiter((len(p) for p in own), dtype=np.int64, count=len(own))
        return cls(
            tokens=np.concatenate(own).astype(np.int32) if len(own) else np.zeros(0, np.int32),
            offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            status=list(status), prefix_ids=list(prefix_ids), cached=np.array(cached, dtype=bool).reshape(-1),
        )

    @classmethod
    def gather(cls, picks: Sequence[tuple[EncodedItems, int]]) -> EncodedItems:
        """Item i of each (items, i) pick, in pick order; every pick's items share one prefix."""
        return cls.join([items.own(i) for items, i in picks], [items.status[i] for items, i in picks],
                        [bool(items.cached[i]) for items, i in picks],
                        picks[0][0].prefix_ids if picks else [])

    def subset(self, indices: Sequence[int]) -> EncodedItems:
        """The given items, in the given order (no re-tokenisation)."""
        return EncodedItems.join([self.own(i) for i in indices], [self.status[i] for i in indices],
                                 [bool(self.cached[i]) for i in indices], self.prefix_ids)

    def own(self, i: int) -> np.ndarray:
        """[k] int32 view of the ids the engine runs for item i."""
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    def suffix(self, i: int) -> list[int]:
        """The ids the engine runs for item i: after the prefix, or the whole prompt."""
        return self.own(i).tolist()

    def key(self, i: int) -> bytes:
        """Identity of item i's scoring input: equal keys give equal scores (duplicates)."""
        return (b"c" if self.cached[i] else b"f") + self.own(i).tobytes()

    def distinct(self) -> tuple[list[int], np.ndarray, list[bytes]]:
        """The scored items once each: (unique, source, keys). `unique` lists the first item of each
        distinct key in input order, `source[k]` is the position in `unique` of the k-th scored item
        (`scored[k]`), `keys[j]` the key of `unique[j]`."""
        scored = self.scored
        first: dict[bytes, int] = {}
        source = np.empty(len(scored), dtype=np.int64)
        unique: list[int] = []
        for k, i in enumerate(scored):
            j = first.setdefault(self.key(i), len(unique))
            if j == len(unique):
                unique.append(int(i))
            source[k] = j
        return unique, source, list(first)  # dicts keep insertion order

    @property
    def fallbacks(self) -> int:
        """Scored items whose prompt does not start with the prefix tokens."""
        return int(sum(1 for i in self.scored if not self.cached[i])) if self.prefix_ids else 0

    @property
    def nbytes(self) -> int:
        return int(self.tokens.nbytes + self.offsets.nbytes + self.cached.nbytes + 8 * len(self.status))


def valid_unicode(text: str) -> bool:
    """Whether `text` encodes as UTF-8: a Python or JSON string may hold a lone surrogate ("\\ud800"),
    which no tokenizer takes."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def invalid_text_at(value, path: str = "") -> str | None:
    """Where in a JSON value (strings, lists, objects) the first string that does not encode as UTF-8
    is (`valid_unicode`), as the field's path, e.g. "messages[0].content" or "prompt[2]"; None where every
    string encodes. One check for every request body the service and `batch` take, before anything
    reads it: a tokenizer given such a string raises deep inside (a 500, a whole batch file lost)."""
    if isinstance(value, str):
        return None if valid_unicode(value) else (path or "the body")
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and not valid_unicode(key):
                return f"a key of {path or 'the body'}"
            if (found := invalid_text_at(item, where)) is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if (found := invalid_text_at(item, f"{path}[{index}]")) is not None:
                return found
    return None


def choose_prefix(tokenizer, before: str) -> list[int]:
    """Prefix ids from the text every prompt shares before its item, cut one token early.

    Its last token may merge with an item's first characters (e.g. a trailing space and
    a word), so it is left to the suffix; `encode_items` still checks every item.
    """
    ids = tokenizer(before, add_special_tokens=False)["input_ids"]
    return ids[:-1]


class PromptSplit:
    """Tokenize `before + item + after` as `anchor_ids + ids(rest + item + after)` (see the module docstring)."""

    def __init__(self, tokenizer, renderer: PromptRenderer):
        self.tokenizer = tokenizer
        self.renderer = renderer
        self.cut = 0
        self.anchor_ids: list[int] = []
        if not renderer.linear:
            return
        cut = _last_special_end(tokenizer, renderer.before)
        if cut == 0:
            return
        self.cut = cut
        self.anchor_ids = _tokenize(tokenizer, [renderer.before[:cut]])[0]
        if not all(self.full_ids(p) == _tokenize(tokenizer, [renderer.render(p)])[0] for p in _SPLIT_PROBES):
            self.cut, self.anchor_ids = 0, []

    @property
    def active(self) -> bool:
        return self.cut > 0

    def rest_ids(self, texts: list[str]) -> list[list[int]]:
        """Ids after the anchor for each text (the whole prompt when the split is off)."""
        before_rest = self.renderer.before[self.cut :]
        if self.active:
            return _tokenize(self.tokenizer, [before_rest + t + self.renderer.after for t in texts])
        return _tokenize(self.tokenizer, [self.renderer.render(t) for t in texts])

    def full_ids(self, text: str) -> list[int]:
        return self.anchor_ids + self.rest_ids([text])[0]


def _last_special_end(tokenizer, text: str) -> int:
    """End offset in `text` of its last special (added) token, 0 if none."""
    specials = [t for t in getattr(tokenizer, "all_special_tokens", []) if t]
    specials += [str(t) for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(t, "special", False)]
    ends = [text.rfind(t) + len(t) for t in set(specials) if text.rfind(t) >= 0]
    return max(ends, default=0)


def _tokenize(tokenizer, prompts: list[str]) -> list[list[int]]:
    return tokenizer(prompts, add_special_tokens=False)["input_ids"] if prompts else []


def encode_items(
    tokenizer,
    renderer: PromptRenderer,
    texts: list[str],
    prefix_ids: list[int],
    max_prompt_tokens: int,
    max_text_tokens: int | None = None,
    score_empty: bool = False,
    split: PromptSplit | None = None,
) -> EncodedItems:
    """Render and tokenize every item; truncate over-long texts so the template stays whole.

    Empty texts get status `empty` and are not scored, unless `score_empty` (content-free
    calibration inputs include "").
    """
    split = split or PromptSplit(tokenizer, renderer)
    # A text far longer than any prompt can hold is cut to a character bound first, so that memory
    # does not grow with a cell's length (the tokenizer took ~220 bytes per character of a 20 MB
    # cell): past the bound it has more tokens than the cap, so it is truncated anyway, and the
    # exact token cut below works on the bounded text.
    bound = char_bound(tokenizer, max_prompt_tokens if max_text_tokens is None else min(max_text_tokens,
                                                                                        max_prompt_tokens))
    texts = [t[:bound] if len(t) > bound else t for t in texts]
    status = [EMPTY if not text.strip() and not score_empty else OK for text in texts]
    live = [i for i, s in enumerate(status) if s == OK]
    overhead = len(_tokenize(tokenizer, [renderer.before + renderer.after])[0])
    prefix = np.asarray(prefix_ids, dtype=np.int64)
    anchor = np.asarray(split.anchor_ids, dtype=np.int64)
    n_prefix, n_anchor = len(prefix), len(anchor)
    # Items all share the anchor; how much of the prefix it covers is the same for every item.
    anchor_matches = n_anchor == 0 or bool(np.array_equal(anchor[: min(n_anchor, n_prefix)], prefix[:n_anchor]))
    own_parts: list[np.ndarray] = [np.zeros(0, np.int32)] * len(texts)
    cached = np.zeros(len(texts), dtype=bool)
    for start in range(0, len(live), _TOKENIZE_BATCH):
        batch = live[start : start + _TOKENIZE_BATCH]
        for i, rest in zip(batch, split.rest_ids([texts[i] for i in batch])):
            length = n_anchor + len(rest)
            if length > max_prompt_tokens or (max_text_tokens is not None and length - overhead > max_text_tokens - 2):
                # The overhead estimate can be off by a merge or two at the boundaries; checked exactly here.
                full, truncated = _truncate(tokenizer, renderer, texts[i], max_prompt_tokens, max_text_tokens)
                if truncated:
                    status[i] = TRUNCATED
                full = np.asarray(full, dtype=np.int64)
                is_cached = n_prefix > 0 and len(full) >= n_prefix and bool(np.array_equal(full[:n_prefix], prefix))
                own = full[n_prefix:] if is_cached else full
            else:
                rest = np.asarray(rest, dtype=np.int64)
                need = n_prefix - n_anchor  # prefix tokens that lie in the rest (≥ 0 when the anchor is shorter)
                is_cached = (n_prefix > 0 and anchor_matches and length >= n_prefix
                             and (need <= 0 or bool(np.array_equal(rest[:need], prefix[n_anchor:]))))
                if is_cached:
                    own = rest[need:] if need >= 0 else np.concatenate([anchor[n_prefix:], rest])
                else:
                    own = np.concatenate([anchor, rest]) if n_anchor else rest
            cached[i] = is_cached
            own_parts[i] = own.astype(np.int32)
    return EncodedItems.join(own_parts, status, cached, prefix_ids)


def char_bound(tokenizer, max_tokens: int) -> int:
    """Characters past which a text surely has more than `max_tokens` tokens (plus a margin of 8 for
    the merges at the cut): every token covers at most the longest vocabulary entry's characters (a
    byte-level entry has one character per byte, so its decoded text is no longer)."""
    return (max_tokens + 8) * _longest_token(tokenizer)


_LONGEST: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _longest_token(tokenizer) -> int:
    """The longest vocabulary entry, in characters (read once per tokenizer)."""
    longest = _LONGEST.get(tokenizer)
    if longest is None:
        longest = max((len(t) for t in tokenizer.get_vocab()), default=1) or 1
        _LONGEST[tokenizer] = longest
    return longest


def _truncate(tokenizer, renderer, text, max_prompt_tokens, max_text_tokens):
    """Cut the item text (not the template) until the prompt fits. Returns (ids, truncated?)."""
    text_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    keep = len(text_ids) if max_text_tokens is None else min(len(text_ids), max_text_tokens)
    while True:
        cut = tokenizer.decode(text_ids[:keep]) if keep < len(text_ids) else text
        ids = tokenizer(renderer.render(cut), add_special_tokens=False)["input_ids"]
        if len(ids) <= max_prompt_tokens or keep == 0:
            if len(ids) > max_prompt_tokens:
                raise TaskError(
                    f"the prompt without the item text is {len(ids)} tokens, over the {max_prompt_tokens} the "
                    "model's context leaves for it: shorten the instruction, label descriptions or examples, "
                    "or use a model with a longer context")
            return ids, keep < len(text_ids)
        keep = max(0, keep - max(1, len(ids) - max_prompt_tokens))
