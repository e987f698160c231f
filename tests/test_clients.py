"""The client libraries users ask for a label with, each making its own request against a running
`serve` over the tiny random Llama: instructor (JSON_SCHEMA, TOOLS, JSON), LangChain's
`with_structured_output` (json_schema, function_calling, json_mode) and the bodies DSPy's JSONAdapter
sends (recorded in tests/data, DSPy is not installed). Each returns the Pydantic object, and it is
offline `classify`'s answer for the task the request makes: its properties as labels or questions,
under the system turn the client wrote (or the task's own where it wrote none)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
instructor = pytest.importorskip("instructor")
langchain_openai = pytest.importorskip("langchain_openai")

from slmclassify import Classifier, Task  # noqa: E402
from test_structured_outputs import OFFLINE, TEAMS, TICKETS, Ticket, Triage, _as_json  # noqa: E402

DSPY_BODIES = json.loads((Path(__file__).parent / "data" / "dspy_json_adapter_bodies.json").read_text())


def offline_answers(loaded, task: Task, texts, field: str = "label") -> list[dict]:
    """Per text: {property: (label, margin over the runner-up)} of offline classify (a task of
    labels answers the one property `field`)."""
    def one(label, scores):
        top = sorted(scores.values())
        return label, top[-1] - top[-2]

    results = Classifier(task, model=loaded).classify(list(texts))
    if not task.questions:
        return [{field: one(r.label, r.scores)} for r in results]
    return [{name: one(a.label, a.scores) for name, a in r.answers.items()} for r in results]


def assert_same(answers: list[dict], offline: list[dict]) -> None:
    """Each answer equals offline's where offline's best is clear (a near tie may fall either way
    within the scores' tolerance), and most are clear."""
    clear = 0
    for answer, want in zip(answers, offline, strict=True):
        for name, (label, margin) in want.items():
            if margin > 1e-3:
                assert answer[name] == label, (answer, want)
                clear += 1
    assert clear >= sum(len(w) for w in offline) // 2, "too few clear answers to compare"


@pytest.fixture(scope="module")
def long_loaded(model_dir_factory):
    """The tiny random Llama with room for the long system turns JSON mode and DSPy write (the
    fixtures' model has 256 positions)."""
    from slmclassify import load_model

    return load_model(str(model_dir_factory("llama", max_position_embeddings=2048)))


def instructor_client(url: str, mode):
    return instructor.from_openai(openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0), mode=mode)


@pytest.mark.parametrize("mode", ["JSON_SCHEMA", "TOOLS"])
@pytest.mark.parametrize("model", [Ticket, Triage], ids=["one-field", "three-fields"])
def test_instructor_schema_and_tools_answer_as_offline_classify(llama_loaded, mode, model):
    from test_serve import running

    with running(llama_loaded) as (url, _app):
        client = instructor_client(url, getattr(instructor.Mode, mode))
        answers = [_as_json(model, client.chat.completions.create(
            model="support", response_model=model, max_retries=0, messages=[{"role": "user", "content": t}]))
            for t in TICKETS]
    assert_same(answers, offline_answers(llama_loaded, OFFLINE[model.__name__], TICKETS))


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
@pytest.mark.parametrize("model", [Ticket, Triage], ids=["one-field", "three-fields"])
def test_langchain_structured_output_answers_as_offline_classify(llama_loaded, method, model):
    from test_serve import running

    with running(llama_loaded) as (url, _app):
        chat = langchain_openai.ChatOpenAI(model="support", base_url=f"{url}/v1", api_key="unused", max_retries=0)
        structured = chat.with_structured_output(model, method=method)
        answers = [_as_json(model, structured.invoke([("user", t)])) for t in TICKETS]
    assert_same(answers, offline_answers(llama_loaded, OFFLINE[model.__name__], TICKETS))


