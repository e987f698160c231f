"""An OpenAI chat completion request whose answer is a choice among given strings, or an object of
such choices: what it asks (its messages, what is scored) and the answer in OpenAI's shape. Plain
dicts in and out, shared by the service (`serve/chat.py`) and batch files (`jobs/batch.py`).

The answer is asked for in one of the spellings clients use:
- a list of strings: vLLM's `structured_outputs: {"choice": [...]}` (`guided_choice` before vLLM
  0.12, and SGLang's), or `response_format` with a JSON schema that is a string `enum`, answered as
  its JSON string; each string is scored as given (the quotes are the answer's format), so the
  three give the same answers;
- an object of finite choices (`wire/schema_questions.py`): `response_format` with an object JSON
  schema (openai `.parse()`, instructor, LangChain, DSPy), or a tool whose parameters are one, called
  by `tool_choice` (a named function, or `"required"`/`"auto"` with one tool; with several, which
  one is one more question), answered as the JSON object in `content` or as the tool call's
  arguments. `"auto"` is taken as `"required"`: the answer is always a call, never free text. One property is scored as a list of strings;
  several as a task of questions (`core/questions.py`), each value after its property's name
  (`team: billing`), all in the prompt's one pass. Without a system message the conversation gets
  the system turn a task of those labels or questions renders (`Task.system_turn`), so a request of
  a ticket alone is answered as offline `classify` answers it.

Sampling fields (temperature, top_p, seed, max_tokens, ...) change nothing: nothing is sampled.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

import numpy as np

from ..core.conversation import ChoicePrompt, choice_prompt
from ..core.task import Question, Task
from ..errors import InputError, TaskError
from .schema_questions import SchemaQuestion, answer_object, schema_questions

ROLES = ("system", "developer", "user", "assistant")
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class StringsAsk:
    """A choice among strings, each scored as given; the answer is the best one."""

    choices: tuple[str, ...]
    form: str = "text"
    """How the answer is written: "text" (the string itself) or "json" (the string as JSON)."""

    @property
    def scored(self) -> tuple[str, ...]:
        """The strings the label trie scores after the prompt, in score-column order."""
        return self.choices

    def spans(self) -> list[slice]:
        """The score columns of each choice made: one for a list of strings."""
        return [slice(0, len(self.choices))]

    def system_turn(self) -> str | None:
        """The system turn a conversation without one gets: none, the conversation as sent."""
        return None

    def answer(self, message: dict, labels: tuple[str, ...], best: list[int]) -> None:
        """Write the answer of the best score columns (`best`, one per span) into `message`."""
        answer = labels[best[0]]
        message["content"] = json.dumps(answer, ensure_ascii=False) if self.form == "json" else answer


@dataclass(frozen=True)
class ObjectAsk:
    """An object of finite choices: a schema's properties, each a question scored in the one pass
    (values after their property's name when there are several), answered as a JSON object."""

    questions: tuple[SchemaQuestion, ...]
    """An object's properties, each a choice among its values."""
    form: str = "json"
    """How the answer is written: "json" (the object as JSON in `content`) or "tool" (a call of
    `tool` with the object as its arguments)."""
    tool: str | None = None
    """The function called (form "tool"), or None when the model chooses it among `tools`."""
    tools: tuple[str, ...] = ()
    """The functions the model chooses among (`tool_choice` "auto"/"required" with several tools):
    the first question is which (its values the names), each other's path begins with its function's
    name, and only the chosen function's answers are its arguments."""

    @property
    def asked(self) -> tuple[SchemaQuestion, ...]:
        """The questions scored: those with more than one value (a `const` is answered as it is)."""
        return tuple(q for q in self.questions if len(q.values) > 1)

    @property
    def scored(self) -> tuple[str, ...]:
        asked = self.asked
        if len(asked) == 1:
            return asked[0].texts
        return tuple(f"{q.name}: {text}" for q in asked for text in q.texts)

    def spans(self) -> list[slice]:
        """One span of score columns per asked question."""
        spans, at = [], 0
        for q in self.asked:
            spans.append(slice(at, at + len(q.values)))
            at += len(q.values)
        return spans

    def task(self, **prompt) -> Task:
        """The offline task this ask is answered as (its asked questions): one question a task of its
        values, several a task of questions, each scored in full and not calibrated as a
        conversation is; `prompt`: the Task's prompt fields (`system`, `user_template`, ...) where the
        conversation gives them. TaskError when the values make no task."""
        asked = self.asked
        if len(asked) == 1:
            q = asked[0]
            return Task(labels=q.texts, mode="full", calibrate=False,
                        **{**({"instruction": q.question} if q.question else {}), **prompt})
        return Task(labels=(), mode="full", questions=tuple(
            Question(q.name, Task(labels=q.texts, calibrate=False), question=q.question) for q in asked), **prompt)

    def system_turn(self) -> str | None:
        """The system turn its task (`task`) renders, so that a request of a ticket alone is answered
        as offline `classify` answers it."""
        try:
            return self.task().system_turn()
        except TaskError as exc:
            raise InputError(f"the schema cannot be asked without a system message ({exc}); send a system message "
                             "saying what to answer") from None

    def answer(self, message: dict, labels: tuple[str, ...], best: list[int]) -> None:
        """The object of each question's best value, as `content` or as the tool call's arguments."""
        chosen = {q: pick - span.start for q, span, pick in zip(self.asked, self.spans(), best)}
        picks = [chosen.get(q, 0) for q in self.questions]  # a const's one value: not asked
        questions, tool = self.questions, self.tool
        if self.tools:  # the chosen function's own answers, without its name before their paths
            tool = questions[0].values[picks[0]]
            own = [(SchemaQuestion(q.path[1:], q.values, q.question), pick)
                   for q, pick in zip(questions[1:], picks[1:]) if q.path[0] == tool]
            questions, picks = tuple(q for q, _ in own), [pick for _, pick in own]
        arguments = json.dumps(answer_object(questions, picks), ensure_ascii=False)
        if self.form == "tool":
            message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                                      "function": {"name": tool, "arguments": arguments}}]
        else:
            message["content"] = arguments


