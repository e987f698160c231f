"""slmclassify: label batches of short texts with a small local causal language model.

    from slmclassify import Classifier, Task
    clf = Classifier(Task(labels=("billing", "technical", "account")))
    results = clf.classify(["My card was charged twice."])  # one Result per text, in order
    for result in clf.classify_iter(texts_from_a_huge_file()):  # streaming, bounded memory
        ...

The names are imported on first use (PEP 562), so `import slmclassify.cli` does not pull in torch:
the command line can answer Ctrl-C with one line even while torch is still loading.
"""

from importlib import import_module

_NAMES = {
    "Classifier": ".classifier", "EngineSettings": ".core.settings", "InputError": ".errors",
    "ModelLoadError": ".errors", "SlmClassifyError": ".errors", "TaskError": ".errors",
    "VerificationError": ".errors", "LoadedModel": ".models.loading", "load_model": ".models.prepare",
    "Result": ".core.results", "Example": ".core.task", "Question": ".core.task", "Task": ".core.task",
    "Taps": ".core.taps",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module 'slmclassify' has no attribute {name!r}")
    value = getattr(import_module(_NAMES[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
