"""What to classify into: labels, instruction, examples and prompt overrides.

A `Task` is validated once, when it is built, so everything downstream may trust it.
It comes from CLI flags or a task file's data (`Task.from_dict`); `merge_task` merges the two
(flags win) from plain values and tuples, so library code never goes through the CLI's strings.
Nothing here reads the file: `io.task_files` does, and `jobs.sources` puts the two together.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import Any

from ..errors import FieldError, TaskError
from .readout import ONE_LABEL, SEVERAL_LABELS, Readout, of_flag

_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DEFAULT_INSTRUCTION = ONE_LABEL.instruction
MULTI_LABEL_INSTRUCTION = SEVERAL_LABELS.instruction
QUESTIONS_INSTRUCTION = "You answer several questions about each short text."
MODES = ("auto", "first", "full", "full-mean")


@lru_cache(maxsize=64)
def parse_template(template: str) -> tuple[tuple[str, str], ...]:
    """A user template's parts, in order: ("text", literal) or ("field", name). `{name}` (letters,
    digits and _, not starting with a digit) is a field; `{{` and `}}` are literal braces; any other
    brace (`{0}`, `{subject.__class__}`, an unclosed `{subject`, a lone `}`) is a FieldError naming it
    and where it is. The one reader of templates: `Task.fields`, `compose` and `user_turn` use it."""
    parts: list[tuple[str, str]] = []
    literal: list[str] = []
    i = 0
    while i < len(template):
        char = template[i]
        if char in "{}" and template[i:i + 2] in ("{{", "}}"):
            literal.append(char)
            i += 2
        elif char == "}":
            raise _bad_placeholder(template, "}", i, "a lone }")
        elif char == "{":
            end = template.find("}", i + 1)
            opened = template.find("{", i + 1)
            if end < 0 or 0 <= opened < end:
                shown = template[i:end + 1] if end >= 0 else template[i:i + 30]
                raise _bad_placeholder(template, shown, i, "it is never closed")
            name = template[i + 1:end]
            if not _FIELD_NAME.fullmatch(name):
                raise _bad_placeholder(template, template[i:end + 1], i, "a field is named by letters, digits and _")
            if literal:
                parts.append(("text", "".join(literal)))
                literal = []
            parts.append(("field", name))
            i = end + 1
        else:
            literal.append(char)
            i += 1
    if literal:
        parts.append(("text", "".join(literal)))
    return tuple(parts)


def _bad_placeholder(template: str, shown: str, at: int, why: str) -> FieldError:
    return FieldError("user_template", "{field} has a malformed placeholder {shown!r} at character {at} ({why}): "
                      "write a field as {{name}}, and a literal brace as {{{{ or }}}}; got {value!r}",
                      shown=shown, at=at + 1, why=why, value=template)


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
    label_examples: tuple[tuple[str, ...], ...] = ()
    """Optional example texts per label for the people labelling (the page's guidelines); never in
    the prompt, so they change no score (empty: none)."""
    instruction: str = DEFAULT_INSTRUCTION
    """The first line of the system turn."""
    examples: tuple[Example, ...] = ()
    """Few-shot examples, rendered as earlier user/assistant turns (they live in the cached prefix)."""
    system: str | None = None
    """Replaces the whole system turn (instruction and label list) when set."""
    user_template: str = "{text}"
    """Wraps each item in the last user turn: `{text}` once (the input's text column), or named
    fields, e.g. `Subject: {subject}\n\n{body}`, each an input column (`fields`, `compose`)."""
    min_confidence: float = 0.5
    """Items whose top probability is below this get `needs_review = true`."""
    mode: str = "auto"
    """Label scoring: auto, first (first token), full (sum of log-probs), full-mean (per-token mean)."""
    calibrate: bool = True
    """Remove each label's prior, estimated from content-free inputs (contextual calibration)."""
    temperature: float = 1.0
    """Divide label scores by this before the softmax (fitted by `evaluate --fit-temperature`)."""
    multi_label: bool = False
    """Several labels per item: each label is a yes/no question, all answered in one pass
    (`multilabel.py`); the result's labels are those whose P(yes) reaches their threshold."""
    thresholds: tuple[float, ...] = ()
    """Multi-label: P(yes) at or above which each label is chosen, one per label (empty: 0.5 each;
    written by `evaluate`)."""
    label_separator: str = ";"
    """Multi-label: what joins the chosen labels in the output's `labels` column (and splits a gold column)."""
    questions: tuple[Question, ...] = ()
    """Several questions about each item, answered in its one pass (`core/questions.py`): then the
    task's own `labels` are empty and each question holds its labels and settings (calibrate
    included: the task's own `calibrate` becomes whether any question is calibrated)."""

    def __post_init__(self) -> None:
        for name in ("labels", "descriptions", "examples", "thresholds", "questions"):
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
        object.__setattr__(self, "label_examples", tuple(tuple(str(t) for t in texts) for texts in self.label_examples))
        object.__setattr__(self, "examples", tuple(self.examples))
        object.__setattr__(self, "thresholds", tuple(float(t) for t in self.thresholds))
        object.__setattr__(self, "questions", tuple(self.questions))
        if self.instruction == DEFAULT_INSTRUCTION:  # "exactly one category" would mislead a multi-label task
            object.__setattr__(self, "instruction", self.readout.instruction)
        if self.questions:
            self._check_questions()
            return
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
        if self.label_examples and len(self.label_examples) != len(labels):
            raise TaskError(f"example texts for {len(self.label_examples)} labels, the task has {len(labels)}; give "
                            "one list per label (empty for none)")
        for ex in self.examples:
            if ex.label not in seen:
                raise TaskError(f"example {ex.text[:40]!r} has label {ex.label!r}, which is not in the label set")
        names = list(self.fields)  # parsing refuses a malformed placeholder
        if not names or any(names.count(n) > 1 for n in names):
            raise FieldError("user_template", "{field} must name the item once: '{{text}}' exactly once, or each "
                             "field once (e.g. 'Subject: {{subject}}\\n\\n{{body}}'), got {value!r}",
                             value=self.user_template)
        if not 0.0 <= self.min_confidence <= 1.0:
            raise FieldError("min_confidence", "{field} must be between 0 and 1, got {value}",
                             value=self.min_confidence)
        if not self.temperature > 0:
            raise TaskError(f"temperature must be positive, got {self.temperature}")
        if self.mode not in MODES:
            raise FieldError("mode", "{field} must be one of {choices}, got {value!r}",
                             choices=', '.join(MODES), value=self.mode)
        self.readout.check(self)  # what its kind of answer needs of the task

    def _check_questions(self) -> None:
        """A task of several questions: each is a `Question` with its own labels; the task's own
        label settings must be left unset (they belong in each `[[questions]]` table)."""
        for q in self.questions:
            if not isinstance(q, Question):
                raise TaskError(f"questions must be Question objects, e.g. Question('priority', "
                                f"Task(labels=('low', 'urgent'))); got {q!r}")
        set_here = [name for name, value in (("labels", self.labels), ("descriptions", self.descriptions),
                                             ("thresholds", self.thresholds), ("examples", self.examples),
                                             ("multi_label", self.multi_label)) if value]
        if set_here:
            raise TaskError(f"a task with questions sets {set_here[0]} in each question ([[questions]] in a task "
                            f"file), not for the whole task")
        if self.mode not in ("auto", "full"):
            raise FieldError("mode", "a task with questions scores each answer in full after its question's name, "
                             "which needs {field} full or auto, got {value!r}", value=self.mode)
        seen: set[str] = set()
        for q in self.questions:
            if q.name in seen:
                raise TaskError(f"question {q.name!r} is asked twice; give each question its own name")
            seen.add(q.name)
        if self.instruction == DEFAULT_INSTRUCTION:  # "exactly one category" would mislead
            object.__setattr__(self, "instruction", QUESTIONS_INSTRUCTION)
        # the content-free passes run when any question is calibrated (`questions.prior`)
        object.__setattr__(self, "calibrate", any(q.task.calibrate for q in self.questions))
        list(self.fields)  # a malformed template is refused here as in a task of one question

    @property
    def readout(self) -> Readout:
        """How its answers are read (`core/readout.py`): one label, or every label that applies."""
        return of_flag(self.multi_label)

    @property
    def asked(self) -> tuple[Question, ...]:
        """What each item is asked, in order: the task's questions, or for a task of labels one
        unnamed question that is the task itself (`Question.whole`). Scoring, calibration and
        results go through these, so a task of labels is a task of one question."""
        return self.questions or (Question.whole(self),)

    def shaped(self, of_labels, of_questions):
        """`of_labels(self)` for a task of labels, `of_questions(self)` for a task of questions: the one
        test of a task's shape, for the formats that spell the two apart (a label store's answers,
        which keep a task of labels' bare label so that old stores read on; a head file's; a report's
        layout). Scoring and results do not ask: they go through `asked`."""
        return of_questions(self) if self.questions else of_labels(self)

    @property
    def first_tokens_matter(self) -> bool:
        """Whether a label's first token may stand for it (one label of a task of labels, whose mode may
        be `first`): where the label list warns of first tokens that mislead (`describe_labels`)."""
        return not (self.multi_label or self.questions)

    @property
    def scoring_mode(self) -> str:
        """The label trie's mode: the task's own for one label; several labels and several questions
        score each branch whole after its name (`full`)."""
        return "full" if self.questions else self.readout.requested_mode(self.mode)

    def mode_reason(self, resolved: str) -> str:
        """Why the branches are scored as they are, from the trie's own reason (`resolve_mode`)."""
        if not self.questions:
            return self.readout.mode_reason(resolved)
        return (f"{len(self.questions)} questions: each question's answers after its name, full sequences"
                + ("; end-of-turn appended" if "end-of-turn" in resolved else ""))

    @property
    def label_thresholds(self) -> tuple[float, ...]:
        """Multi-label: each label's threshold (0.5 where none is set)."""
        return self.thresholds or (0.5,) * len(self.labels)

    @property
    def result_column(self) -> str:
        """The output column of the predicted label(s): `labels` for a multi-label task, else `label`."""
        return self.readout.column(None)

    def system_turn(self) -> str:
        """The system message: the override, or the instruction plus the label list (a task of
        questions: every question, its labels and how to answer it)."""
        if self.system is not None:
            return self.system
        if not self.questions:
            return f"{self.instruction}\n" + self.readout.rule(self)
        first = self.questions[0]
        return (f"{self.instruction}\nAnswer each question with its name, a colon and your answer "
                f"(e.g. \"{first.readout.example(first.name, first.labels)}\"). The questions:\n"
                + "\n".join(q.describe() for q in self.questions))

    def listing(self, calibrated: bool) -> dict:
        """What a list of tasks shows of what it asks (the service's /v1/tasks): a task of labels its
        labels, minimum confidence and kind; a task of questions each question's, with whether it is
        calibrated (`calibrated`: the task's content-free passes ran)."""
        if not self.questions:
            return {"labels": list(self.labels), "min_confidence": self.min_confidence, "multi_label": self.multi_label}
        return {"questions": [{"name": q.name, "question": q.question, "labels": list(q.labels),
                               "multi_label": q.multi_label, "min_confidence": q.task.min_confidence,
                               "calibrated": calibrated and q.task.calibrate} for q in self.questions]}

    def _label_list(self, indent: str = "") -> str:
        """One `- label: description` line per label (`- label` where it has none)."""
        descriptions = self.descriptions or ("",) * len(self.labels)
        return "\n".join(f"{indent}- {label}: {desc}" if desc else f"{indent}- {label}"
                         for label, desc in zip(self.labels, descriptions))

    @property
    def fields(self) -> tuple[str, ...]:
        """The input columns the template names: ('text',) for the classic `{text}` (the input's text
        column, whatever its name), else each `{name}` in order (columns of that name)."""
        return tuple(value for kind, value in parse_template(self.user_template) if kind == "field")

    @property
    def multi_field(self) -> bool:
        """Whether items are records of several (or other) named fields rather than one text."""
        return self.fields != ("text",)

    def compose(self, record) -> str:
        """A multi-field item's user turn from its fields ({name: text}); "" (an empty item) when
        every field is empty. A missing field is a KeyError naming it."""
        values = {name: record[name] for name in self.fields}
        values = {name: "" if v is None else v for name, v in values.items()}
        if not any(str(v).strip() for v in values.values()):
            return ""
        return self._filled(values)

    def _filled(self, values: dict) -> str:
        """The template with each field's value (one pass: a value holding "{body}" stays as it is)."""
        return "".join(str(values[value]) if kind == "field" else value
                       for kind, value in parse_template(self.user_template))

    def user_turn(self, text: str) -> str:
        """The user message for one item (a multi-field item is composed already: `compose`)."""
        if self.multi_field:
            return text
        return self._filled({"text": text})

    def with_overrides(self, **overrides: Any) -> Task:
        """A copy with the given fields replaced; `None` values are ignored."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "task") -> Task:
        _check_keys(data, _TOP_LEVEL, source, "")
        for key, kind in _TYPES.items():
            if key in data and (not isinstance(data[key], kind) or (kind is not bool and isinstance(data[key], bool))):
                raise TaskError(f"{source}: {key!r} must be {_KIND_NAMES[kind]}, got {data[key]!r}")
        if "questions" in data:
            return cls._from_questions(data, source)
        raw_labels = data.get("labels")
        if not isinstance(raw_labels, list):
            raise TaskError(f"{source}: 'labels' must be a list of names or of {{name, description}} tables")
        labels, descriptions, label_examples = [], [], []
        for item in raw_labels:
            if isinstance(item, dict):
                _check_keys(item, ("name", "description", "examples"), source, "label table ")
                if "name" not in item:
                    raise TaskError(f"{source}: a label table needs a 'name': {item}")
                shown = item.get("examples", [])
                if not isinstance(shown, list) or not all(isinstance(t, str) for t in shown):
                    raise TaskError(f"{source}: label {item['name']!r}: 'examples' must be a list of texts (shown to "
                                    f"the people labelling), got {shown!r}")
                labels.append(str(item["name"]))
                descriptions.append(str(item.get("description", "")))
                label_examples.append(tuple(shown))
            else:
                labels.append(str(item))
                descriptions.append("")
                label_examples.append(())
        examples = []
        for ex in data.get("examples", []):
            if not isinstance(ex, dict) or "text" not in ex or "label" not in ex:
                raise TaskError(f"{source}: each example needs 'text' and 'label': {ex}")
            _check_keys(ex, ("text", "label"), source, "example ")
            examples.append(Example(str(ex["text"]), str(ex["label"])))
        kwargs = {k: v for k, v in data.items() if k in {f.name for f in fields(cls)} - {"descriptions"}}
        for t in data.get("thresholds", []):
            if isinstance(t, bool) or not isinstance(t, (int, float)):
                raise TaskError(f"{source}: 'thresholds' must be a list of numbers, got {data['thresholds']!r}")
        kwargs.update(
            labels=tuple(labels),
            descriptions=tuple(descriptions) if any(descriptions) else (),
            label_examples=tuple(label_examples) if any(label_examples) else (),
            examples=tuple(examples),
        )
        return cls(**kwargs)

    @classmethod
    def _from_questions(cls, data: dict[str, Any], source: str) -> Task:
        raw = data["questions"]
        if not isinstance(raw, list) or not raw:
            raise TaskError(f"{source}: 'questions' must be one or more [[questions]] tables, each with a name and "
                            "labels")
        if "labels" in data:
            raise TaskError(f"{source}: a task with [[questions]] lists the labels in each question, not at the top")
        questions = tuple(Question.from_dict(q, data, source, k) for k, q in enumerate(raw, start=1))
        kwargs = {k: v for k, v in data.items() if k in {f.name for f in fields(cls)} - {"questions", "labels"}}
        return cls(labels=(), questions=questions, **kwargs)


@dataclass(frozen=True)
class Question:
    """One question of a task of several (`Task.questions`), answered in the item's one pass.

    `name` is the output's column (`NAME`, `NAME_confidence`, `p_NAME_LABEL`, ...) and the answer's
    cue: the question's answers are scored as `name: label` (a multi-label question's as
    `name: label: yes|no`) right after the generation prompt, so the name's tokens are fed once for
    all its labels. `task` holds the question's labels and how they are scored and read: descriptions,
    multi_label, thresholds, min_confidence, calibrate, temperature, label_separator."""

    name: str | None
    """None only for the unnamed question of a task of labels (`whole`)."""
    task: Task
    question: str = ""
    """What is asked, in words (e.g. "How urgent is it?"), shown beside the name in the system turn."""

    @classmethod
    def whole(cls, task: Task) -> Question:
        """The one unnamed question a task of labels asks: its answers are the task's own columns
        (`label`, `confidence`, `p_LABEL`) and its branches the labels with no name before them."""
        question = object.__new__(cls)
        for name, value in (("name", None), ("task", task), ("question", "")):
            object.__setattr__(question, name, value)
        return question

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _FIELD_NAME.fullmatch(self.name):
            raise TaskError(f"question name {self.name!r} must be letters, digits and _ (not starting with a "
                            "digit): it names the output's columns, e.g. name = \"priority\"")
        if not isinstance(self.task, Task) or self.task.questions:
            raise TaskError(f"question {self.name!r}: its task must be a Task of labels, e.g. "
                            "Task(labels=('low', 'urgent'))")
        if self.task.examples:
            raise TaskError(f"question {self.name!r}: examples are not supported in a task with questions yet")
        if not isinstance(self.question, str) or "\n" in self.question:
            raise TaskError(f"question {self.name!r}: 'question' must be one line of text, got {self.question!r}")

    @property
    def labels(self) -> tuple[str, ...]:
        return self.task.labels

    @property
    def multi_label(self) -> bool:
        return self.task.multi_label

    @property
    def readout(self) -> Readout:
        return self.task.readout

    @property
    def result_column(self) -> str:
        """The column of its answer: `NAME`, or `NAME_labels` for a multi-label question (the
        unnamed question's: `label` or `labels`)."""
        return self.readout.column(self.name)

    def branches(self) -> tuple[str, ...]:
        """Its scored answers, as they follow the generation prompt: `name: label` per label, or
        `name: label: yes` and `name: label: no` per label of a multi-label question (the unnamed
        question's without `name: `)."""
        own = self.readout.branches(self.labels)
        return own if self.name is None else tuple(f"{self.name}: {b}" for b in own)

    def describe(self) -> str:
        """Its lines of the system turn: the name, the question, and its labels and how to answer."""
        return f"- {self.name}: {self.question + ' ' if self.question else ''}" + self.readout.rule(self.task, self.name)

    @classmethod
    def from_dict(cls, data: Any, defaults: dict[str, Any], source: str, number: int) -> Question:
        """A `[[questions]]` table; the task's own min_confidence, calibrate, temperature and
        label_separator are the defaults of the question's."""
        where = f"{source}: question {number}"
        if not isinstance(data, dict):
            raise TaskError(f"{where} must be a table with a name and labels ([[questions]]), got {data!r}")
        _check_keys(data, _QUESTION_KEYS, source, f"question {number} ")
        if "name" not in data or "labels" not in data:
            raise TaskError(f"{where} needs a 'name' and 'labels'")
        inner = {k: v for k, v in data.items() if k not in ("name", "question")}
        for key in _INHERITED:
            if key in defaults and key not in inner:
                inner[key] = defaults[key]
        try:
            task = Task.from_dict(inner, source=f"{where} ({data['name']!r})")
        except FieldError as exc:
            raise TaskError(f"{where} ({data['name']!r}): {exc}") from None
        return cls(name=str(data["name"]), task=task, question=str(data.get("question", "")))


_QUESTION_KEYS = ("name", "question", "labels", "multi_label", "thresholds", "min_confidence", "calibrate",
                  "temperature", "label_separator")
_INHERITED = ("min_confidence", "calibrate", "temperature", "label_separator")
"""The task's keys that are the default of each question's."""

_TOP_LEVEL = ("labels", "questions", "instruction", "examples", "system", "user_template", "min_confidence", "mode",
              "calibrate", "temperature", "multi_label", "thresholds", "label_separator", "token_budget", "max_rows",
              "device", "precision", "head")
_TYPES = {"instruction": str, "system": str, "user_template": str, "mode": str, "calibrate": bool,
          "multi_label": bool, "thresholds": list, "label_separator": str,
          "min_confidence": (int, float), "temperature": (int, float), "token_budget": int, "max_rows": int,
          "device": str, "precision": str, "questions": list,
          "head": str}  # head: a head file for classify/evaluate (`head/apply.py`), not part of the Task
_KIND_NAMES = {str: "a string", int: "an integer", (int, float): "a number", bool: "true or false",
               list: "a list"}


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


def merge_task(task_data: dict[str, Any] | None = None, labels: tuple[str, ...] | None = None, *,
               source: str = "task", instruction: str | None = None, system: str | None = None,
               user_template: str | None = None, mode: str | None = None, min_confidence: float | None = None,
               calibrate: bool | None = None, multi_label: bool | None = None,
               default_instruction: str | None = None) -> Task:
    """The task from a task file's data (`source`: its name in errors) and/or explicit values; given
    values (not None) win.

    `labels` replaces the file's labels (and drops its descriptions). `default_instruction` is
    used when neither the file nor `instruction` gives one (e.g. a BIG-bench task's own question).
    """
    overrides = dict(instruction=instruction, system=system, mode=mode, min_confidence=min_confidence,
                     user_template=user_template, calibrate=calibrate, multi_label=multi_label)
    if labels is not None:
        labels = tuple(labels)
    if task_data is not None:
        task = Task.from_dict(task_data, source=source)
        if instruction is None and "instruction" not in task_data and default_instruction:
            overrides["instruction"] = default_instruction
        if labels:
            overrides.update(labels=labels, descriptions=(), thresholds=())
        inner = {k: v for k, v in (("min_confidence", min_confidence), ("calibrate", calibrate)) if v is not None}
        if inner:  # the whole task's options apply to every question (a task of labels has none)
            overrides["questions"] = tuple(replace(q, task=q.task.with_overrides(**inner)) for q in task.questions)
        return task.with_overrides(**overrides)
    if not labels:
        raise TaskError("give the labels with {labels} a,b,c or a {task} file",
                        names={"labels": "labels", "task": "task_file"})
    if instruction is None and default_instruction:
        overrides["instruction"] = default_instruction
    return Task(labels=labels).with_overrides(**overrides)


ENGINE_KEYS = ("token_budget", "max_rows", "device", "precision")
"""The task file's keys that are engine settings, not part of the Task."""


def task_engine_settings(task_data: dict[str, Any]) -> dict[str, Any]:
    """The engine settings (`ENGINE_KEYS`) a task file's data holds, if any."""
    return {k: task_data[k] for k in ENGINE_KEYS if k in task_data}


__all__ = ["Task", "Example", "Question", "QUESTIONS_INSTRUCTION", "MODES", "merge_task", "parse_labels", "DEFAULT_INSTRUCTION", "MULTI_LABEL_INSTRUCTION",
           "task_engine_settings"]
