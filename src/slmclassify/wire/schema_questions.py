"""A JSON schema whose answer is an object of finite choices, read as questions.

What clients send when a label is asked for with a Pydantic model (openai `.parse()`, instructor,
LangChain's `with_structured_output`, DSPy's `JSONAdapter`) is an object schema whose properties
each have a finite set of answers: an `enum` of strings or integers, a `Literal` (`enum`, or
`const`s under `anyOf`), a `boolean`, `null` beside them (`Optional`), the same through a local
`$ref` (`$defs`, as Pydantic writes an `Enum`), and nested objects of such. That is a task of
several questions (`core/questions.py`): each property is one question, its answers the property's
values, all answered in the item's one pass. A property without a finite set of answers (a free
string, a number, an array) cannot be scored: the schema is refused naming it.

Each value is scored as text: a string as itself, an integer in decimal, `true`/`false` as `yes`
and `no`, `null` as `none`. The JSON around them (braces, quotes, the property names' quoting) is
the answer's format, not the answer, so it is not scored (a string enum gives guided_choice's
answers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import InputError

BOOLEAN_TEXTS = {True: "yes", False: "no"}
NULL_TEXT = "none"
SUPPORTED = ("an enum of strings or integers, a const (Literal), a boolean, null beside those (Optional), anyOf of "
             "those, or a nested object of such properties")


@dataclass(frozen=True)
class SchemaQuestion:
    """One property of the schema with a finite set of answers."""

    path: tuple[str, ...]
    """The property's names from the root object (one name unless objects are nested)."""
    values: tuple
    """Its answers as JSON values, in the schema's order."""
    question: str = ""
    """What is asked, in words: the property's description, or a title of its own (one line)."""

    @property
    def name(self) -> str:
        """The question's name: the property's, after its parents' joined by _ when nested (a
        question name of a task, `core/task.py`: what the system turn asks and the branches say)."""
        return "_".join(self.path)

    @property
    def texts(self) -> tuple[str, ...]:
        """Each value as it is scored."""
        return tuple(value_text(v) for v in self.values)


def value_text(value) -> str:
    if isinstance(value, bool):
        return BOOLEAN_TEXTS[value]
    if value is None:
        return NULL_TEXT
    return str(value)


def schema_questions(schema, where: str) -> tuple[SchemaQuestion, ...]:
    """The questions of an object schema, one per property with a finite answer set, in the schema's
    order (depth first through nested objects). `where` names the schema in errors (e.g.
    "response_format.json_schema.schema"). Raises InputError naming the property that cannot be
    answered by a choice."""
    if not isinstance(schema, dict):
        raise InputError(f"{where} must be a JSON schema object")
    defs = {**(schema.get("definitions") or {}), **(schema.get("$defs") or {})}
    questions = _object(schema, (), where, defs, depth=0)
    if not questions:
        raise InputError(f"{where} has no properties to answer: give an object with at least one property")
    names = [q.name for q in questions]
    for q in questions:
        if names.count(q.name) > 1:
            raise InputError(f"{where}: two properties are both asked as {q.name!r} (a nested property's name is its "
                             "parents' and its own joined by _); rename one")
    return questions


def _object(node: dict, path: tuple[str, ...], where: str, defs: dict, depth: int) -> tuple[SchemaQuestion, ...]:
    properties = node.get("properties")
    if node.get("type", "object") != "object" or not isinstance(properties, dict):
        raise InputError(f"{where} must be an object schema ({{\"type\": \"object\", \"properties\": {{...}}}})")
    out = []
    for name, prop in properties.items():
        at = f"{where}.properties.{name}"
        prop = _resolved(prop, at, defs)
        if prop.get("type") == "object" or "properties" in prop:
            if depth >= 8:
                raise InputError(f"{at}: objects nested over 8 deep are not supported")
            out.extend(_object(prop, (*path, name), at, defs, depth + 1))
            continue
        values = _values(prop, at, defs)
        if len({value_text(v) for v in values}) != len(values):
            raise InputError(f"{at}: two of its values {values} are the same text when scored; give distinct values")
        out.append(SchemaQuestion((*path, name), tuple(values), _question(name, prop)))
    return tuple(out)


