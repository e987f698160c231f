"""A learned head: multinomial logistic regression on hidden states read from the fast path (or,
for a multi-label task, one logistic regression per label: `one_vs_rest.py`).

The head is plain numbers (standardisation, weights, biases) plus what it was fitted for: the
model's fingerprint, the task's prompt and the layers it reads. Saved as one `.npz` file without
pickles; its predictions are one matrix product and a softmax in float64, so they are deterministic.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError, TaskError
from ..core.taps import Taps
from ..core.readout import Readout, of_flag
from ..core.task import Example, Question, Task

FORMAT = "slmclassify-head-1"


@dataclass(frozen=True)
class Head:
    """A fitted head and what it was fitted for."""

    labels: tuple[str, ...]
    """The head's classes (any strings from the gold column), in column order."""
    taps: Taps
    """The hidden states that are the features (`core/taps.py`)."""
    use_scores: bool
    """Whether the task's calibrated label log-probabilities are appended to the states."""
    mean: np.ndarray
    """[F] feature means on the training items."""
    scale: np.ndarray
    """[F] feature standard deviations (1 where constant)."""
    coef: np.ndarray
    """[K, F] weights on the standardised features."""
    intercept: np.ndarray
    """[K] biases."""
    model: dict
    """Fingerprint of the model the features came from (`model_fingerprint`)."""
    task: dict
    """The task the features came from (`task_record`): prompt, labels, scoring."""
    info: dict
    """How it was fitted: C, items per label, cross-validated metrics."""
    multi_label: bool = False
    """One-vs-rest: coef row j gives label j's log-odds of applying (`log_odds`), not a softmax logit."""
    thresholds: tuple[float, ...] = ()
    """Multi-label: per label the P(yes) at or above which it is chosen (F1-optimal out of fold)."""
    cosine: bool = False
    """Each item's standardised features are scaled to unit length before the product: coef rows
    are then directions and the logits cosine similarities over a temperature (`head/describe.py`)."""

    def features(self, states: np.ndarray, calibrated: np.ndarray) -> np.ndarray:
        """[n, F] features from [n, taps*hidden] states and [n, L] calibrated label scores."""
        parts = [states.astype(np.float64)]
        if self.use_scores:
            parts.append(calibrated.astype(np.float64))
        return np.concatenate(parts, axis=1)

    @property
    def readout(self) -> Readout:
        """How its numbers are read (`core/readout.py`): one distribution, or a log-odds per label."""
        return of_flag(self.multi_label)

    def logits(self, features: np.ndarray) -> np.ndarray:
        """[n, K] the linear map of the standardised features (cosine: of their directions)."""
        if self.cosine:
            centred = (features - self.mean) / self.scale
            features = centred / np.maximum(np.linalg.norm(centred, axis=1, keepdims=True), 1e-12)
            return linear_log_odds(features, 0.0, 1.0, self.coef, self.intercept)
        return linear_log_odds(features, self.mean, self.scale, self.coef, self.intercept)

    def scores(self, features: np.ndarray) -> np.ndarray:
        """[n, K] what the head answers with, as its readout reads its logits: log-probabilities of
        its labels, or a multi-label head's log-odds per label (NaN rows stay NaN)."""
        return self.readout.head_scores(self.logits(features))

    def log_probabilities(self, features: np.ndarray) -> np.ndarray:
        """[n, K] log-probabilities of the head's labels (NaN rows stay NaN)."""
        return self.readout.head_log_probabilities(self.logits(features))

    def log_odds(self, features: np.ndarray) -> np.ndarray:
        """Multi-label: [n, L] each label's log-odds of applying (NaN rows stay NaN)."""
        return linear_log_odds(features, self.mean, self.scale, self.coef, self.intercept)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        with path.open("wb") as f:  # np.savez would append .npz to a name without it
            np.savez(f, meta=np.array(json.dumps(self.meta())), **self.arrays())
        return path

    def meta(self) -> dict:
        """What the file's `meta` holds: everything but the arrays."""
        return {"format": FORMAT, "labels": list(self.labels), "taps": list(self.taps.last), "pooled": list(self.taps.mean),
                "echo": self.taps.echo,
                "use_scores": self.use_scores, "model": self.model, "task": self.task, "info": self.info,
                "multi_label": self.multi_label, "thresholds": list(self.thresholds), "cosine": self.cosine}

    def arrays(self) -> dict[str, np.ndarray]:
        return {"mean": self.mean, "scale": self.scale, "coef": self.coef, "intercept": self.intercept}

    @classmethod
    def load(cls, path: str | Path):
        """The head in `path`; a file of one head per question (`fit` on a task with questions) loads
        as its `QuestionHeads` (below), so that `--head` takes either file."""
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                arrays = {k: data[k].astype(np.float64) for k in data.files if k != "meta"}
        except FileNotFoundError:
            raise InputError(f"head file not found: {path}") from None
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:  # EOFError: an empty file
            raise InputError(f"{path} is not a head file written by `slmclassify fit` "
                             f"({exc or 'it is empty'})") from None
        if meta.get("format") not in (FORMAT, QUESTIONS_FORMAT):
            raise InputError(f"{path}: unknown head format {meta.get('format')!r}; refit with `slmclassify fit`")
        try:
            return (QuestionHeads if meta["format"] == QUESTIONS_FORMAT else cls).from_file(meta, arrays)
        except KeyError as exc:
            raise InputError(f"{path} is not a head file written by `slmclassify fit` (no {exc})") from None

    @classmethod
    def from_file(cls, meta: dict, arrays: dict[str, np.ndarray]) -> Head:
        """A head from its `meta` and its four arrays (`mean`, `scale`, `coef`, `intercept`)."""
        return cls(labels=tuple(meta["labels"]), taps=Taps(meta["taps"], meta.get("pooled", ()), meta.get("echo", False)), use_scores=meta["use_scores"],
                   model=meta["model"], task=meta["task"], info=meta["info"], multi_label=meta.get("multi_label", False),
                   thresholds=tuple(meta.get("thresholds", ())), cosine=meta.get("cosine", False),
                   **{k: arrays[k] for k in ("mean", "scale", "coef", "intercept")})

    def check(self, fingerprint: dict, task: Task, source: str = "the head") -> None:
        """Refuse features from another model or task, naming what differs."""
        check_fitted(self.model, self.task, fingerprint, task, source)


