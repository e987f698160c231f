"""OpenAI's chat completions with choices, and completions with the prompt's log-probabilities, in
the service: the requests as FastAPI validates and documents them, and the scheduler's runners.

What a request asks and its answer are `wire/chat_request.py`'s; its prompt, head and trie
`core/conversation.py`'s. Requests of one head and choices share one runner, so the scheduler
batches them together like one task's texts, and one cached prefix, held in a bounded LRU
(`core/prefix_caches.py`, `--prefix-cache-mb`) that only the engine's worker thread touches.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..core.conversation import ChoicePrompt, ChoiceScorer
from ..core.encode import EncodedItems, invalid_text_at
from ..core.prefix_caches import PrefixCaches
from ..core.settings import EngineSettings
from ..wire.completions import CompletionAsk, completion_rows, row_logprobs
from .adapter import BatchWork, EncodedRequest

RUNNERS_KEPT = 256
"""Runners (a head and its choices) remembered for batching; a forgotten one is rebuilt on its next
request and finds its prefix in the cache if it is still there."""


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id, ...: not rendered
    role: str
    content: str | list[dict] | None = None


class _UnicodeBody(BaseModel):
    """A request body every string of which is valid Unicode (JSON may spell a lone surrogate, "\\ud800",
    which no tokenizer takes): otherwise a 400 naming the field (`core.encode.invalid_text_at`)."""

    @model_validator(mode="before")
    @classmethod
    def _unicode(cls, data):
        if (where := invalid_text_at(data)) is not None:
            raise ValueError(f"{where} is not valid Unicode (it holds a lone surrogate); send UTF-8 text")
        return data


class ChatRequest(_UnicodeBody):
    """The fields of OpenAI's chat completion request that change the answer (`wire/chat_request.py`
    reads them); sampling fields are accepted and ignored: nothing is sampled."""

    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    structured_outputs: dict | None = None
    guided_choice: list[str] | None = None
    response_format: dict | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    n: int | None = 1
    stream: bool | None = False


class TokenizeRequest(_UnicodeBody):
    """vLLM's /tokenize: a `prompt`, or `messages` rendered as a chat completion renders them
    (`wire/tokenize_request.py`)."""

    model_config = ConfigDict(extra="allow")  # chat_template, tools, ...: accepted, not used
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool | None = None
    """Default: true for a prompt, false for messages (the chat template writes them), as in vLLM."""
    return_token_strs: bool | None = False


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: list[int]


def prefix_caches(engine, prefix_cache_mb: float, metrics) -> PrefixCaches:
    """The service's prefix caches, counted in /metrics: lookups by result, prefix tokens computed on
    a miss (those read from the cache are counted per request by `ChoiceRunner.score`)."""

    def observe(event: str, tokens: int) -> None:
        metrics.prefix_lookups.labels(event).inc()
        if event == "miss":
            metrics.prefix_tokens.labels("computed").inc(tokens)

    return PrefixCaches(engine, int(prefix_cache_mb * 2**20), observe)


class ChoiceRunner:
    """The scheduler's view of one head and its choices (as `adapter.TaskRunner` is of a task)."""

    name = "chat"

    def __init__(self, choice_scorer: ChoiceScorer, engine, caches: PrefixCaches, metrics):
        self.choices, self.engine, self.caches, self.metrics = choice_scorer, engine, caches, metrics

    token_budget = property(lambda self: self.choices.settings.token_budget)
    max_rows = property(lambda self: self.choices.settings.max_rows)

    def encode(self, prompt: ChoicePrompt) -> EncodedRequest:
        items = self.choices.encode([prompt])
        return EncodedRequest(items=items, status=("ok",), scored=(0,), lengths=(len(items.own(0)),))

    def score(self, picks: list[tuple[EncodedRequest, int]]) -> tuple[np.ndarray, BatchWork]:
        """[k, choices] whole-choice log-probabilities of the picked conversations, in pick order."""
        items = EncodedItems.gather([(req.items, i) for req, i in picks])
        scored = self.choices.score(items, self.engine, self.caches)
        self.metrics.prefix_tokens.labels("reused").inc(len(self.choices.prefix_ids) * int(items.cached.sum()))
        self.metrics.prefix_cache_bytes.set(self.caches.bytes)
        return scored.scores, BatchWork(rows=len(picks), real_tokens=scored.stats.real_tokens,
                                        processed_tokens=scored.stats.processed_tokens)

    def results(self, scores: np.ndarray, status: tuple[str, ...]) -> np.ndarray:
        return scores

    def empty_scores(self, n: int) -> np.ndarray:
        return np.full((n, len(self.choices.labels)), np.nan, dtype=np.float64)


