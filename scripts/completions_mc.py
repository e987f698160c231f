"""An lm-eval-style multiple-choice request set answered as completions with the prompt's
log-probabilities (echo, logprobs 1, max_tokens 0), side by side in one run (issue 55):

  shared     each question is one request of its 4 prompts (context + continuation): the context
             runs once, the continuations as branches (`wire/completions.py`)
  separate   each prompt is a request of its own: the context runs 4 times

Contexts are the article's tickets in the article's prompt; continuations the 3 labels and "other".
Both sides go through the same engine calls as `POST /v1/completions` (no HTTP); the rounds
alternate them, every continuation's log-probabilities must agree within 1e-4, and it prints the
seconds per side, the ratio and one JSON line.

    .venv/bin/python scripts/completions_mc.py --n 200 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from slmclassify.core.article_tickets import article_tickets
from slmclassify.wire.completions import completion_ask, completion_rows, row_logprobs

CONTINUATIONS = (" billing", " technical", " account", " other")


def answer(loaded, prompts: list[list[int]]) -> list[np.ndarray]:
    """Each prompt's token log-probabilities after its first token, as one completions request."""
    ask = completion_ask({"prompt": prompts, "echo": True, "logprobs": 1, "max_tokens": 0}, loaded.tokenizer, 10**9)
    out = {}
    for row in completion_rows(ask):
        out.update(row_logprobs(loaded.engine, loaded.tokenizer.pad_token_id, row, ask))
    return [out[k][0] for k in range(len(prompts))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="questions")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()

    from slmclassify import load_model

    loaded = load_model()
    tok = loaded.tokenizer
    questions = [[tok(f"Ticket: {t}\nCategory:{c}")["input_ids"] for c in CONTINUATIONS]
                 for t in article_tickets(args.n)]
    answer(loaded, questions[0])  # warm-up
    seconds = {"shared": [], "separate": []}
    for r in range(args.rounds):
        for side in (("shared", "separate") if r % 2 == 0 else ("separate", "shared")):
            started = time.perf_counter()
            if side == "shared":
                shared = [answer(loaded, q) for q in questions]
            else:
                separate = [[answer(loaded, [p])[0] for p in q] for q in questions]
            seconds[side].append(time.perf_counter() - started)
            print(f"round {r + 1}: {side} {seconds[side][-1]:.1f} s (load {os.getloadavg()[0]:.1f})")
    worst = max(float(np.abs(a - b).max()) for qa, qb in zip(shared, separate) for a, b in zip(qa, qb))
    one, four = float(np.mean(seconds["shared"])), float(np.mean(seconds["separate"]))
    tokens = sum(len(p) for q in questions for p in q)
    print(f"{args.n} questions x {len(CONTINUATIONS)} continuations ({tokens} prompt tokens): context once "
          f"{one:.1f} s, four separate requests {four:.1f} s: {four / one:.2f}x; largest difference "
          f"{worst:.1e}; {os.cpu_count()} CPUs")
    line = json.dumps({"n": args.n, "shared_s": one, "separate_s": four, "speedup": four / one,
                       "max_abs_diff": worst, "rounds": seconds})
    if args.json_path:
        with open(args.json_path, "w") as fh:
            fh.write(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
