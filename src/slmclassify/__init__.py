"""slmclassify: label batches of short texts with a small local causal language model.

    from slmclassify import Classifier, Task
    clf = Classifier(Task(labels=("billing", "technical", "account")))
    results = clf.classify(["My card was charged twice."])  # one Result per text, in order
"""

from .classifier import Classifier, EngineSettings
from .errors import InputError, ModelLoadError, SlmClassifyError, TaskError, VerificationError
from .loading import LoadedModel, load_model
from .results import Result
from .task import Example, Task

__all__ = [
    "Classifier", "EngineSettings", "Example", "InputError", "LoadedModel", "ModelLoadError",
    "Result", "SlmClassifyError", "Task", "TaskError", "VerificationError", "load_model",
]