def test_json_mode_reads_the_schema_written_in_the_prompt(long_loaded):
    """JSON mode (`response_format: {"type": "json_object"}`) has no schema of its own: instructor's
    Mode.JSON writes it into its system message, a LangChain json_mode user into the prompt. The
    first object JSON schema in a message is the answer's; the conversation is scored as sent."""
    from test_serve import running

    system = f"Reply in JSON: {json.dumps(Ticket.model_json_schema())}"
    with running(long_loaded) as (url, _app):
        client = instructor_client(url, instructor.Mode.JSON)
        instructed = [_as_json(Ticket, client.chat.completions.create(
            model="support", response_model=Ticket, max_retries=0, messages=[{"role": "user", "content": t}]))
            for t in TICKETS[:6]]
        chat = langchain_openai.ChatOpenAI(model="support", base_url=f"{url}/v1", api_key="unused", max_retries=0)
        structured = chat.with_structured_output(Ticket, method="json_mode")
        chained = [_as_json(Ticket, structured.invoke([("system", system), ("user", t)])) for t in TICKETS[:6]]
        bare = chat.with_structured_output(Ticket, method="json_mode")
        with pytest.raises(openai.BadRequestError, match="json_object gives no schema and no message holds one"):
            bare.invoke([("user", TICKETS[0])])
    # instructor's system message as it sends it (its words may change between versions: caught, not copied)
    instructor_system = _instructor_json_system(Ticket)
    assert_same(instructed, offline_answers(long_loaded, Task(labels=TEAMS, system=instructor_system, mode="full",
                                                              calibrate=False), TICKETS[:6]))
    assert_same(chained, offline_answers(long_loaded, Task(labels=TEAMS, system=system, mode="full", calibrate=False),
                                         TICKETS[:6]))


def _instructor_json_system(model) -> str:
    """The system message instructor's Mode.JSON sends for `model` (caught from its own request)."""
    import httpx

    seen = []
    valid = {name: prop["enum"][0] for name, prop in model.model_json_schema()["properties"].items()}

    def answer(request):
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                                         "choices": [{"index": 0, "finish_reason": "stop", "message": {
                                             "role": "assistant", "content": json.dumps(valid)}}]})

    client = instructor.from_openai(openai.OpenAI(base_url="http://recorded/v1", api_key="unused", max_retries=0,
                                                  http_client=httpx.Client(transport=httpx.MockTransport(answer))),
                                    mode=instructor.Mode.JSON)
    client.chat.completions.create(model="m", response_model=model, max_retries=0,
                                   messages=[{"role": "user", "content": "x"}])
    assert seen[0]["response_format"] == {"type": "json_object"}
    return seen[0]["messages"][0]["content"]


def dspy_body(name: str, ticket: str) -> dict:
    """DSPy's recorded request for `name`, asking about `ticket`."""
    return json.loads(json.dumps(DSPY_BODIES["bodies"][name]).replace(DSPY_BODIES["ticket"], ticket))


@pytest.mark.parametrize("name", ["Route", "Triage"])
def test_dspy_json_adapter_bodies(long_loaded, name):
    """DSPy 3.4.1's JSONAdapter: for a model LiteLLM is told takes a response schema it sends the
    signature's output fields as a json_schema, answered as offline classify with DSPy's own system
    and user messages; for a model it knows nothing of it sends none, a free-text request: a 400
    that says what to send."""
    import httpx

    from slmclassify.core.task import Question

    from test_serve import running

    body = dspy_body(f"{name}-declared", TICKETS[0])
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    with running(long_loaded, served_model_names=("smollm2-135m-instruct",)) as (url, _app):
        answers = [json.loads(httpx.post(f"{url}/v1/chat/completions", json=dspy_body(f"{name}-declared", t),
                                         timeout=30).json()["choices"][0]["message"]["content"]) for t in TICKETS]
        refused = httpx.post(f"{url}/v1/chat/completions", json=dspy_body(name, TICKETS[0]), timeout=30)
    assert refused.status_code == 400 and "free-text generation is not supported" in refused.json()["error"]["message"]
    answers = [{k: {True: "yes", False: "no"}.get(v, v) for k, v in a.items()} for a in answers]
    common = dict(system=system, user_template=user.replace(TICKETS[0], "{text}"), mode="full")
    if name == "Route":
        task = Task(labels=TEAMS, calibrate=False, **common)
    else:
        task = Task(labels=(), questions=(Question("team", Task(labels=TEAMS, calibrate=False)),
                                          Question("priority", Task(labels=("low", "high"), calibrate=False)),
                                          Question("angry", Task(labels=("yes", "no"), calibrate=False))), **common)
    assert_same(answers, offline_answers(long_loaded, task, TICKETS))
