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
