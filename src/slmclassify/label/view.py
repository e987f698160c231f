"""What the labelling page shows of a session besides its counts: the current item with its guess
and the reason it was picked, the history, the skipped rows, and advice on when to stop.

Pure functions of the session's parts, called with its lock held.
"""

from __future__ import annotations

import numpy as np

from .answers import Answers
from .pool import Pool
from .strategy import describe

ENOUGH_PER_LABEL = 50
"""Answers per label after which the page says that labelling more pays little."""


def item(pool: Pool, answers: Answers, current: tuple[int, str, str] | None, counts: np.ndarray,
         who: str = "") -> dict | None:
    """`who`'s current item (`current`: pool position, reason, kind) as their page shows it; None when
    none. A reviewer's has every annotator's answer (`team_answers`); an annotator's no one else's."""
    if current is None:
        return None
    pos, detail, kind = current
    label, confidence = pool.guess(pos)
    probs = pool.probs(pos)
    reason = describe(kind, detail, probs, pool.labels, counts, pool.spans)  # from the guess shown
    shown = {"row": int(pool.rows[pos]), "id": None if pool.ids is None else pool.ids[pos],
             "text": pool.texts[pos], "guess": label,
             "confidence": confidence, "reason": reason,
             "version": answers.version(pos, who)}
    if who in answers.team.reviewers:
        shown["team_answers"] = {name: answers.shown(value) for name, value in answers.answered.get(pos, {}).items()}
    if pool.multi:  # each label's P(yes), shown on its button
        shown["probabilities"] = _probabilities(pool.labels, probs)
    if pool.parts:  # a task of questions: each question's guess, its confidence, and its labels' probabilities
        shown["answers"] = {}
        for part in pool.parts:
            guess, sure = part.guess(pos)
            shown["answers"][part.name] = {"guess": guess, "confidence": sure,
                                           "probabilities": _probabilities(part.labels, part.probs(pos))}
    return shown


def _probabilities(labels, probs: np.ndarray) -> dict | None:
    return None if np.isnan(probs).any() else {lab: float(p) for lab, p in zip(labels, probs)}


def history(pool: Pool, answers: Answers, who: str = "") -> list[dict]:
    """`who`'s latest answers and skips, newest first, with their own answers."""
    return [{**pool.snippet(p), "label": None if (own := answers.own(p, who)) is None else answers.shown(own)}
            for p in answers.recent(who)]


def skipped(pool: Pool, answers: Answers, who: str = "", n: int = 50) -> list[dict]:
    """The first `n` items `who` skipped, in pool order."""
    return [pool.snippet(pos) for pos in sorted(answers.skips_of.get(who, ()))[:n]]


def advice(est, counts: np.ndarray) -> str | None:
    """When labelling more stops paying: the honest estimate's interval is narrow, or every label
    has `ENOUGH_PER_LABEL` answers (a head gains little per answer after that)."""
    if est is not None and est.high - est.low <= 0.1:
        return (f"the estimate is within ±{(est.high - est.low) / 2:.0%}: more answers now change it little; "
                "Fit the head, or label on where it is unsure")
    if len(counts) and counts.min() >= ENOUGH_PER_LABEL:
        return f"every label has {ENOUGH_PER_LABEL} answers or more: a head gains little from each answer now"
    return None
