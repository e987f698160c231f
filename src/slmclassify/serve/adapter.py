"""The service's only window into a Classifier: encode a request, score a batch of items taken
from many requests, turn scores into Results.

Everything else in `serve/` treats encoded items as opaque handles, so a change to the layout
of `EncodedItems` touches this module only. Scoring goes through `Classifier.score` and
`Classifier.calibration.results`, the calls offline `classify` makes (`Classifier.score_items`), so a text
gets
the same scores (within float32 rounding, ≤1e-4 log-prob) however the scheduler groups it with
others; the scheduler does the rest of that step itself (picks across requests, scatter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..classifier import Classifier
from ..core.encode import EncodedItems
from ..core.results import EMPTY
from ..core.results import Result


@dataclass(frozen=True)
class EncodedRequest:
    """One request's texts, tokenized."""

    items: EncodedItems
    """Opaque to the scheduler: only this module reads it."""
    status: tuple[str, ...]
    """ok, empty or truncated, per text."""
    scored: tuple[int, ...]
    """Indices of the texts the model must score (not empty), in request order."""
    lengths: tuple[int, ...]
    """Tokens the engine runs for each scored text (after the cached prefix)."""


@dataclass(frozen=True)
class BatchWork:
    """What one engine call did, for the metrics."""

    rows: int
    real_tokens: int
    """Non-pad tokens run."""
    processed_tokens: int
    """Tokens run including padding."""


class Runner(Protocol):
    """What the scheduler (`scheduler.py`) runs: a task's classifier (`TaskRunner`), a chat request's
    choices (`chat.ChoiceRunner`) or a completions request (`chat.CompletionRunner`). Requests of one
    runner are batched together; `score` gives one output row per pick, in pick order, which the
    ticket keeps until every pick of its request is scored, and `results` turns a request's rows
    (`empty_scores` where nothing was scored) into its answer."""

    name: str
    token_budget: int | None
    """Batches are cut at this many padded tokens (None: at `max_rows` picks)."""
    max_rows: int

    def score(self, picks: list[tuple[EncodedRequest, int]]) -> tuple[np.ndarray, BatchWork]: ...

    def results(self, scores: np.ndarray, status: tuple[str, ...]) -> Any: ...

    def empty_scores(self, n: int) -> np.ndarray: ...


class TaskRunner:
    """One task's classifier, seen through what the scheduler and the HTTP layer need."""

    def __init__(self, name: str, classifier: Classifier):
        self.name = name
        self.classifier = classifier
        self.labels = classifier.task.labels

    @property
    def token_budget(self) -> int | None:
        return self.classifier.settings.token_budget

    @property
    def max_rows(self) -> int:
        return self.classifier.settings.max_rows

    @property
    def max_text_tokens(self) -> int | None:
        return self.classifier.settings.max_text_tokens

    def describe(self) -> dict:
        """The task as /v1/tasks lists it: its labels, or a task of several questions each question's."""
        clf, task = self.classifier, self.classifier.task
        calibrated = clf.bias is not None
        return {"name": self.name, **task.listing(calibrated), "mode": clf.mode, "calibrated": calibrated,
                "fields": list(task.fields)}

    def pooling_refusal(self) -> str | None:
        """Why vLLM's pooling shape (one label distribution per text) cannot answer this task, or None."""
        task = self.classifier.task
        if task.multi_field:
            return (f"task {self.name!r} takes items of several fields ({', '.join(task.fields)}): send them as "
                    "'items' with 'task'")
        if len(task.asked) > 1:  # one distribution per text holds one question's answers
            return (f"task {self.name!r} asks several questions ({', '.join(q.name for q in task.asked)}): "
                    "vLLM's pooling shape holds one label distribution per text; send "
                    f"{{\"task\": \"{self.name}\", \"texts\": [...]}} for each question's answers")
        return None

    def encode(self, texts: list[str]) -> EncodedRequest:
        """Tokenize a request's texts (per-text token cap applied: status `truncated`)."""
        items = self.classifier.encode(texts)
        scored = tuple(int(i) for i in items.scored)
        return EncodedRequest(items=items, status=tuple(items.status), scored=scored,
                              lengths=tuple(len(items.suffix(i)) for i in scored))

    def score(self, picks: list[tuple[EncodedRequest, int]]) -> tuple[np.ndarray, BatchWork]:
        """[k, L] raw label scores of the picked (request, text index) items, in pick order."""
        scored = self.classifier.score(EncodedItems.gather([(req.items, i) for req, i in picks]))
        return scored.scores, BatchWork(rows=len(picks), real_tokens=scored.stats.real_tokens,
                                        processed_tokens=scored.stats.processed_tokens)

    def results(self, scores: np.ndarray, status: tuple[str, ...]) -> list[Result]:
        """[n, L] raw scores (NaN rows for empty texts) → one Result per text, as offline classify."""
        return self.classifier.calibration.results(scores, list(status))

    def empty_scores(self, n: int) -> np.ndarray:
        return np.full((n, len(self.classifier.trie.labels)), np.nan, dtype=np.float64)  # multi-label: 2 per label


def result_json(result: Result) -> dict:
    """A Result as the API returns it; a task of several questions: each question's answer by its
    name (the fields of one question's result, but the status), then the item's review flag and status."""
    if result.answers:
        return {"answers": {name: answer_json(a) for name, a in result.answers.items()},
                "needs_review": result.needs_review, "status": result.status}
    return {**answer_json(result), "status": result.status}


def answer_json(result: Result) -> dict:
    """One answer's fields: label, labels, confidence, needs_review, probabilities."""
    return {"label": result.label, "labels": list(result.labels), "confidence": result.confidence,
            "needs_review": result.needs_review, "probabilities": result.probabilities}


__all__ = ["BatchWork", "EMPTY", "EncodedRequest", "Runner", "TaskRunner", "result_json"]
