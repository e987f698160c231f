"""Learned heads: a multinomial logistic regression on hidden states that the fast path reads
(mean-pooled over each item's tokens or at its last token: `features.py`), fitted on labelled items
(`slmclassify fit`), used by `classify --head` and `evaluate --head`; a task with questions gets a
head per question, all in one file (`questions.py`). scikit-learn (the `head` extra) is needed to
fit, not to apply a head."""

from .apply import SCORERS, score_with_head
from .model import Head, QuestionHeads, model_fingerprint, task_record

__all__ = ["Head", "QuestionHeads", "SCORERS", "model_fingerprint", "score_with_head", "task_record"]
