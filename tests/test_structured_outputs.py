"""Structured outputs as real clients ask for them: a Pydantic model through the official `openai`
client's `.parse()` (an object JSON schema, or a tool it must call) against a running `serve` over the
tiny random Llama. Each answer is valid against its schema and is offline `classify`'s answer for the
task those properties make: one property a task of its labels, several a task of questions."""

from __future__ import annotations

import enum
import json
from typing import Literal, Optional

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from pydantic import BaseModel, Field  # noqa: E402

from slmclassify import Classifier, Task  # noqa: E402
from slmclassify.wire.schema_questions import schema_questions  # noqa: E402
from slmclassify.core.task import Question  # noqa: E402
from slmclassify.errors import InputError  # noqa: E402

TEAMS = ("billing", "technical", "account")
TICKETS = ["My card was charged twice for the same invoice.", "The app crashes when I open settings.",
           "Please change the email on my profile.", "refund", "login error crash after the update today",
           "I was billed after I cancelled", "password reset link expired", "why is my invoice higher",
           "the export button does nothing", "close my account please", "wrong currency on receipt",
           "two factor codes never arrive"]


class Ticket(BaseModel):
    label: Literal["billing", "technical", "account"]


class Priority(str, enum.Enum):  # Pydantic writes an Enum as a $ref to $defs
    low = "low"
    high = "high"


class Triage(BaseModel):
    team: Literal["billing", "technical", "account"] = Field(description="Which team handles the ticket")
    priority: Priority
    angry: bool = Field(description="Is the customer angry")


OFFLINE = {  # the task each model's properties make, scored as a conversation is: in full, not calibrated
    "Ticket": Task(labels=TEAMS, mode="full", calibrate=False),
    "Triage": Task(labels=(), mode="full", questions=(
        Question("team", Task(labels=TEAMS, calibrate=False), question="Which team handles the ticket"),
        Question("priority", Task(labels=("low", "high"), calibrate=False)),
        Question("angry", Task(labels=("yes", "no"), calibrate=False), question="Is the customer angry"))),
}


def _offline(loaded, model: type[BaseModel]) -> list[dict]:
    """Per ticket: {property: (offline label, {label: raw score})}."""
    results = Classifier(OFFLINE[model.__name__], model=loaded).classify(TICKETS)
    if model is Ticket:
        return [{"label": (r.label, r.scores)} for r in results]
    return [{name: (a.label, a.scores) for name, a in r.answers.items()} for r in results]


def _as_json(model: type[BaseModel], parsed: BaseModel) -> dict:
    answer = json.loads(parsed.model_dump_json())
    jsonschema.validate(answer, model.model_json_schema())
    return {k: {True: "yes", False: "no"}.get(v, v) for k, v in answer.items()}


def _check(answer: dict, logprobs, offline: dict) -> int:
    """The answer and its scores equal offline's; returns how many answers had a clear best label."""
    clear = 0
    for entry, (name, (label, scores)) in zip(logprobs.content, offline.items()):
        got = {e.token.removeprefix(f"{name}: "): e.logprob for e in entry.top_logprobs}
        assert set(got) == set(scores), (got, scores)
        assert np.allclose([got[k] for k in scores], [scores[k] for k in scores], atol=1e-4), (got, scores)
        top = sorted(scores.values())
        if top[-1] - top[-2] > 1e-3:  # a near tie may fall either way within the scores' tolerance
            assert answer[name] == label, (name, answer, scores)
            clear += 1
    return clear


@pytest.mark.parametrize("model", [Ticket, Triage], ids=["one-field", "three-fields"])
def test_parse_and_tool_calls_answer_as_offline_classify(llama_loaded, model):
    from test_serve import running

    offline = _offline(llama_loaded, model)
    clear = 0
    with running(llama_loaded) as (url, _app):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for ticket, want in zip(TICKETS, offline):
            messages = [{"role": "user", "content": ticket}]  # no system message: the task's system turn
            done = client.chat.completions.parse(model="support", messages=messages, response_format=model,
                                                 logprobs=True, top_logprobs=5)
            answer = _as_json(model, done.choices[0].message.parsed)
            clear += _check(answer, done.choices[0].logprobs, want)
            # the same as a tool the model must call (instructor's TOOLS, LangChain's function_calling)
            called = client.chat.completions.parse(model="support", messages=messages,
                                                   tools=[openai.pydantic_function_tool(model)],
                                                   tool_choice={"type": "function", "function": {"name": model.__name__}},
                                                   parallel_tool_calls=False)
            choice = called.choices[0]
            assert choice.finish_reason == "tool_calls" and choice.message.content is None
            call = choice.message.tool_calls[0]
            assert call.function.name == model.__name__
            assert _as_json(model, call.function.parsed_arguments) == answer
    assert clear >= len(TICKETS) * len(offline[0]) // 2, "too few clear answers to compare labels"