ChatAsk = StringsAsk | ObjectAsk
"""What a chat request asks for: the strings scored after its prompt (`scored`, `spans`), the system
turn a conversation without one gets, and how the best ones become the answer (`answer`)."""


def unknown_model(name, names: tuple[str, ...], tasks) -> str | None:
    """Why a request's `model` names nothing served (None: it names the model by one of its ids, or
    a task): the one check of the service and batch files."""
    if isinstance(name, str) and (name in names or name in tasks):
        return None
    listed = ", ".join(repr(m) for m in [*names, *tasks])
    if not isinstance(name, str):
        return f"model must be a string, one of {listed} (got {type(name).__name__})"
    return f"the model {name!r} does not exist; GET /v1/models lists {listed}"


def chat_prompt(body: dict, tokenizer, context: int) -> tuple[ChatAsk, ChoicePrompt]:
    """What the request asks for and its prompt with the trie of what is scored (`choice_prompt`;
    `context` its limit): the one reading of a chat body, for the service and batch files."""
    ask = chat_ask(body)
    return ask, choice_prompt(tokenizer, chat_messages(body, ask), ask.scored, context)


def chat_messages(body: dict, ask: ChatAsk) -> list[dict]:
    """The messages as a chat template takes them: text parts joined, `developer` as `system`; the
    ask's system turn first where the messages have none."""
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
    system = ask.system_turn()
    if system is not None and not any(m["role"] == "system" for m in out):
        out.insert(0, {"role": "system", "content": system})
    return out


