"""vLLM's pooling classify shape (`{"model", "input"}` → `data[i].probs`): which task a request
names, and its answer. The service (`serve/app.py`) and the batch job (`jobs/batch.py`) both go
through `pooling_task`, so a model id means the same task, and the same refusals, in both."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from ..core.results import Result
from ..errors import InputError


class UnknownModel(InputError):
    """A pooling request's `model` names no task (the service answers 404)."""


class PoolingTask(Protocol):
    """What `pooling_task` asks of a task's runner."""

    def pooling_refusal(self) -> str | None: ...


def pooling_task(model, runners: Mapping[str, PoolingTask], model_names: tuple[str, ...]) -> str:
    """The task a pooling request's `model` names: a task's name, or with one task the model's own
    id. UnknownModel when it names none; InputError when the model is not a string or the task
    cannot answer in this shape (items of several fields, several questions)."""
    if not isinstance(model, str):
        raise InputError(f"model must be a string, the task's name (got {type(model).__name__})")
    name = model
    if name not in runners and name in model_names and len(runners) == 1:
        name = next(iter(runners))
    if name not in runners:
        if not runners:
            raise UnknownModel(f"unknown model {model!r}: no tasks were given; give tasks with --task NAME=FILE.toml")
        raise UnknownModel(f"unknown model {model!r}: name a task ({', '.join(sorted(runners))})"
                           + (f" or {model_names[0]!r}" if len(runners) == 1 else ""))
    refusal = runners[name].pooling_refusal()
    if refusal is not None:
        raise InputError(refusal)
    return name


def pooling_response(model: str, labels, results: list[Result], prompt_tokens: int, answer_id: str,
                     created: int) -> dict:
    """Results in vLLM's pooling classify shape: `data[i].probs` in the task's label order (a
    multi-label task's P(yes) of each), `usage` in real prompt tokens (the cached prefix included)."""
    return {"id": answer_id, "object": "list", "created": created, "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens, "completion_tokens": 0,
                      "prompt_tokens_details": None},
            "data": [{"index": k, "label": r.label, "probs": [r.probabilities.get(lab) for lab in labels]
                      if r.probabilities else [], "num_classes": len(labels)} for k, r in enumerate(results)]}


__all__ = ["UnknownModel", "pooling_task", "pooling_response"]
