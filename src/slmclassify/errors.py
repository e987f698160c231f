"""The project's error types. Library code raises these; the CLI turns them into one line and exit 2.

A message that names a setting names the library's field (`window must be positive`, `pass
result_prefix`); the CLI names the flag that sets it instead (`--window`, `--result-prefix`). Such a
message is a `str.format` template whose `names` map each placeholder to the field it stands for.
"""

from __future__ import annotations

from typing import Callable


class SlmClassifyError(Exception):
    """Base class: every error a user can cause or fix."""

    def __init__(self, message: str = "", *, names: dict[str, str] | None = None, **values) -> None:
        """`message`, or with `names` a template: `{key}` for each field in `names` ({key: field}),
        other `{...}` for `values` (filled in once, so braces in a value are kept as they are)."""
        self.template = message if names else None
        self.names = dict(names or {})
        self.values = values
        super().__init__(message if self.template is None else self.naming(lambda field: field))

    def naming(self, name_of: Callable[[str], str]) -> str:
        """The message with each field called `name_of(field)` (e.g. its command-line flag)."""
        if self.template is None:
            return str(self)
        return self.template.format(**{key: name_of(field) for key, field in self.names.items()}, **self.values)

    def renamed(self, name_of: Callable[[str], str]) -> SlmClassifyError:
        """The same error with each field called `name_of(field)`: a plain error of the same kind
        (its nearest class of this module: a Ray wrapper of it, or a FieldError, are not rebuilt)."""
        return _plain(type(self), self.naming(name_of))


def _plain(kind: type, message: str) -> SlmClassifyError:
    """An error of `kind`'s nearest class defined here (a FieldError: a TaskError) saying `message`."""
    kind = next(k for k in kind.__mro__ if k.__module__ == __name__ and k is not FieldError)
    return kind(message)


class TaskError(SlmClassifyError):
    """The task (labels, instruction, examples, templates, options) is invalid."""


class InputError(SlmClassifyError):
    """The input file or one of its rows cannot be read."""


class ModelLoadError(SlmClassifyError):
    """The model or tokenizer cannot be found, loaded or is of an unsupported kind."""


class VerificationError(SlmClassifyError):
    """The fast path disagreed with the per-item reference path."""


class FieldError(TaskError):
    """A settings field holds a bad value; `field` names it. The template names it as `{field}`:
    `FieldError("window", "{field} must be positive, got {value}", value=0)` says "window must be
    positive, got 0"; the CLI says "--window must be positive, got 0"."""

    def __init__(self, field: str, template: str, **values) -> None:
        self.field = field
        super().__init__(template, names={"field": field}, **values)

    def __reduce__(self):  # pickled (Ray sends errors between processes) with its template
        return (_field_error, (self.field, self.template, self.values))


def _field_error(field: str, template: str, values: dict) -> FieldError:
    return FieldError(field, template, **values)