def chat_ask(body: dict) -> ChatAsk:
    """What the request asks for. Raises InputError when it asks for free text, several answers,
    or for what is not a choice (naming the field)."""
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
        given.append(("structured_outputs.choice", lambda: _strings(structured["choice"], "structured_outputs.choice")))
    if body.get("guided_choice") is not None:
        given.append(("guided_choice", lambda: _strings(body["guided_choice"], "guided_choice")))
    response_format = body.get("response_format")
    if response_format is not None and not (isinstance(response_format, dict) and response_format.get("type") == "text"):
        given.append(("response_format", lambda: _response_format(response_format, body.get("messages"))))
    tools, tool_choice = body.get("tools"), body.get("tool_choice")
    if tool_choice != "none" and (tools or tool_choice not in (None, "auto")):  # "none": the tools are not called
        given.append(("tools", lambda: _tool_call(tools, tool_choice)))
    if not given:
        raise InputError("free-text generation is not supported: constrain the answer to a list of strings with "
                         "structured_outputs: {\"choice\": [...]} or guided_choice, or to an object of choices with "
                         "response_format (a JSON schema) or a tool whose parameters are one")
    if len(given) > 1:
        raise InputError(f"the answer is constrained twice ({given[0][0]} and {given[1][0]}): which one applies is "
                         "ambiguous; give one")
    return given[0][1]()


def _strings(choices, where: str) -> StringsAsk:
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise InputError(f"{where} must be a list of strings")
    return StringsAsk(tuple(choices))


def _response_format(response_format, messages) -> ChatAsk:
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "json_object":  # JSON mode: the schema, if any, is written into the prompt
        found = message_schema(messages)
        if found is None:
            raise InputError("response_format json_object gives no schema and no message holds one, so the answers "
                             "are not a finite set: send {\"type\": \"json_schema\", \"json_schema\": {\"name\", "
                             "\"schema\"}} with an object schema of enum properties (what openai .parse(), "
                             "instructor and LangChain send), or write that schema into a message")
        where, schema = found
        return ObjectAsk(schema_questions(schema, where))
    spec = response_format.get("json_schema") if kind == "json_schema" else None
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise InputError("response_format must be {\"type\": \"json_schema\", \"json_schema\": {\"name\", "
                         "\"schema\"}} (or {\"type\": \"text\"}), got " + json.dumps(response_format)[:80])
    if schema.get("type") == "string" or ("enum" in schema and "properties" not in schema):
        if schema.get("type", "string") != "string" or not isinstance(schema.get("enum"), list):
            raise InputError("response_format.json_schema.schema: a string schema needs an enum of strings")
        return StringsAsk(_strings(schema["enum"], "response_format.json_schema.schema.enum").choices, form="json")
    return ObjectAsk(schema_questions(schema, "response_format.json_schema.schema"))


def message_schema(messages) -> tuple[str, dict] | None:
    """(where, schema): the first object JSON schema (a JSON object with `properties`) written in a
    message's text, as JSON mode's clients send it (instructor's Mode.JSON in its system message,
    LangChain's json_mode with the schema in the prompt); None when no message holds one."""
    decoder = json.JSONDecoder()
    for index, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            continue
        at = content.find("{")
        while at != -1:
            try:
                value, _end = decoder.raw_decode(content, at)
            except ValueError:
                at = content.find("{", at + 1)
                continue
            if isinstance(value, dict) and isinstance(value.get("properties"), dict):
                return f"messages[{index}].content (the JSON schema in it)", value
            at = content.find("{", at + 1)  # a schema may be inside this JSON
    return None


