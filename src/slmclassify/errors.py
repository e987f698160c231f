"""The project's error types. Library code raises these; the CLI turns them into one line and exit 2."""


class SlmClassifyError(Exception):
    """Base class: every error a user can cause or fix."""


class TaskError(SlmClassifyError):
    """The task (labels, instruction, examples, templates, options) is invalid."""


class InputError(SlmClassifyError):
    """The input file or one of its rows cannot be read."""


class ModelLoadError(SlmClassifyError):
    """The model or tokenizer cannot be found, loaded or is of an unsupported kind."""


class VerificationError(SlmClassifyError):
    """The fast path disagreed with the per-item reference path."""


class FieldError(TaskError):
    """A settings field holds a bad value. The message names the field by its name in the library
    (`window must be positive, got 0`); the CLI names the flag that set it instead (`--window ...`).

    `template` is a `str.format` template: `{field}` where the field is named, other names for `values`.
    """

    def __init__(self, field: str, template: str, **values) -> None:
        self.field = field
        self.template = template
        self.values = values
        super().__init__(self.naming(field))

    def naming(self, name: str) -> str:
        """The message with the field called `name` (e.g. its command-line flag)."""
        return self.template.format(field=name, **self.values)
