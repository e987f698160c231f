"""The client libraries against `serve` with the embedded SmolLM2-135M model, on the first 40 demo
tickets (examples/tickets.csv), 8 requests at a time: openai `.parse()`, instructor (TOOLS, JSON,
JSON_SCHEMA), LangChain (json_schema, function_calling, json_mode) and DSPy's JSONAdapter body return the Pydantic object
offline `classify` gives, one field and three (team, priority, sentiment); a string enum answers as
guided_choice on 40/40. (Every mode on the tiny model: tests/test_clients.py.)"""

from __future__ import annotations

import csv
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
instructor = pytest.importorskip("instructor")
langchain_openai = pytest.importorskip("langchain_openai")

from pydantic import BaseModel, Field  # noqa: E402

from slmclassify import Task  # noqa: E402
from slmclassify.core.task import Question  # noqa: E402
from slmclassify.models.prepare import load_model  # noqa: E402
from test_clients import _instructor_json_system, assert_same, dspy_body, offline_answers  # noqa: E402
from test_structured_outputs import _as_json  # noqa: E402

pytestmark = pytest.mark.e2e
TEAMS = ("billing", "technical", "account", "shipping", "feedback")
with open(Path(__file__).parents[1] / "examples" / "tickets.csv", newline="") as f:
    TICKETS = [row["text"] for row in csv.DictReader(f)][:40]


class Team(BaseModel):
    team: Literal["billing", "technical", "account", "shipping", "feedback"] = Field(
        description="Which team handles the ticket")


class Triage(BaseModel):
    team: Literal["billing", "technical", "account", "shipping", "feedback"] = Field(
        description="Which team handles the ticket")
    priority: Literal["low", "normal", "urgent"] = Field(description="How urgent the ticket is")
    sentiment: Literal["negative", "neutral", "positive"] = Field(description="The customer's mood")


QUESTIONS = {"team": (TEAMS, "Which team handles the ticket"),
             "priority": (("low", "normal", "urgent"), "How urgent the ticket is"),
             "sentiment": (("negative", "neutral", "positive"), "The customer's mood")}


def offline_task(model, **prompt) -> Task:
    """The task the model's schema makes, under the system turn given or the task's own."""
    if model is Team:
        return Task(labels=TEAMS, mode="full", calibrate=False,
                    **(prompt or {"instruction": QUESTIONS["team"][1]}))
    return Task(labels=(), mode="full", questions=tuple(
        Question(name, Task(labels=labels, calibrate=False), question=question)
        for name, (labels, question) in QUESTIONS.items()), **prompt)


@pytest.fixture(scope="module")
def embedded():
    return load_model()


def answered(ask, texts=TICKETS) -> list:
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(ask, texts))


def test_every_client_answers_as_offline_classify_on_the_embedded_model(embedded):
    from test_serve import running

    user = lambda t: [{"role": "user", "content": t}]  # noqa: E731
    with running(embedded) as (url, _app):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        tools = instructor.from_openai(client, mode=instructor.Mode.TOOLS)
        json_mode = instructor.from_openai(client, mode=instructor.Mode.JSON)
        json_schema = instructor.from_openai(client, mode=instructor.Mode.JSON_SCHEMA)
        system = f"Reply in JSON: {json.dumps(Team.model_json_schema())}"  # a json_mode user's own prompt
        chat = langchain_openai.ChatOpenAI(model="support", base_url=f"{url}/v1", api_key="unused", max_retries=0)
        got = {
            ("parse", Team): answered(lambda t: _as_json(Team, client.chat.completions.parse(
                model="support", messages=user(t), response_format=Team).choices[0].message.parsed)),
            ("parse", Triage): answered(lambda t: _as_json(Triage, client.chat.completions.parse(
                model="support", messages=user(t), response_format=Triage).choices[0].message.parsed)),
            ("instructor TOOLS", Triage): answered(lambda t: _as_json(Triage, tools.chat.completions.create(
                model="support", response_model=Triage, messages=user(t), max_retries=0))),
            ("instructor JSON", Team): answered(lambda t: _as_json(Team, json_mode.chat.completions.create(
                model="support", response_model=Team, messages=user(t), max_retries=0))),
            ("instructor JSON_SCHEMA", Triage): answered(lambda t: _as_json(Triage, json_schema.chat.completions.create(
                model="support", response_model=Triage, messages=user(t), max_retries=0))),
            ("langchain json_mode", Team): answered(lambda t: _as_json(Team, chat.with_structured_output(
                Team, method="json_mode").invoke([("system", system), ("user", t)]))),
            ("langchain json_schema", Triage): answered(lambda t: _as_json(Triage, chat.with_structured_output(
                Triage).invoke([("user", t)]))),
            ("langchain function_calling", Team): answered(lambda t: _as_json(Team, chat.with_structured_output(
                Team, method="function_calling").invoke([("user", t)]))),
        }
        import httpx

        dspy = answered(lambda t: json.loads(httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            **dspy_body("Triage-declared", t), "model": "support"}).json()["choices"][0]["message"]["content"]))
        enum = {"type": "json_schema", "json_schema": {"name": "team", "schema": {"type": "string", "enum": list(TEAMS)}}}
        pairs = answered(lambda t: (
            client.chat.completions.create(model="support", messages=user(t), response_format=enum).choices[0],
            client.chat.completions.create(model="support", messages=user(t),
                                           extra_body={"guided_choice": list(TEAMS)}).choices[0]))
    assert all(a.message.content == json.dumps(g.message.content) for a, g in pairs)  # 40/40
    offline = {}  # one offline run per task: parse and LangChain's calls of one model ask the same
    for (call, model), answers in got.items():
        prompt = ({"system": _instructor_json_system(model)} if call == "instructor JSON"
                  else {"system": system} if call == "langchain json_mode" else {})
        key = (model, prompt.get("system"))
        if key not in offline:
            offline[key] = offline_answers(embedded, offline_task(model, **prompt), TICKETS, field="team")
        assert_same(answers, offline[key])
    body = dspy_body("Triage-declared", "{text}")
    dspy_task = Task(labels=(), mode="full", system=body["messages"][0]["content"],
                     user_template=body["messages"][1]["content"], questions=(
                         Question("team", Task(labels=TEAMS[:3], calibrate=False)),
                         Question("priority", Task(labels=("low", "high"), calibrate=False)),
                         Question("angry", Task(labels=("yes", "no"), calibrate=False))))
    dspy = [{k: {True: "yes", False: "no"}.get(v, v) for k, v in a.items()} for a in dspy]
    assert_same(dspy, offline_answers(embedded, dspy_task, TICKETS))