def _tool_call(tools, tool_choice) -> ObjectAsk:
    """The tool the request makes the model call, and its parameters' questions."""
    if not isinstance(tools, list) or not tools:
        raise InputError("tools must be a non-empty list of {\"type\": \"function\", \"function\": {\"name\", "
                         "\"parameters\"}}")
    functions = {}
    for k, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type", "function") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InputError(f"tools[{k}] must be {{\"type\": \"function\", \"function\": {{\"name\", "
                             "\"parameters\"}}")
        if function["name"] in functions:
            raise InputError(f"tools[{k}] names the function {function['name']!r} again; give each tool once")
        functions[function["name"]] = (k, function)
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name") if tool_choice.get("type", "function") == "function" \
            else None
        if name not in functions:
            raise InputError(f"tool_choice names the function {name!r}, which is not among the tools "
                             f"({', '.join(functions)})")
    elif tool_choice in (None, "auto", "required"):  # "auto" as "required": the answer is a call, never text
        if len(functions) > 1:
            return _tool_choice(functions)
        name = next(iter(functions))
    else:
        raise InputError(f"tool_choice must be \"auto\", \"required\", \"none\" or {{\"type\": \"function\", "
                         f"\"function\": {{\"name\": ...}}}}, got {json.dumps(tool_choice)[:60]}")
    k, function = functions[name]
    return ObjectAsk(schema_questions(function.get("parameters"), f"tools[{k}].function.parameters"), form="tool",
                     tool=name)


def _tool_choice(functions: dict) -> ObjectAsk:
    """Several tools, the model to choose: which function is one more question, asked first (its
    answer a name, asked with each function's description), then every function's parameters, all
    in the one pass; a function without parameters is called with {}."""
    told = "; ".join(f"{name}: {' '.join(f.get('description', '').split())}" if f.get("description") else name
                     for name, (_k, f) in functions.items())
    questions = [SchemaQuestion(("tool",), tuple(functions), f"Which function to call ({told})")]
    for name, (k, function) in functions.items():
        parameters = function.get("parameters")
        if parameters is None or isinstance(parameters, dict) and not parameters.get("properties"):
            continue
        own = schema_questions(parameters, f"tools[{k}].function.parameters")
        questions.extend(SchemaQuestion((name, *q.path), q.values, q.question) for q in own)
    return ObjectAsk(tuple(questions), form="tool", tools=tuple(functions))


def chat_completion(body: dict, prompt: ChoicePrompt, scores: np.ndarray, ask: ChatAsk) -> dict:
    """OpenAI's chat completion for one conversation, from its [scored] whole-choice log-probabilities:
    the best choice (of each question) as the message or the tool call; with `logprobs`, one entry
    per choice made, with each of its best `top_logprobs` choices' log-probability."""
    labels = prompt.trie.labels
    spans = ask.spans()
    best = [span.start + int(np.argmax(scores[span])) for span in spans]
    logprobs = None
    if body.get("logprobs"):
        entries = []
        for span, pick in zip(spans, best):
            top = span.start + np.argsort(-scores[span], kind="stable")[: body.get("top_logprobs") or 0]
            entries.append({**_entry(labels[pick], scores[pick]),
                            "top_logprobs": [_entry(labels[k], scores[k]) for k in top]})
        logprobs = {"content": entries, "refusal": None}
    message = {"role": "assistant", "content": None, "refusal": None}
    ask.answer(message, labels, best)
    completion = sum(len(prompt.trie.sequences[k]) for k in best)
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model"), "system_fingerprint": None,
            "choices": [{"index": 0, "message": message, "logprobs": logprobs,
                         "finish_reason": "tool_calls" if ask.form == "tool" else "stop"}],
            "usage": {"prompt_tokens": len(prompt.prompt_ids), "completion_tokens": completion,
                      "total_tokens": len(prompt.prompt_ids) + completion}}


def chat_chunks(completion: dict) -> list[dict]:
    """A chat completion as the chunks of a stream (`stream: true`): the whole answer in one chunk's
    delta, then the finish reason, then the usage (which clients read from the last chunk)."""
    choice = completion["choices"][0]
    message = choice["message"]
    delta = {"role": "assistant", "content": message["content"]}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
    base = {k: completion[k] for k in ("id", "created", "model", "system_fingerprint")}
    return [{**base, "object": "chat.completion.chunk",
             "choices": [{"index": 0, "delta": delta, "logprobs": choice["logprobs"], "finish_reason": None}]},
            {**base, "object": "chat.completion.chunk",
             "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"]}]},
            {**base, "object": "chat.completion.chunk", "choices": [], "usage": completion["usage"]}]


def _entry(choice: str, logprob: float) -> dict:
    return {"token": choice, "logprob": float(logprob), "bytes": list(choice.encode("utf-8"))}
