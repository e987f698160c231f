"""What to classify into: labels, instruction, examples and prompt overrides.

A `Task` is validated once, when it is built, so everything downstream may trust it.
It comes from CLI flags or a TOML task file (`Task.from_toml`); `build_task` merges the two
(flags win) from plain values and tuples, so library code never goes through the CLI's strings.
"""

from __future__ import annotations

import csv
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from ..errors import FieldError, TaskError

DEFAULT_INSTRUCTION = "You classify short texts into exactly one category."
MODES = ("auto", "first", "full", "full-mean")


@dataclass(frozen=True)
class Example:
    """One few-shot example: a text and its label."""

    text: str
    label: str


@dataclass(frozen=True)
class Task:
    """A classification task. Validated on construction."""

    labels: tuple[str, ...]
    """The label set, in the order of the output's `p_<label>` columns."""
    descriptions: tuple[str, ...] = ()
    """Optional one-line description per label ('' for none); empty means no descriptions."""
    instruction: str = DEFAULT_INSTRUCTION
    """The first line of the system turn."""
    examples: tuple[Example, ...] = ()
    """Few-shot examples, rendered as earlier user/assistant turns (they live in the cached prefix)."""
    system: str | None = None
    """Replaces the whole system turn (instruction and label list) when set."""
    user_template: str = "{text}"
    """Wraps each item in the last user turn; must contain `{text}` once."""
    min_confidence: float = 0.5
    """Items whose top probability is below this get `needs_review = true`."""
    mode: str = "auto"
    """Label scoring: auto, first (first token), full (sum of log-probs), full-mean (per-token mean)."""
    calibrate: bool = True
    """Remove each label's prior, estimated from content-free inputs (contextual calibration)."""
    temperature: float = 1.0
    """Divide label scores by this before the softmax (fitted by `evaluate --fit-temperature`)."""

    def __post_init__(self) -> None:
        for name in ("labels", "descriptions", "examples"):
            value = getattr(self, name)
            # A string is iterable: Task(labels="abc") would silently become labels a, b, c.
            if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
                raise TaskError(f"{name} must be a list or tuple of {'names' if name == 'labels' else name}, "
                                f"e.g. labels=('billing', 'technical'); got {value!r}")
        for label in self.labels:  # str() would make None the label 'None' and 1 the label '1'
            if not isinstance(label, str):
                raise TaskError(f"label {label!r} is a {type(label).__name__}, not a str; labels are names, "
                                "e.g. labels=('billing', 'technical')")
        labels = tuple(self.labels)
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "descriptions", tuple(self.descriptions))
        object.__setattr__(self, "examples", tuple(self.examples))
        if len(labels) < 2:
            raise TaskError(f"a task needs at least two labels, got {len(labels)}: {list(labels)}")
        for label in labels:
            if not label.strip():
                raise TaskError("a label is empty; remove it or give it a name")
            if label != label.strip():
                raise TaskError(f"label {label!r} has leading or trailing whitespace")
        seen: set[str] = set()
        for label in labels:
            if label in seen:
                raise TaskError(f"label {label!r} is listed twice")
            seen.add(label)
        if self.descriptions and len(self.descriptions) != len(labels):
            raise TaskError(
                f"{len(self.descriptions)} descriptions for {len(labels)} labels; give one per label"
            )
        for ex in self.examples:
            if ex.label not in seen:
                raise TaskError(f"example {ex.text[:40]!r} has label {ex.label!r}, which is not in the label set")
        if self.user_template.count("{text}") != 1:
            raise FieldError("user_template", "{field} must contain '{{text}}' exactly once, got {value!r}",
                             value=self.user_template)
        if not 0.0 <= self.min_confidence <= 1.0:
            raise FieldError("min_confidence", "{field} must be between 0 and 1, got {value}",
                             value=self.min_confidence)
        if not self.temperature > 0:
            raise TaskError(f"temperature must be positive, got {self.temperature}")
        if self.mode not in MODES:
            raise FieldError("mode", "{field} must be one of {choices}, got {value!r}",
                             choices=', '.join(MODES), value=self.mode)

    def system_turn(self) -> str:
        """The system message: the override, or the instruction plus the label list."""
        if self.system is not None:
            return self.system
        if any(self.descriptions):
            lines = [f"- {label}: {desc}" if desc else f"- {label}" for label, desc in zip(self.labels, self.descriptions)]
            return f"{self.instruction}\nAnswer with exactly one of these labels:\n" + "\n".join(lines)
        return f"{self.instruction}\nAnswer with exactly one of: {', '.join(self.labels)}."

    def user_turn(self, text: str) -> str:
        """The user message for one item."""
        # str.replace rather than str.format: item texts may contain braces.
        return self.user_template.replace("{text}", text)

    def with_overrides(self, **overrides: Any) -> Task:
        """A copy with the given fields replaced; `None` values are ignored."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    @classmethod
    def from_toml(cls, path: str | Path) -> Task:
        """Read a task file. Unknown keys are an error, so typos do not pass silently."""
        path = Path(path)
        return cls.from_dict(_read_toml(path), source=str(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "task") -> Task:
        _check_keys(data, _TOP_LEVEL, source, "")
        for key, kind in _TYPES.items():
            if key in data and (not isinstance(data[key], kind) or (kind is not bool and isinstance(data[key], bool))):
                raise TaskError(f"{source}: {key!r} must be {_KIND_NAMES[kind]}, got {data[key]!r}")
        raw_labels = data.get("labels")
        if not isinstance(raw_labels, list):
            raise TaskError(f"{source}: 'labels' must be a list of names or of {{name, description}} tables")
        labels, descriptions = [], []
        for item in raw_labels:
            if isinstance(item, dict):
                _check_keys(item, ("name", "description"), source, "label table ")
                if "name" not in item:
                    raise TaskError(f"{source}: a label table needs a 'name': {item}")
                labels.append(str(item["name"]))
                descriptions.append(str(item.get("description", "")))
            else:
                labels.append(str(item))
                descriptions.append("")
        examples = []
        for ex in data.get("examples", []):
            if not isinstance(ex, dict) or "text" not in ex or "label" not in ex:
                raise TaskError(f"{source}: each example needs 'text' and 'label': {ex}")
            _check_keys(ex, ("text", "label"), source, "example ")
            examples.append(Example(str(ex["text"]), str(ex["label"])))
        kwargs = {k: v for k, v in data.items() if k in {f.name for f in fields(cls)} - {"descriptions"}}
        kwargs.update(
            labels=tuple(labels),
            descriptions=tuple(descriptions) if any(descriptions) else (),
            examples=tuple(examples),
        )
        return cls(**kwargs)


_TOP_LEVEL = ("labels", "instruction", "examples", "system", "user_template", "min_confidence", "mode",
              "calibrate", "temperature", "token_budget", "max_rows", "device", "precision", "head")
_TYPES = {"instruction": str, "system": str, "user_template": str, "mode": str, "calibrate": bool,
          "min_confidence": (int, float), "temperature": (int, float), "token_budget": int, "max_rows": int,
          "device": str, "precision": str,
          "head": str}  # head: a head file for classify/evaluate (`head/apply.py`), not part of the Task
_KIND_NAMES = {str: "a string", int: "an integer", (int, float): "a number", bool: "true or false"}


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TaskError(f"task file not found: {path}") from None
    except IsADirectoryError:
        raise TaskError(f"task file {path} is a folder, not a TOML file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TaskError(f"task file {path} is not valid TOML: {exc}") from None


def _check_keys(table: dict, known, source: str, where: str) -> None:
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise TaskError(f"{source}: unknown key(s) in {where or 'the task'}: {unknown}; known keys are {list(known)}")


def parse_labels(spec: str) -> tuple[str, ...]:
    """`--labels a,b,c` → ('a', 'b', 'c'), read as one CSV line: `'"x,y",z'` → ('x,y', 'z').

    Names are stripped, and a trailing comma is allowed (`a, b,` is ('a', 'b')); an empty name
    before another one (`a,,b`) is refused, as `Task` refuses an empty label.
    """
    if "\n" in spec or "\r" in spec:
        raise TaskError("--labels must be one line of comma-separated names")
    try:
        fields_ = next(csv.reader([spec], skipinitialspace=True, strict=True), [])
    except csv.Error as exc:
        raise TaskError(f"--labels {spec!r} is not valid CSV ({exc}); quote a name that contains a comma "
                        'like this: --labels \'"x,y",z\'') from None
    names = [part.strip() for part in fields_]
    while names and not names[-1]:
        names.pop()
    if "" in names:
        raise TaskError(f"--labels {spec!r}: label {names.index('') + 1} is empty; remove the extra comma or "
                        "give it a name")
    return tuple(names)


def build_task(task_file: str | Path | None = None, labels: tuple[str, ...] | None = None, *,
               instruction: str | None = None, system: str | None = None, user_template: str | None = None,
               mode: str | None = None, min_confidence: float | None = None, calibrate: bool | None = None,
               default_instruction: str | None = None) -> Task:
    """The task from a task file and/or explicit values; given values (not None) win.

    `labels` replaces the file's labels (and drops its descriptions). `default_instruction` is
    used when neither the file nor `instruction` gives one (e.g. a BIG-bench task's own question).
    """
    overrides = dict(instruction=instruction, system=system, mode=mode, min_confidence=min_confidence,
                     user_template=user_template, calibrate=calibrate)
    if labels is not None:
        labels = tuple(labels)
    if task_file:
        data = _read_toml(Path(task_file))
        task = Task.from_dict(data, source=str(task_file))
        if instruction is None and "instruction" not in data and default_instruction:
            overrides["instruction"] = default_instruction
        if labels:
            overrides.update(labels=labels, descriptions=())
        return task.with_overrides(**overrides)
    if not labels:
        raise TaskError("give the labels with {labels} a,b,c or a {task} file",
                        names={"labels": "labels", "task": "task_file"})
    if instruction is None and default_instruction:
        overrides["instruction"] = default_instruction
    return Task(labels=labels).with_overrides(**overrides)


def task_file_settings(path: str | Path) -> dict[str, Any]:
    """Engine settings (token_budget, max_rows, device, precision) stored in a task file, if any."""
    data = _read_toml(Path(path))
    return {k: data[k] for k in ("token_budget", "max_rows", "device", "precision") if k in data}


__all__ = ["Task", "Example", "MODES", "build_task", "parse_labels", "DEFAULT_INSTRUCTION", "task_file_settings"]
