"""Exports of a team-labelling round that people open without our code (the CSV is
`outputs.write_gold`):

    write_parquet       a Parquet file `datasets.load_dataset("parquet", data_files=PATH)` reads with
                        the gold, every annotator's answer and the reviewer's as `ClassLabel` features
    write_label_studio  a Label Studio import file (a JSON list of tasks with their annotations), and
    label_studio_config the labelling config that matches it, to paste into the project's settings

Both writers take plain data (`LabelledItem`s, the label names, the annotators), not the session, so
they can be tested alone. Each checks every item before it writes a byte (and refuses no items at
all: neither `datasets` nor Label Studio reads an empty file), writes atomically (`PATH.partial`,
renamed when complete) and returns the number of items written, in input-row order.

Parquet: the Hugging Face features live in the schema metadata key `huggingface`, as `datasets`
itself writes it: `{"info": {"features": Features.to_dict()}}`, each feature a dict with its `_type`
(`{"dtype": "int64", "_type": "Value"}`, `{"names": [...], "_type": "ClassLabel"}`). A ClassLabel
column holds the label's index in `labels`, -1 where there is none (no gold: a tie nobody resolved;
an annotator who did not answer; no review). This module builds that JSON itself, so it does not
import `datasets`; the tests check it equals what `datasets` builds.

Label Studio (https://labelstud.io/guide/tasks.html#Basic-Label-Studio-JSON-format, the annotation
fields of https://labelstud.io/guide/task_format.html, and the importer that reads them,
`label_studio/tasks/serializers.py`): each task is

    {"data": {TEXT_COLUMN: text, "row": row, other columns...},
     "annotations": [{"result": [{"from_name": FROM_NAME, "to_name": TO_NAME, "type": "choices",
                                  "value": {"choices": [label]}}],
                      "ground_truth": false, "was_cancelled": false,
                      "completed_by": {"email": EMAIL}},            one per annotator's answer,
                     {..., "ground_truth": true, ...}],             then the reviewer's, if any
     "meta": {"annotated_by": [name per annotation], "reviewer": name or null, "gold": label or null}}

The reviewer's answer is the one annotation with `"ground_truth": true` (Label Studio's mark for a
task's reference annotation); the importer takes a missing `ground_truth` as true, so the annotators'
say false. The importer takes `completed_by` as a member's user id or `{"email": ...}` of a member of
the organisation (an unknown email is refused unless the server allows it), and assigns an
annotation without one to the user who imports; a name is not accepted. So an annotation has
`completed_by` only where the annotator's email is known (`emails`, or a name that is an email), and
the task's `meta` keeps who gave each annotation, in order, either way.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from xml.etree import ElementTree

from ..errors import FieldError, InputError, TaskError
from ..io.writers import atomic_output

NO_LABEL = -1
"""A ClassLabel column's value where there is no label (the `datasets` convention)."""


@dataclasses.dataclass(frozen=True)
class LabelledItem:
    """One item of a team-labelling round, as the exports write it."""

    row: int
    """The input row (0-based)."""
    text: str
    """The text the annotators read."""
    answers: dict[str, str]
    """Annotator name → the label they gave, in answer order."""
    reviewer: str | None
    """Who adjudicated, if anyone."""
    reviewed: str | None
    """The reviewer's label, if anyone reviewed."""
    gold: str | None
    """The consensus: the reviewer's label, else the majority; None for a tie nobody resolved."""
    extra: dict = dataclasses.field(default_factory=dict)
    """The input row's other columns to keep (column → a JSON-able value)."""


# --- Parquet, for `datasets` ----------------------------------------------------------------------