class Route(BaseModel):
    """To a team."""

    team: Literal["billing", "technical", "account"]


class Close(BaseModel):
    pass


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
def test_several_tools_the_model_chooses_one_as_one_more_question(llama_loaded, tool_choice):
    """Before: several tools without a named one were a 400. Now which function is one more question
    (its answer a name, asked with each function's description), answered in the same pass as every
    function's parameters: the call is offline classify's answer for that task of questions; a
    function without parameters is called with {}. "auto" is "required": the answer is always a call."""
    from test_serve import running

    told = "Which function to call (Route: To a team.; Close)"
    task = Task(labels=(), mode="full", questions=(
        Question("tool", Task(labels=("Route", "Close"), calibrate=False), question=told),
        Question("Route_team", Task(labels=TEAMS, calibrate=False))))
    offline = Classifier(task, model=llama_loaded).classify(TICKETS)
    tools = [openai.pydantic_function_tool(m) for m in (Route, Close)]
    called = set()
    with running(llama_loaded) as (url, _app):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for ticket, want in zip(TICKETS, offline):
            answer = client.chat.completions.parse(model="support", messages=[{"role": "user", "content": ticket}],
                                                   tools=tools, tool_choice=tool_choice, logprobs=True,
                                                   top_logprobs=3)
            choice = answer.choices[0]
            assert choice.finish_reason == "tool_calls"
            call = choice.message.tool_calls[0]
            tool = want.answers["tool"]
            scores = want.answers["tool"].scores
            if sorted(scores.values())[-1] - sorted(scores.values())[-2] < 1e-3:
                continue  # a near tie may fall either way within the scores' tolerance
            assert call.function.name == tool.label, (call.function.name, scores)
            arguments = json.loads(call.function.arguments)
            if tool.label == "Close":
                assert arguments == {}
            else:
                assert arguments == {"team": want.answers["Route_team"].label}
            got = {e.token: e.logprob for e in choice.logprobs.content[0].top_logprobs}
            assert np.allclose([got[f"tool: {k}"] for k in scores], list(scores.values()), atol=1e-4)
            called.add(tool.label)
    assert len(called) >= 2, called  # the choice among tools is exercised, not one tool every time


def test_a_string_enum_answers_as_guided_choice_and_a_stream_is_one_chunk(llama_loaded):
    """Before: each enum string was scored with its JSON quotes ("billing"), and on 20 tickets gave
    guided_choice's label on 11. Now the quotes are the answer's format only: the same answers."""
    from test_serve import running

    schema = {"type": "json_schema", "json_schema": {"name": "team", "schema": {"type": "string", "enum": list(TEAMS)}}}
    with running(llama_loaded) as (url, _app):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for ticket in TICKETS:
            messages = [{"role": "user", "content": ticket}]
            guided = client.chat.completions.create(model="support", messages=messages, logprobs=True, top_logprobs=3,
                                                    extra_body={"guided_choice": list(TEAMS)})
            enum_answer = client.chat.completions.create(model="support", messages=messages, logprobs=True,
                                                         top_logprobs=3, response_format=schema)
            assert enum_answer.choices[0].message.content == json.dumps(guided.choices[0].message.content)
            assert ([e.logprob for e in enum_answer.choices[0].logprobs.content[0].top_logprobs]
                    == [e.logprob for e in guided.choices[0].logprobs.content[0].top_logprobs])
            # stream: true (LangChain and others stream by default): one chunk with the whole answer
            chunks = list(client.chat.completions.create(model="support", messages=messages, stream=True,
                                                         stream_options={"include_usage": True},
                                                         extra_body={"guided_choice": list(TEAMS)}))
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
                guided.choices[0].message.content
            assert [c.choices[0].finish_reason for c in chunks if c.choices] == [None, "stop"]
            assert chunks[-1].usage.prompt_tokens == guided.usage.prompt_tokens