class ChoiceRunners:
    """Runners by `ChoicePrompt.key` (used from the event loop's thread only)."""

    def __init__(self, loaded, settings: EngineSettings, caches: PrefixCaches, metrics):
        """`loaded`: the served model; `settings`: how every chat request is batched."""
        self.loaded, self.settings, self.caches, self.metrics = loaded, settings, caches, metrics
        self._runners: OrderedDict[tuple, ChoiceRunner] = OrderedDict()

    def runner(self, prompt: ChoicePrompt) -> ChoiceRunner:
        runner = self._runners.get(prompt.key)
        if runner is None:
            scorer = ChoiceScorer(self.loaded.tokenizer, self.loaded.model.config, self.settings, prompt)
            runner = self._runners[prompt.key] = ChoiceRunner(scorer, self.loaded.engine, self.caches, self.metrics)
            if len(self._runners) > RUNNERS_KEPT:
                self._runners.popitem(last=False)
        self._runners.move_to_end(prompt.key)
        return runner


class CompletionRequest(_UnicodeBody):
    """The fields of OpenAI's completions request that change the answer (`wire/completions.py`
    reads them); sampling fields are accepted and ignored."""

    model_config = ConfigDict(extra="allow")
    model: str
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = False
    logprobs: int | None = Field(default=None, ge=0, le=20)
    max_tokens: int | None = Field(default=None, description="0 (with echo) or 1; not given is refused: the API's "
                                                             "default is 16 tokens of free text.")
    n: int | None = 1
    stream: bool | None = False


class CompletionRunner:
    """The scheduler's view of one completions request: one pick, the whole request, its rows run
    together on the worker thread (a row's trie is its own, so requests do not share engine batches).
    A pick's output is the request's answer, {prompt index: (token log-probs, top ids, top log-probs)};
    `results` gives each prompt's, in order."""

    name = "completions"
    token_budget = None
    max_rows = 1

    def __init__(self, engine, pad_id: int, ask: CompletionAsk):
        self.engine, self.pad_id, self.ask = engine, pad_id, ask
        self.rows = completion_rows(ask)

    def encode(self) -> EncodedRequest:
        tokens = sum(1 + (r.trie.n_nodes if r.trie is not None else 0) for r in self.rows)
        return EncodedRequest(items=None, status=("ok",), scored=(0,), lengths=(tokens,))

    def score(self, picks: list[tuple[EncodedRequest, int]]) -> tuple[np.ndarray, BatchWork]:
        """[len(picks)] object array: each pick's answer (every pick is this request)."""
        answer: dict[int, tuple] = {}
        for row in self.rows:
            answer.update(row_logprobs(self.engine, self.pad_id, row, self.ask))
        tokens = self.encode().lengths[0]
        outputs = self.empty_scores(len(picks))
        outputs[:] = [answer] * len(picks)
        return outputs, BatchWork(rows=len(self.rows), real_tokens=tokens, processed_tokens=tokens)

    def results(self, scores: np.ndarray, status: tuple[str, ...]) -> list[tuple]:
        answer = scores[0]  # the request's one pick
        return [answer[k] for k in range(len(self.ask.prompts))]

    def empty_scores(self, n: int) -> np.ndarray:
        return np.full(n, None, dtype=object)  # the picks' answers, None until scored
