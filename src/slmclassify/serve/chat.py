"""OpenAI's chat completions with a choice constraint, answered by scoring each whole choice.

A request names its choices in one of the spellings clients use: vLLM's `structured_outputs:
{"choice": [...]}` (`guided_choice` before vLLM 0.12), or OpenAI's `response_format` with a JSON
schema that is a string `enum` (the answer is then the choice as a JSON string, `"billing"`). No
task is declared: the conversation is rendered with the model's chat template and its shared head
found by itself (`core/conversation.py`). Requests with the same head and choices share one runner,
so the scheduler batches them together, and one cached prefix, held in a bounded LRU
(`PrefixCaches`, `--prefix-cache-mb`) that only the engine's worker thread touches.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..core.conversation import ChoicePrompt
from ..core.encode import EncodedItems
from ..core.scoring import Scorer
from ..core.settings import EngineSettings
from ..errors import InputError
from .adapter import BatchWork, EncodedRequest

RUNNERS_KEPT = 256
"""Runners (a head and its choices) remembered for batching; a forgotten one is rebuilt on its next
request and finds its prefix in the cache if it is still there."""


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id, ...: not rendered
    role: str
    content: str | list[dict] | None = None


class ChatRequest(BaseModel):
    """The fields of OpenAI's chat completion request that change the answer; sampling fields
    (temperature, top_p, seed, max_tokens, ...) are accepted and ignored: nothing is sampled."""

    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    structured_outputs: dict | None = None
    guided_choice: list[str] | None = None
    response_format: dict | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    n: int | None = 1
    stream: bool | None = False


def choices_of(body: ChatRequest) -> tuple[str, ...]:
    """The strings to score (a `response_format` enum's as JSON strings: the answer is JSON). Raises
    InputError when the request asks for free text or for what is not a choice among strings."""
    if body.stream:
        raise InputError("stream is not supported: the answer is one choice, scored whole; send stream: false")
    if (body.n or 1) != 1:
        raise InputError(f"n={body.n} is not supported: the answer is the best choice, exactly one")
    given = []
    if body.structured_outputs is not None:
        if set(body.structured_outputs) != {"choice"}:
            raise InputError("structured_outputs: only 'choice' (a list of strings) is supported, not "
                             + ", ".join(sorted(set(body.structured_outputs) - {"choice"})))
        given.append(("structured_outputs.choice", body.structured_outputs["choice"], False))
    if body.guided_choice is not None:
        given.append(("guided_choice", body.guided_choice, False))
    if body.response_format is not None and body.response_format.get("type") != "text":
        given.append(("response_format", _schema_enum(body.response_format), True))
    if not given:
        raise InputError("free-text generation is not supported: constrain the answer to a list of strings with "
                         "structured_outputs: {\"choice\": [...]}, guided_choice, or response_format with a JSON "
                         "schema {\"type\": \"string\", \"enum\": [...]}")
    if len(given) > 1:
        raise InputError(f"the choices are given twice ({given[0][0]} and {given[1][0]}); give one")
    where, choices, as_json = given[0]
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise InputError(f"{where} must be a list of strings")
    return tuple(json.dumps(c, ensure_ascii=False) if as_json else c for c in choices)


def _schema_enum(response_format: dict) -> list:
    schema = (response_format.get("json_schema") or {}).get("schema") if response_format.get("type") == "json_schema" \
        else None
    if not isinstance(schema, dict) or schema.get("type", "string") != "string" or "enum" not in schema:
        raise InputError("response_format: only a JSON schema that is a string enum ({\"type\": \"string\", "
                         "\"enum\": [...]}) is supported: the answer is one of its strings")
    return schema["enum"]


def message_dicts(body: ChatRequest) -> list[dict]:
    """The messages as a chat template takes them: text parts joined, `developer` as `system`."""
    out = []
    for index, message in enumerate(body.messages):
        content = message.content
        if isinstance(content, list):
            if any(part.get("type") != "text" for part in content):
                raise InputError(f"messages[{index}].content: only text parts are supported")
            content = "".join(part.get("text", "") for part in content)
        if message.role not in ("system", "developer", "user", "assistant"):
            raise InputError(f"messages[{index}].role {message.role!r}: only system, developer, user and assistant "
                             "messages are supported")
        out.append({"role": "system" if message.role == "developer" else message.role, "content": content or ""})
    return out


class PrefixCaches:
    """The engine's prefix caches by head ids, least recently used dropped beyond `max_bytes`; used
    by the worker thread only. Counts lookups and the prefix tokens computed vs read from the cache."""

    def __init__(self, engine, max_bytes: int, metrics):
        self.engine = engine
        self.max_bytes = max_bytes
        self.metrics = metrics
        self._caches: OrderedDict[tuple[int, ...], tuple[object, int]] = OrderedDict()
        self.bytes = 0

    def get(self, head_ids: tuple[int, ...]):
        """The prefix cache of `head_ids`, computed now when absent."""
        if head_ids in self._caches:
            self._caches.move_to_end(head_ids)
            self.metrics.prefix_lookups.labels("hit").inc()
            return self._caches[head_ids][0]
        self.metrics.prefix_lookups.labels("miss").inc()
        self.metrics.prefix_tokens.labels("computed").inc(len(head_ids))
        cache = self.engine.prefill(list(head_ids))
        size = sum(t.numel() * t.element_size() for t in (*cache.keys, *cache.values))
        if size <= self.max_bytes:
            self._caches[head_ids] = (cache, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, dropped) = self._caches.popitem(last=False)
                self.bytes -= dropped
        self.metrics.prefix_cache_bytes.set(self.bytes)
        return cache


class ChoiceRunner:
    """The scheduler's view of one head and its choices (as `adapter.TaskRunner` is of a task):
    encodes a conversation, scores a batch of them through the task path's scorer, answers raw scores."""

    name = "chat"

    def __init__(self, loaded, settings: EngineSettings, caches: PrefixCaches, prompt: ChoicePrompt):
        self.scorer = Scorer.for_prompts(loaded.tokenizer, loaded.model.config, settings, prompt.trie,
                                         list(prompt.head_ids))
        self.engine = loaded.engine
        self.caches = caches
        self.head_ids = prompt.head_ids

    token_budget = property(lambda self: self.scorer.settings.token_budget)
    max_rows = property(lambda self: self.scorer.settings.max_rows)

    def encode(self, prompt: ChoicePrompt) -> EncodedRequest:
        cached = bool(prompt.head_ids)
        items = EncodedItems.join([np.array(prompt.own_ids if cached else prompt.prompt_ids)], ["ok"], [cached],
                                  list(prompt.head_ids))
        return EncodedRequest(items=items, status=("ok",), scored=(0,), lengths=(len(items.own(0)),))

    def score(self, picks: list[tuple[EncodedRequest, int]]) -> tuple[np.ndarray, BatchWork]:
        """[k, choices] whole-choice log-probabilities of the picked conversations, in pick order."""
        items = EncodedItems.gather([(req.items, i) for req, i in picks])
        prefix = self.caches.get(self.head_ids) if self.head_ids else None
        self.caches.metrics.prefix_tokens.labels("reused").inc(len(self.head_ids) * len(picks))
        scored = self.scorer.score(items, self.engine, prefix)
        return scored.scores, BatchWork(rows=len(picks), real_tokens=scored.stats.real_tokens,
                                        processed_tokens=scored.stats.processed_tokens)

    def results(self, scores: np.ndarray, status: tuple[str, ...]) -> np.ndarray:
        return scores

    def empty_scores(self, n: int) -> np.ndarray:
        return np.full((n, len(self.scorer.trie.labels)), np.nan, dtype=np.float64)


class ChoiceRunners:
    """Runners by `ChoicePrompt.key`, so that requests of one head and choices meet in one pool."""

    def __init__(self, loaded, settings: EngineSettings, caches: PrefixCaches):
        """`loaded`: the served model; `settings`: the engine settings every request is batched with."""
        self.loaded, self.settings, self.caches = loaded, settings, caches
        self._runners: OrderedDict[tuple, ChoiceRunner] = OrderedDict()

    def runner(self, prompt: ChoicePrompt) -> ChoiceRunner:
        runner = self._runners.get(prompt.key)
        if runner is None:
            runner = self._runners[prompt.key] = ChoiceRunner(self.loaded, self.settings, self.caches, prompt)
            if len(self._runners) > RUNNERS_KEPT:
                self._runners.popitem(last=False)
        self._runners.move_to_end(prompt.key)
        return runner


def chat_response(body: ChatRequest, prompt: ChoicePrompt, scores: np.ndarray) -> dict:
    """The OpenAI chat completion for one conversation's [choices] whole-choice log-probabilities."""
    labels = prompt.trie.labels
    best = int(np.argmax(scores))
    logprobs = None
    if body.logprobs:
        top = np.argsort(-scores, kind="stable")[: body.top_logprobs or 0]
        logprobs = {"content": [{**_entry(labels[best], scores[best]),
                                 "top_logprobs": [_entry(labels[k], scores[k]) for k in top]}], "refusal": None}
    completion = len(prompt.trie.sequences[best])
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": body.model, "system_fingerprint": None,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": labels[best], "refusal": None},
                         "logprobs": logprobs, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": len(prompt.prompt_ids), "completion_tokens": completion,
                      "total_tokens": len(prompt.prompt_ids) + completion}}


def _entry(choice: str, logprob: float) -> dict:
    return {"token": choice, "logprob": float(logprob), "bytes": list(choice.encode("utf-8"))}
