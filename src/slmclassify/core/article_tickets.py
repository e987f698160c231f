"""The article's benchmark workload: 600 synthetic support tickets with long-tailed lengths.

Exactly the article's generator: word counts from lognormal(log 60, 0.9) with seed 0, clipped
to [12, 400]; the three base tickets cycled and extended with the filler sentence.
"""

from __future__ import annotations

import numpy as np

from .task import Task

BASE_TICKETS = (
    "My card was charged twice for the same invoice.",
    "The mobile app crashes whenever I open the settings page.",
    "I need to change the email address on my profile.",
)
FILLER = (
    "I have been waiting for a response for several days now and would really "
    "appreciate an update on this whenever someone gets a chance to look at it."
).split()
ARTICLE_TASK = Task(
    labels=("billing", "technical", "account"),
    system="You classify support tickets. Answer with exactly one of: billing, technical, account.",
    user_template="Ticket: {text}\nCategory:",
    mode="first",
)


def make_ticket(base: str, n_words: int) -> str:
    words = base.split()
    while len(words) < n_words:
        words += FILLER
    return " ".join(words[:n_words])


def article_tickets(n: int = 600) -> list[str]:
    """The first n of the article's tickets (the generator draws 600, as the article does)."""
    rng = np.random.default_rng(0)
    target_words = np.clip(rng.lognormal(np.log(60), 0.9, size=max(n, 600)), 12, 400).astype(int)
    return [make_ticket(BASE_TICKETS[i % 3], int(w)) for i, w in enumerate(target_words[:n])]
