"""Row (s) of `slmclassify bench`: a label asked for with a Pydantic model, as openai `.parse()`,
instructor and LangChain send it — an object JSON schema in `response_format` — with three fields
(team 5 values, priority 3, sentiment 3) against one (team), through the service's own path for
each request body (`chat_request.chat_prompt` → one `ChoiceScorer` pass over the bodies, batched
as the scheduler pools them → `chat_completion`); HTTP, the same for both, is left out.

The two sides are whole runs (every body read and answered, the conversation's head computed
once in a fresh prefix cache), interleaved round by round (`timing.interleave`). Agreement: the
three-field answers against offline `classify` of the task of questions the schema makes, every
field of every item; max |Δ| between their scores."""

from __future__ import annotations

import json

import numpy as np

from ..backends.sync import sync_of
from ..classifier import Classifier
from ..wire.chat_request import chat_ask, chat_completion, chat_prompt
from ..core.config_check import context_limit
from ..core.conversation import ChoiceScorer
from ..core.prefix_caches import PrefixCaches
from ..errors import InputError
from ..models.schedule import scheduled
from ..timing import Side, interleave

ROUNDS = 3
FIELDS = {"team": ("billing", "technical", "account", "shipping", "feedback"),
          "priority": ("low", "normal", "urgent"), "sentiment": ("negative", "neutral", "positive")}
TEMPLATE = "Ticket: {text}"


def schema(fields: tuple[str, ...]) -> dict:
    """The response_format openai `.parse()` sends for a model of `Literal` fields (strict form)."""
    properties = {name: {"type": "string", "enum": list(FIELDS[name]), "title": name.title()} for name in fields}
    return {"type": "json_schema", "json_schema": {"name": "Ticket", "strict": True, "schema": {
        "type": "object", "properties": properties, "required": list(fields), "additionalProperties": False}}}


def structured_row(loaded, texts: list[str], settings, device) -> dict | None:
    """The figures of row (s): the three-field requests' median seconds, their cost over one field's
    (median of the rounds' ratios, with each round's), agreement with offline classify, max |Δ|,
    on the texts whose conversation fits the model's context (`answered`; the service refuses the
    others with a 400); None when none fits."""
    tokenizer, context = loaded.tokenizer, context_limit(loaded.model.config)
    chat_settings = scheduled(settings, loaded)[0]
    three, one = tuple(FIELDS), ("team",)

    def body(text: str, fields: tuple[str, ...]) -> dict:
        return {"model": "m", "messages": [{"role": "user", "content": TEMPLATE.format(text=text)}],
                "response_format": schema(fields), "logprobs": True}

    fits = [t for t in texts if _fits(body(t, three), tokenizer, context)]  # the service 400s the others
    if not fits:
        return None
    bodies = {fields: [body(t, fields) for t in fits] for fields in (one, three)}

    def answer(fields):
        def run(_):
            asked = [chat_prompt(body, tokenizer, context) for body in bodies[fields]]
            prompts = [prompt for _ask, prompt in asked]
            scorer = ChoiceScorer(tokenizer, loaded.model.config, chat_settings, prompts[0])
            caches = PrefixCaches(loaded.engine, 64 << 20)
            scored = scorer.score(scorer.encode(prompts), loaded.engine, caches)
            return scored, [chat_completion(body, prompt, row, ask)
                            for body, (ask, prompt), row in zip(bodies[fields], asked, scored.scores)]
        return run

    timings = interleave([Side("three", answer(three)), Side("one", answer(one))], rounds=ROUNDS, warmup=1,
                         sync=sync_of(device))
    scored, completions = timings.last("three")[0]
    offline = Classifier(chat_ask(bodies[three][0]).task(), model=loaded, settings=settings)
    results = offline.classify([TEMPLATE.format(text=t) for t in fits])
    reference = offline.score(offline.encode([TEMPLATE.format(text=t) for t in fits])).scores
    agree = sum(json.loads(c["choices"][0]["message"]["content"]) == {q: r.answers[q].label for q in three}
                for c, r in zip(completions, results))
    cost = timings.ratios("three", "one")
    return {"seconds": timings.median("three"), "padding": scored.stats.padding_share,
            "cost_vs_one": float(np.median(cost)), "cost_vs_one_rounds": [round(float(r), 3) for r in cost],
            "agree": int(agree), "answered": len(fits),
            "max_abs_diff": float(np.max(np.abs(scored.scores - reference)))}


def _fits(body: dict, tokenizer, context: int) -> bool:
    """Whether the conversation and its longest answer fit the model's context (else a 400)."""
    try:
        chat_prompt(body, tokenizer, context)
    except InputError:
        return False
    return True