def test_what_cannot_be_scored_is_a_400_naming_it(llama_loaded):
    from test_serve import running

    class Free(BaseModel):
        label: Literal["a", "b"]
        summary: str

    user = [{"role": "user", "content": "hi"}]
    tool = openai.pydantic_function_tool(Ticket)
    with running(llama_loaded) as (url, _app):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        cases = [
            (dict(response_format=Free), "response_format.json_schema.schema.properties.summary is a string without "
                                         "an enum: its answers are not a finite set"),
            (dict(response_format={"type": "json_object"}), "response_format json_object gives no schema"),
            (dict(tools=[tool], extra_body={"guided_choice": ["a", "b"]}),
             "the answer is constrained twice (guided_choice and tools)"),
            (dict(tools=[tool, tool], tool_choice="required"),
             "tools[1] names the function 'Ticket' again; give each tool once"),
            (dict(tools=[tool], tool_choice={"type": "function", "function": {"name": "Other"}}),
             "tool_choice names the function 'Other', which is not among the tools (Ticket)"),
            (dict(tools=[tool], tool_choice="none"), "free-text generation is not supported"),
        ]
        for kwargs, message in cases:
            call = client.chat.completions.parse if "response_format" in kwargs and not isinstance(
                kwargs["response_format"], dict) else client.chat.completions.create
            with pytest.raises(openai.BadRequestError) as caught:
                call(model="support", messages=user, **kwargs)
            error = caught.value.body
            assert message in error["message"] and error["type"] == "invalid_request_error", (kwargs, error)


class Inner(BaseModel):
    urgent: bool
    tier: Literal[1, 2, 3]


class Nested(BaseModel):
    label: Literal["billing", "technical"]
    kind: Optional[Literal["refund", "charge"]] = None
    detail: Inner
    version: Literal["v1"] = "v1"


def test_the_schemas_pydantic_and_openai_write_are_read_as_questions():
    """Literal, Enum ($ref), Optional (anyOf with null), bool, integers, const and nested objects, as
    `model_json_schema()` and openai's strict form (what `.parse()` sends) write them."""
    from openai.lib._pydantic import to_strict_json_schema

    for schema in (Nested.model_json_schema(), to_strict_json_schema(Nested)):
        questions = schema_questions(schema, "schema")
        assert [(q.name, q.values, q.texts) for q in questions] == [
            ("label", ("billing", "technical"), ("billing", "technical")),
            ("kind", ("refund", "charge", None), ("refund", "charge", "none")),
            ("detail_urgent", (True, False), ("yes", "no")),
            ("detail_tier", (1, 2, 3), ("1", "2", "3")),
            ("version", ("v1",), ("v1",))]
    triage = schema_questions(to_strict_json_schema(Triage), "schema")
    assert [(q.name, q.question) for q in triage] == [("team", "Which team handles the ticket"), ("priority", ""),
                                                      ("angry", "Is the customer angry")]
    refused = [({"type": "object", "properties": {"n": {"type": "number"}}}, "schema.properties.n is a number without "
                                                                            "an enum"),
               ({"type": "object", "properties": {"t": {"type": "array", "items": {"enum": ["a"]}}}}, "an array"),
               ({"type": "object", "properties": {"r": {"$ref": "#/$defs/R"}}, "$defs": {"R": {"$ref": "#/$defs/R"}}},
                "refers to itself"),
               ({"type": "object", "properties": {"x": {"enum": ["a", "a"]}}}, "is given twice"),
               ({"type": "object", "properties": {"x": {"enum": [1, "1"]}}}, "are the same text when scored"),
               ({"type": "object", "properties": {}}, "has no properties to answer"),
               ({"type": "object", "properties": {"a_b": {"type": "boolean"}, "a": {"type": "object", "properties": {
                   "b": {"type": "boolean"}}}}}, "two properties are both asked as 'a_b'")]
    for schema, message in refused:
        with pytest.raises(InputError) as caught:
            schema_questions(schema, "schema")
        assert message in str(caught.value), (schema, str(caught.value))