def _resolved(node, where: str, defs: dict, seen: tuple = ()) -> dict:
    """`node` with a local `$ref` (`#/$defs/X`, `#/definitions/X`) followed; other keys beside it kept."""
    if not isinstance(node, dict):
        raise InputError(f"{where} must be a JSON schema object, got {json.dumps(node)[:60]}")
    ref = node.get("$ref")
    if ref is None:
        return node
    name = ref.rsplit("/", 1)[-1] if isinstance(ref, str) else None
    if not isinstance(ref, str) or not ref.startswith(("#/$defs/", "#/definitions/")) or name not in defs:
        raise InputError(f"{where}: $ref {ref!r} is not a definition of this schema (#/$defs/NAME)")
    if ref in seen:
        raise InputError(f"{where}: $ref {ref!r} refers to itself; a recursive schema has no finite answer set")
    target = _resolved(defs[name], where, defs, (*seen, ref))
    return {**target, **{k: v for k, v in node.items() if k != "$ref"}}


def _values(prop: dict, where: str, defs: dict) -> list:
    """The finite answers of one property, or InputError saying what is supported."""
    if "const" in prop:
        return [_checked(prop["const"], where)]
    if "enum" in prop:
        enum = prop["enum"]
        if not isinstance(enum, list) or not enum:
            raise InputError(f"{where}: enum must be a non-empty list")
        return _distinct([_checked(v, where) for v in enum], where)
    for key in ("anyOf", "oneOf"):
        if key in prop:
            branches = prop[key]
            if not isinstance(branches, list) or not branches:
                raise InputError(f"{where}: {key} must be a non-empty list of schemas")
            values = []
            for k, branch in enumerate(branches):
                branch = _resolved(branch, f"{where}.{key}[{k}]", defs)
                values.extend(_values(branch, f"{where}.{key}[{k}]", defs))
            return _distinct(values, where)
    kind = prop.get("type")
    if kind == "boolean":
        return [True, False]
    if kind == "null":
        return [None]
    if isinstance(kind, list) and "null" in kind and "boolean" in kind and len(kind) == 2:
        return [True, False, None]
    described = (f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind} without an enum" if isinstance(kind, str) and kind
                 else "a schema without an enum")
    raise InputError(f"{where} is {described}: its answers are not a finite set, so it cannot be scored as a choice. "
                     f"Supported: {SUPPORTED}")


def _checked(value, where: str):
    if value is None or isinstance(value, (str, bool, int)) and not isinstance(value, float):
        if isinstance(value, str) and (not value.strip() or value != value.strip()):
            raise InputError(f"{where}: the value {value!r} is empty or has spaces around it; it cannot be scored")
        return value
    raise InputError(f"{where}: the value {json.dumps(value)[:60]} is not a string, integer, boolean or null")


def _distinct(values: list, where: str) -> list:
    out = []
    for v in values:
        if any(v == u and type(v) is type(u) for u in out):
            raise InputError(f"{where}: the value {json.dumps(v)} is given twice; give each value once")
        out.append(v)
    return out


def _question(name: str, prop: dict) -> str:
    """The property's description, else its title when it says more than the name Pydantic would
    make a title of ("ticket_type" → "Ticket Type"), as one line."""
    text = prop.get("description")
    if not isinstance(text, str) or not text.strip():
        title = prop.get("title")
        text = title if isinstance(title, str) and title != name.replace("_", " ").title() else ""
    return " ".join(text.split())


def answer_object(questions: tuple[SchemaQuestion, ...], picks: list[int]) -> dict:
    """The JSON object of the answers: question q's value `picks[q]`, nested as the schema is."""
    out: dict = {}
    for q, pick in zip(questions, picks):
        node = out
        for name in q.path[:-1]:
            node = node.setdefault(name, {})
        node[q.path[-1]] = q.values[pick]
    return out


__all__ = ["SchemaQuestion", "schema_questions", "answer_object", "value_text", "SUPPORTED"]