def write_parquet(items: Iterable[LabelledItem], labels: Sequence[str], annotators: Sequence[str],
                  path: str | Path, *, text_column: str = "text") -> int:
    """Write `items` to the Parquet file `path`, in input-row order, with the columns

        row, TEXT_COLUMN, label (ClassLabel: the gold, -1 for none), label_name (null for none),
        answer_NAME per annotator (ClassLabel, -1 where they did not answer), reviewer (null for
        none), reviewed (ClassLabel, -1 for none), n_answers, then the items' extra columns

    and the `huggingface` schema metadata that makes `datasets` read the ClassLabel columns as such.
    An extra column of one JSON type keeps it (ints with floats: float64); one that mixes types or
    holds lists or objects is stored as JSON text. Returns the number of rows written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    own = (text_column, *_OWN_COLUMNS, *(f"answer_{name}" for name in annotators))
    items = _checked(items, labels, annotators, own)
    index = {label: k for k, label in enumerate(labels)}
    columns: dict[str, tuple[list, object, dict]] = {}  # name → (values, arrow type, feature)

    def add_value(name: str, values: list, kind: str) -> None:
        columns[name] = (values, pa.type_for_alias(kind), {"dtype": kind, "_type": "Value"})

    def add_class_label(name: str, values: list) -> None:
        columns[name] = ([NO_LABEL if v is None else index[v] for v in values], pa.int64(),
                         {"names": list(labels), "_type": "ClassLabel"})

    add_value("row", [it.row for it in items], "int64")
    add_value(text_column, [it.text for it in items], "string")
    add_class_label("label", [it.gold for it in items])
    add_value("label_name", [it.gold for it in items], "string")
    for name in annotators:
        add_class_label(f"answer_{name}", [it.answers.get(name) for it in items])
    add_value("reviewer", [it.reviewer for it in items], "string")
    add_class_label("reviewed", [it.reviewed for it in items])
    add_value("n_answers", [len(it.answers) for it in items], "int64")
    for name in _extra_columns(items):
        add_value(name, *_extra_values([it.extra.get(name) for it in items], name))

    features = {name: feature for name, (_, _, feature) in columns.items()}
    schema = pa.schema([pa.field(name, kind) for name, (_, kind, _) in columns.items()],
                       metadata={"huggingface": json.dumps({"info": {"features": features}})})
    table = pa.Table.from_arrays([pa.array(values, type=kind) for values, kind, _ in columns.values()],
                                 schema=schema)
    with atomic_output(str(path)) as fh:
        pq.write_table(table, fh)
    return len(items)


_ARROW_KINDS = {"int64": "int64", "double": "float64", "bool": "bool", "string": "string", "null": "string"}
"""The Arrow type pyarrow infers for an extra column → the type it is written as (only nulls: string)."""


def _extra_values(values: list, name: str) -> tuple[list, str]:
    """An extra column's values and type: its one JSON type, else its values as JSON text."""
    import pyarrow as pa

    try:
        kind = _ARROW_KINDS.get(str(pa.array(values).type))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        kind = None
    if kind is not None:
        return values, kind
    return [v if v is None or isinstance(v, str) else _json(v, f"column {name!r}") for v in values], "string"


# --- Label Studio -----------------------------------------------------------------------------------

def write_label_studio(items: Iterable[LabelledItem], labels: Sequence[str], path: str | Path, *,
                       text_column: str = "text", from_name: str = "label", to_name: str = "text",
                       emails: Mapping[str, str] | None = None) -> int:
    """Write `items` as a Label Studio import file (the module docstring shows a task), in input-row
    order: one annotation per annotator's answer, then the reviewer's with `"ground_truth": true`.
    `emails`: annotator or reviewer name → their Label Studio account's email, for `completed_by`
    (a name that is itself an email needs none); `from_name`/`to_name`: the Choices and Text tags'
    names in the project's config (`label_studio_config`). Returns the number of tasks written."""
    _check_tag_names(text_column, from_name, to_name)
    items = _checked(items, labels, None, (text_column, "row"))
    emails = dict(emails or {})

    def annotation(name: str | None, label: str, ground_truth: bool) -> dict:
        out = {"result": [{"from_name": from_name, "to_name": to_name, "type": "choices",
                           "value": {"choices": [label]}}],
               "ground_truth": ground_truth, "was_cancelled": False}
        email = emails.get(name) or (name if name and "@" in name else None)
        if email is not None:
            out["completed_by"] = {"email": email}
        return out

    tasks = []
    for it in items:
        annotations = [annotation(name, label, False) for name, label in it.answers.items()]
        by = list(it.answers)
        if it.reviewed is not None:
            annotations.append(annotation(it.reviewer, it.reviewed, True))
            by.append(it.reviewer)
        task = {"data": {text_column: it.text, "row": it.row, **it.extra}, "annotations": annotations,
                "meta": {"annotated_by": by, "reviewer": it.reviewer, "gold": it.gold}}
        tasks.append(_json(task, f"row {it.row}", indent=1))  # one at a time, to name the row that fails
    with atomic_output(str(path)) as fh:
        fh.write(("[\n" + ",\n".join(tasks) + "\n]\n").encode("utf-8"))
    return len(items)