def check_fitted(model: dict, record: dict, fingerprint: dict, task: Task, source: str) -> None:
    """Refuse a head (or heads) fitted with `model` and task `record` for another model or task,
    naming what differs (a task with questions: the first question that differs)."""
    differs = sorted(k for k in set(fingerprint) | set(model)
                     if k != "name" and fingerprint.get(k) != model.get(k))  # same weights: any path
    if differs:
        raise TaskError(f"{source} was fitted for model {model.get('name')!r}, not {fingerprint.get('name')!r} "
                        f"({', '.join(differs)} differ); refit it with `slmclassify fit --model ...`")
    here = task_record(task)
    if here == record:
        return
    differs = [k for k in dict.fromkeys([*record, *here]) if here.get(k) != record.get(k)]
    if differs == ["questions"] and record.get("questions") and here.get("questions"):
        detail = _question_difference(record["questions"], here["questions"])
    else:
        detail = "; ".join(f"{k}: {_short(record.get(k))} in the head, {_short(here.get(k))} here" for k in differs)
    raise TaskError(f"{source} was fitted for another task ({detail}); use the task it was fitted "
                    f"with or refit it with `slmclassify fit`")


def _question_difference(fitted: list[dict], here: list[dict]) -> str:
    """Which question differs between two tasks with questions, and in what."""
    names, here_names = [q["name"] for q in fitted], [q["name"] for q in here]
    if names != here_names:
        return f"questions: {names} in the head, {here_names} here"
    for a, b in zip(fitted, here):
        if a != b:
            keys = [k for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]
            return f"question {a['name']!r}: " + "; ".join(f"{k}: {_short(a.get(k))} in the head, {_short(b.get(k))} here"
                                                           for k in keys)
    return "questions differ"


def linear_log_probabilities(X, mean, scale, coef, intercept) -> np.ndarray:
    """log softmax(((X - mean) / scale) @ coef.T + intercept), row by row: [n, F] → [n, K]."""
    logits = ((X - mean) / scale) @ coef.T + intercept
    top = logits.max(axis=1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))


def linear_log_odds(X, mean, scale, coef, intercept) -> np.ndarray:
    """((X - mean) / scale) @ coef.T + intercept: [n, F] → [n, L], each row of coef one label's log-odds."""
    return ((X - mean) / scale) @ coef.T + intercept


