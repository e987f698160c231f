"""A conversation whose answer must be one of a few strings (a chat request with choices): its
prompt ids, the prefix worth caching, and the choices' label trie.

The prompt is the model's chat template over the client's messages with the generation prompt
(`prompts.render_chat`), as a server that generates would render it. Each choice is scored as a
whole: the sum of its tokens' log-probabilities after the prompt (`full` mode, with the end of turn
appended when one choice's tokens begin another's: `labels.resolve_mode`), so the answer is the exact
argmax over whole choices. Constrained greedy decoding (vLLM's `choice`) instead picks the best
*first* token among the choices and continues from there; the two differ when a choice whose first
token is less likely is, as a whole, more likely (e.g. one long choice against several that share
a likely first token).

The prefix is everything before the last user message's content (system turn, earlier turns, the
user turn's opening): what a client's requests share. Like a task's prefix it is cut one token early
(`encode.choose_prefix`) and used only when the prompt's ids really start with it; otherwise the
prompt runs whole, so the cache never changes an answer.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..errors import InputError, TaskError
from .encode import EncodedItems, choose_prefix
from .results import OK
from .labels import LabelTrie, build_trie, end_of_turn_id, label_sequences, resolve_mode
from .prefix_caches import PrefixCaches
from .prompts import ITEM_MARK, render_chat
from .scoring import Scored, Scorer
from .settings import EngineSettings


_end_of_turn = functools.lru_cache(maxsize=8)(end_of_turn_id)
"""The end-of-turn token of a tokenizer, found once (it renders a chat template) rather than per request."""


@dataclass(frozen=True)
class ChoicePrompt:
    """One conversation, tokenized, and the trie of its choices."""

    prompt_ids: tuple[int, ...]
    """The whole prompt, ending with the generation prompt: what the reference path runs."""
    prefix_ids: tuple[int, ...]
    """The part a cache may hold (empty when the prompt does not start with it)."""
    trie: LabelTrie
    """The choices' token sequences after the prompt; `trie.labels` are the choices as given."""

    @property
    def own_ids(self) -> tuple[int, ...]:
        """What runs after the cached prefix."""
        return self.prompt_ids[len(self.prefix_ids):]

    @property
    def key(self) -> tuple:
        """Requests with equal keys share a prefix cache and a trie, so they are batched together."""
        return self.prefix_ids, self.trie.labels, self.trie.sequences


def choice_prompt(tokenizer, messages: list[dict], choices: tuple[str, ...], context: int) -> ChoicePrompt:
    """The prompt of `messages` (each {"role", "content": str}; the last the user's) and the trie of
    `choices`. `context`: the longest prompt plus choice the engine is exact for (`config_check`).
    Raises InputError naming what cannot be scored."""
    if not choices:
        raise InputError("the choice list is empty: give at least two strings to choose from")
    repeated = sorted({c for c in choices if choices.count(c) > 1})
    if repeated:
        raise InputError(f"the choice {repeated[0]!r} is given twice; give each choice once")
    if not messages or messages[-1]["role"] != "user":
        raise InputError("the last message must be the user's: the choices are scored as the answer to it")
    prompt = render_chat(tokenizer, messages)
    marked = render_chat(tokenizer, messages[:-1] + [{**messages[-1], "content": ITEM_MARK}])
    before, after = marked.split(ITEM_MARK) if marked.count(ITEM_MARK) == 1 else ("", prompt)
    prompt_ids = tuple(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    prefix_ids = tuple(choose_prefix(tokenizer, before)) if before else ()
    if prompt_ids[:len(prefix_ids)] != prefix_ids or len(prefix_ids) >= len(prompt_ids):
        prefix_ids = ()
    sequences = label_sequences(tokenizer, after, choices)
    try:
        mode, sequences, _reason = resolve_mode(choices, sequences, "full", _end_of_turn(tokenizer))
    except TaskError as exc:  # two choices tokenize alike, or one to nothing
        raise InputError(f"the choices cannot be told apart by the model's tokens ({exc})") from None
    longest = max(len(s) for s in sequences)
    if len(prompt_ids) + longest > context:
        raise InputError(f"the conversation is {len(prompt_ids)} tokens and its longest choice {longest}: over the "
                         f"model's {context}; shorten the messages")
    return ChoicePrompt(prompt_ids=prompt_ids, prefix_ids=prefix_ids, trie=build_trie(choices, sequences, mode))


class ChoiceScorer:
    """Scores conversations of one key (prefix and choices) through the engine: a `Scorer` of their
    trie continuing their prefix's cache, the task path's batching and kernels."""

    def __init__(self, tokenizer, config, settings: EngineSettings, prompt: ChoicePrompt):
        self.scorer = Scorer.for_prompts(tokenizer, config, settings, prompt.trie, list(prompt.prefix_ids))
        self.prefix_ids = prompt.prefix_ids
        self.labels = prompt.trie.labels

    @property
    def settings(self) -> EngineSettings:
        return self.scorer.settings

    def encode(self, prompts: list[ChoicePrompt]) -> EncodedItems:
        """The prompts' ids as the engine runs them: after the prefix when they start with it, else whole."""
        cached = [bool(p.prefix_ids) for p in prompts]
        own = [np.array(p.own_ids if c else p.prompt_ids) for p, c in zip(prompts, cached)]
        return EncodedItems.join(own, [OK] * len(prompts), cached, list(self.prefix_ids))

    def score(self, items: EncodedItems, engine, caches: PrefixCaches) -> Scored:
        """[n, choices] whole-choice log-probabilities of `items` (of this key), in their order."""
        prefix = caches.get(self.prefix_ids) if self.prefix_ids else None
        return self.scorer.score(items, engine, prefix)