def label_studio_config(labels: Sequence[str], *, text_column: str = "text", from_name: str = "label",
                        to_name: str = "text") -> str:
    """The Label Studio labelling config that `write_label_studio`'s tasks fit (same arguments):

        <View><Text name="text" value="$text"/><Choices name="label" toName="text" choice="single">
        <Choice value="LABEL"/>... </Choices></View>

    built as a tree, so labels with quotes, `&` or `<` come out escaped."""
    _check_tag_names(text_column, from_name, to_name)
    _check_labels(labels)
    view = ElementTree.Element("View")
    ElementTree.SubElement(view, "Text", name=to_name, value=f"${text_column}")
    choices = ElementTree.SubElement(view, "Choices", name=from_name, toName=to_name, choice="single")
    for label in labels:
        ElementTree.SubElement(choices, "Choice", value=label)
    ElementTree.indent(view)
    return ElementTree.tostring(view, encoding="unicode") + "\n"


_VARIABLE = re.compile(r"\w+")


def _check_tag_names(text_column: str, from_name: str, to_name: str) -> None:
    """Label Studio finds a task's text by `$TEXT_COLUMN` in the config: a word, or the text is not found."""
    if not _VARIABLE.fullmatch(text_column):
        raise FieldError("text_column", "{field} must be letters, digits or _ for Label Studio's $variable, "
                         "got {value!r}", value=text_column)
    for field, name in (("from_name", from_name), ("to_name", to_name)):
        if not name:
            raise FieldError(field, "{field} must name a tag of the labelling config")


# --- checks -----------------------------------------------------------------------------------------

_OWN_COLUMNS = ("row", "label", "label_name", "reviewer", "reviewed", "n_answers")
"""The Parquet columns the export itself writes (with the text column and `answer_NAME`)."""


def _checked(items: Iterable[LabelledItem], labels: Sequence[str], annotators: Sequence[str] | None,
             own_columns: Sequence[str]) -> list[LabelledItem]:
    """The items in input-row order, once each is known to fit: every label one of `labels`, every
    answer by one of `annotators` (None: anyone), rows unique, no extra column named like one of
    `own_columns` (the export's own)."""
    _check_labels(labels)
    items = sorted(items, key=lambda it: it.row)
    if not items:
        # neither reads an empty file: `datasets` finds no data, Label Studio refuses an empty list
        raise InputError("nothing to export: no items were given")
    known = set(labels)
    if annotators is not None and len(set(annotators)) != len(annotators):
        raise TaskError(f"an annotator is named twice in {list(annotators)}")
    own = set(own_columns)
    if len(own) != len(own_columns):
        raise TaskError(f"the export's columns would repeat a name: {list(own_columns)}; rename the text "
                        f"column or the annotator")
    for before, it in zip([None, *items], items):
        if before is not None and before.row == it.row:
            raise InputError(f"row {it.row} is given twice")
        given = [(f"{name} gave", label) for name, label in it.answers.items()]
        for what, label in [*given, ("the reviewer gave", it.reviewed), ("the gold is", it.gold)]:
            if label is not None and label not in known:
                raise TaskError(f"row {it.row}: {what} {label!r}, which is not a label ({', '.join(labels)})")
        if annotators is not None:
            stranger = next((a for a in it.answers if a not in annotators), None)
            if stranger is not None:
                raise TaskError(f"row {it.row}: {stranger!r} answered but is not one of the annotators "
                                f"({', '.join(annotators)})")
        clash = sorted(own & set(it.extra))
        if clash:
            raise InputError(f"row {it.row}: the input column {clash[0]!r} has the name of a column the export "
                             f"writes; rename it, or leave it out of the kept columns")
    return items


def _check_labels(labels: Sequence[str]) -> None:
    if not labels:
        raise TaskError("an export needs the task's labels; none were given")
    if len(set(labels)) != len(labels):
        raise TaskError(f"a label is named twice in {list(labels)}")


def _extra_columns(items: list[LabelledItem]) -> list[str]:
    """The extra columns, in the order they first appear."""
    return list(dict.fromkeys(name for it in items for name in it.extra))


def _json(value, where: str, indent: int | None = None) -> str:
    """`value` as JSON text (UTF-8 kept as is); a value JSON cannot hold (NaN, an object) is refused."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=indent)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{where}: {exc}; keep only JSON values (text, numbers, true/false, null, "
                         f"lists, objects) in the exported columns") from None