def task_record(task: Task) -> dict:
    """What of a task shapes the features: the prompt, the scored labels and their scoring (a task
    with questions: each question's name, words and record too)."""
    record = {"labels": list(task.labels), "descriptions": list(task.descriptions), "instruction": task.instruction,
              "system": task.system, "user_template": task.user_template,
              "examples": [[ex.text, ex.label] for ex in task.examples], "mode": task.mode,
              "calibrate": task.calibrate, "temperature": task.temperature, "multi_label": task.multi_label,
              "questions": [{"name": q.name, "question": q.question, **task_record(q.task)} for q in task.questions]}
    # written only when set: the records of a task of one label per item are those of before
    return {k: v for k, v in record.items() if v or k not in _SET_ONLY}


_SET_ONLY = ("multi_label", "questions")
"""The record's keys left out at their defaults (false, none): absent in the heads and label stores of before."""


def task_from_record(record: dict, min_confidence: float | None = None) -> Task:
    """The task a head was fitted with (so `classify --head` needs no task flags)."""
    values = {k: v for k, v in record.items() if k not in ("examples", "questions")}
    questions = tuple(Question(q["name"], task_from_record({k: v for k, v in q.items() if k not in ("name", "question")}),
                               q["question"]) for q in record.get("questions", ()))
    task = Task(**{**values, "labels": tuple(values["labels"]), "descriptions": tuple(values["descriptions"]),
                   "examples": tuple(Example(t, lab) for t, lab in record["examples"]), "questions": questions})
    return task.with_overrides(min_confidence=min_confidence)


def task_hash(task: Task) -> str:
    return hashlib.sha256(json.dumps(task_record(task), sort_keys=True).encode()).hexdigest()[:16]


def model_fingerprint(loaded) -> dict:
    """Architecture, sizes and a digest of some weights: equal for the same weights wherever they load from."""
    cfg = loaded.model.config
    base = loaded.model.model
    digest = hashlib.sha256()
    for tensor in (base.norm.weight, base.embed_tokens.weight[:64], *(layer.input_layernorm.weight for layer in base.layers),
                   base.layers[-1].mlp.down_proj.weight[:8]):
        digest.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    return {"name": loaded.name, "architecture": cfg.model_type, "hidden_size": cfg.hidden_size,
            "layers": cfg.num_hidden_layers, "vocab": cfg.vocab_size, "weights": digest.hexdigest()[:16]}


def _short(value, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


QUESTIONS_FORMAT = "slmclassify-question-heads-1"


@dataclass(frozen=True)
class QuestionHeads:
    """The heads of some questions of one task with questions, fitted on one pass's states."""

    heads: dict[str, Head]
    """Question name → its head, in the task's question order."""
    model: dict
    """Fingerprint of the model the features came from (`model_fingerprint`)."""
    task: dict
    """The whole task's record (`task_record`, with every question's)."""
    info: dict
    """How they were fitted: items, folds, source."""

    @property
    def taps(self) -> Taps:
        """What the pass reads: every head's taps, each layer once (`last` then `mean`, sorted)."""
        return union_taps(h.taps for h in self.heads.values())

    def check(self, fingerprint: dict, task: Task, source: str = "the heads") -> None:
        """Refuse features from another model or task, naming what differs."""
        check_fitted(self.model, self.task, fingerprint, task, source)

    def save(self, path: str | Path) -> Path:
        meta = {"format": QUESTIONS_FORMAT, "model": self.model, "task": self.task, "info": self.info,
                "questions": {name: head.meta() for name, head in self.heads.items()}}
        arrays = {f"{name}.{k}": v for name, head in self.heads.items() for k, v in head.arrays().items()}
        path = Path(path)
        with path.open("wb") as f:  # np.savez would append .npz to a name without it
            np.savez(f, meta=np.array(json.dumps(meta)), **arrays)
        return path

    @classmethod
    def from_file(cls, meta: dict, arrays: dict[str, np.ndarray]) -> QuestionHeads:
        """From the file's `meta` and arrays (`Head.load` reads the file and calls this)."""
        heads = {name: Head.from_file(head_meta, {k: arrays[f"{name}.{k}"] for k in ("mean", "scale", "coef", "intercept")})
                 for name, head_meta in meta["questions"].items()}
        return cls(heads=heads, model=meta["model"], task=meta["task"], info=meta["info"])


def union_taps(all_taps) -> Taps:
    all_taps = list(all_taps)
    return Taps(last=sorted({t for taps in all_taps for t in taps.last}),
                mean=sorted({t for taps in all_taps for t in taps.mean}))
