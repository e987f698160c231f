"""An OpenAI chat completion request whose answer is one of given strings: what it asks (its
messages and its choices) and the answer in OpenAI's shape. Plain dicts in and out, shared by the
service (`serve/chat.py`) and batch files (`jobs/batch.py`).

The choices come in one of the spellings clients use: vLLM's `structured_outputs: {"choice": [...]}`
(`guided_choice` before vLLM 0.12, and SGLang's), or OpenAI's `response_format` with a JSON schema
that is a string `enum`, whose answer is JSON: each string is scored as its JSON string
(`"billing"`, quotes included). Sampling fields (temperature, top_p, seed, max_tokens, ...) change
nothing: nothing is sampled.
"""

from __future__ import annotations

import json
import time
import uuid

import numpy as np

from ..errors import InputError
from .conversation import ChoicePrompt

ROLES = ("system", "developer", "user", "assistant")
MAX_TOP_LOGPROBS = 20


def chat_messages(body: dict) -> list[dict]:
    """The messages as a chat template takes them: text parts joined, `developer` as `system`."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InputError("messages must be a non-empty list of {\"role\", \"content\"} objects")
    out = []
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            raise InputError(f"messages[{index}].role must be one of {', '.join(ROLES)}, got {role!r}")
        content = message.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise InputError(f"messages[{index}].content: only text parts are supported")
            content = "".join(part["text"] for part in content)
        if content is not None and not isinstance(content, str):
            raise InputError(f"messages[{index}].content must be a string or a list of text parts")
        out.append({"role": "system" if role == "developer" else role, "content": content or ""})
    return out


def chat_choices(body: dict) -> tuple[str, ...]:
    """The strings to score. Raises InputError when the request asks for free text, a stream, several
    answers, or for what is not a choice among strings."""
    if body.get("stream"):
        raise InputError("stream is not supported: the answer is one choice, scored whole; send stream: false")
    if body.get("n") not in (None, 1):
        raise InputError(f"n={body.get('n')} is not supported: the answer is the best choice, exactly one")
    top = body.get("top_logprobs")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise InputError(f"top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {top!r}")
    given = []
    structured = body.get("structured_outputs")
    if structured is not None:
        if not isinstance(structured, dict) or set(structured) != {"choice"}:
            raise InputError("structured_outputs: only {\"choice\": [...]} (a list of strings) is supported")
        given.append(("structured_outputs.choice", structured["choice"], False))
    if body.get("guided_choice") is not None:
        given.append(("guided_choice", body["guided_choice"], False))
    response_format = body.get("response_format")
    if response_format is not None and not (isinstance(response_format, dict) and response_format.get("type") == "text"):
        given.append(("response_format", _schema_enum(response_format), True))
    if not given:
        raise InputError("free-text generation is not supported: constrain the answer to a list of strings with "
                         "structured_outputs: {\"choice\": [...]}, guided_choice, or response_format with a JSON "
                         "schema {\"type\": \"string\", \"enum\": [...]}")
    if len(given) > 1:
        raise InputError(f"the choices are given twice ({given[0][0]} and {given[1][0]}); give one")
    where, choices, as_json = given[0]
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise InputError(f"{where} must be a list of strings")
    return tuple(json.dumps(c, ensure_ascii=False) if as_json else c for c in choices)


def _schema_enum(response_format) -> list:
    spec = response_format.get("json_schema") if isinstance(response_format, dict) else None
    schema = spec.get("schema") if isinstance(spec, dict) and response_format.get("type") == "json_schema" else None
    if not isinstance(schema, dict) or schema.get("type", "string") != "string" or "enum" not in schema:
        raise InputError("response_format: only a JSON schema that is a string enum ({\"type\": \"string\", "
                         "\"enum\": [...]}) is supported: the answer is one of its strings")
    return schema["enum"]


def chat_completion(body: dict, prompt: ChoicePrompt, scores: np.ndarray) -> dict:
    """OpenAI's chat completion for one conversation, from its [choices] whole-choice log-probabilities:
    the best choice as the message; with `logprobs`, each of the best `top_logprobs` choices' log-probability."""
    labels = prompt.trie.labels
    best = int(np.argmax(scores))
    logprobs = None
    if body.get("logprobs"):
        top = np.argsort(-scores, kind="stable")[: body.get("top_logprobs") or 0]
        logprobs = {"content": [{**_entry(labels[best], scores[best]),
                                 "top_logprobs": [_entry(labels[k], scores[k]) for k in top]}], "refusal": None}
    completion = len(prompt.trie.sequences[best])
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model"), "system_fingerprint": None,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": labels[best], "refusal": None},
                         "logprobs": logprobs, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": len(prompt.prompt_ids), "completion_tokens": completion,
                      "total_tokens": len(prompt.prompt_ids) + completion}}


def _entry(choice: str, logprob: float) -> dict:
    return {"token": choice, "logprob": float(logprob), "bytes": list(choice.encode("utf-8"))}
